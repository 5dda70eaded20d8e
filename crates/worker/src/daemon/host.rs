//! What a worker directory holds for the worker running in it: the lock that says one runs
//! there (held for its whole life, so a stale pid file is never trusted), the pid file, the
//! log, and where its cgroups are.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::Result;
use sprout_sandbox::cgroup::Layout;

use crate::config::Config;

pub(super) const LOCK: &str = "worker.lock";
pub(super) const PID: &str = "worker.pid";
pub const LOG: &str = "worker.log";

/// Whether a worker holds `dir`'s lock; returns its pid when it does.
pub fn running_pid(dir: &Path) -> Option<u32> {
    let file = fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(dir.join(LOCK)).ok()?;
    match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
        Ok(_unlocked_on_drop) => None,
        Err(_) => Some(fs::read_to_string(dir.join(PID)).ok()?.trim().parse().unwrap_or(0)),
    }
}

/// The cgroup layout the configuration asks for (or finds).
pub(super) fn detect_layout(config: &Config) -> Result<Layout> {
    let v2_root = (!config.cgroups.v2_root.is_empty()).then(|| PathBuf::from(&config.cgroups.v2_root));
    Ok(Layout::detect(config.cgroups.version, v2_root.as_deref())?)
}
