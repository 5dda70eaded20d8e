//! `sprout packages preinstall FILE`: fill a worker's install cache ahead of time from a
//! requirements file, with or without a worker running (installs publish atomically, so a
//! running worker simply finds the packages there). It stages its own installer sandboxes
//! in a directory and cgroup of its own, removed when it ends.

use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use sprout_sandbox::cgroup::Layout;
use sprout_sandbox::stage::Stage;

use sprout_engine::{InstallCache, InstalledPackage};

use sprout_engine::make_packages;

use crate::config::Config;

/// Install every package `file` names (and their dependencies) into the cache of the worker
/// configured in `dir`; returns what the cache then holds for them.
pub async fn preinstall(dir: &Path, file: &Path) -> Result<Vec<InstalledPackage>> {
    let config = Config::load(dir)?;
    if !sprout_sandbox::base::is_ready(&config.base.path, &config.base.suite) {
        bail!("no base image at {}; run `sprout worker init {}`", config.base.path.display(), dir.display());
    }
    let text = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let reqs = sprout_engine::parse_requirements(&text, config.packages.allow_unpinned)?;
    let cache_dir = config.package_cache_dir(dir);
    let cache = InstallCache::open(&cache_dir).with_context(|| format!("opening the install cache {}", cache_dir.display()))?;
    let v2_root = (!config.cgroups.v2_root.is_empty()).then(|| std::path::PathBuf::from(&config.cgroups.v2_root));
    let layout = Arc::new(Layout::detect(config.cgroups.version, v2_root.as_deref())?);
    let parent = format!("sprout-preinstall-{}", std::process::id());
    layout.create_parent(&parent)?;
    let scratch = tempfile::Builder::new().prefix("sprout-preinstall-").tempdir()?;
    let result = async {
        let stage = Arc::new(Stage::prepare(scratch.path(), &config.base.path, &cache.installed_dir())?);
        let packages = make_packages(&config.engine(), cache, stage.clone(), layout.clone(), &parent);
        let installed = packages.prepare(&reqs).await.map_err(|e| {
            let mut message = e.message.clone();
            if !e.output.is_empty() {
                message.push_str("\n--- pip said:\n");
                message.push_str(&e.output);
            }
            anyhow::anyhow!(message)
        });
        let _ = stage.teardown();
        let set = installed?;
        Ok(set.packages.iter().filter_map(|p| packages.cache().get(&p.key)).collect())
    }
    .await;
    let _ = layout.remove_tree(&parent);
    result
}
