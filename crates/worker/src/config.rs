//! The worker's configuration: `DIR/config.toml`, every key documented in [`TEMPLATE`],
//! which `sprout worker init` writes. Each section belongs to the layer it configures — the
//! engine's ([`sprout_engine::config`]), the fleet's `[registry]`, the app port's `[app]` —
//! and this file assembles them with `[worker]`, the worker's own. Missing keys take their
//! defaults; unknown keys and values of the wrong type are errors naming the key, so a typo
//! never passes silently.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use sprout_api::AppSection;
use sprout_engine::config::{
    check_weight, BaseSection, CgroupsSection, DockerSection, EngineConfig, GvisorSection, HandlerCacheSection, ImportCacheSection,
    InstancesSection, IsolationSection, LimitsSection, LogsSection, NetworkSection, PackagesSection, RuncSection, SandboxSection,
    VmSection,
};
use sprout_fleet::member::RegistrySection;

/// The documented configuration with every default; parsed, it equals `Config::default()`.
pub const TEMPLATE: &str = include_str!("config-template.toml");

/// Where the worker's own volumes are in every sandbox (the leases' files, the blobs): no
/// configured volume may overlap them.
pub const OWN_VOLUMES: [&str; 2] = [sprout_offload::LEASES_IN_SANDBOX, sprout_offload::BLOBS_IN_SANDBOX];

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub worker: WorkerSection,
    pub sandbox: SandboxSection,
    pub isolation: IsolationSection,
    pub limits: LimitsSection,
    pub instances: InstancesSection,
    pub cgroups: CgroupsSection,
    pub base: BaseSection,
    pub runc: RuncSection,
    pub gvisor: GvisorSection,
    pub docker: DockerSection,
    pub vm: VmSection,
    pub registry: RegistrySection,
    pub packages: PackagesSection,
    pub import_cache: ImportCacheSection,
    pub handler_cache: HandlerCacheSection,
    pub logs: LogsSection,
    pub app: AppSection,
    pub network: NetworkSection,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WorkerSection {
    pub listen: String,
    /// Whether every endpoint but `/run/...` and `GET /status` needs the token
    /// ([`sprout_api::auth`]).
    pub auth: bool,
    pub name: String,
    pub log: String,
    /// The CPU weight of the worker's own threads beside the lambdas' (cgroup v1: a group of
    /// its own in the cpu hierarchy, beside the sandboxes'); 0: left where it started.
    pub cpu_weight: u64,
}

impl Default for WorkerSection {
    fn default() -> Self {
        WorkerSection { listen: "127.0.0.1:5000".into(), auth: true, name: String::new(), log: "info".into(), cpu_weight: 400 }
    }
}

impl Config {
    /// Read `DIR/config.toml` (defaults when it is absent) and check it.
    pub fn load(dir: &Path) -> Result<Config> {
        let path = dir.join("config.toml");
        let config = match std::fs::read_to_string(&path) {
            Ok(text) => Config::parse(&text).with_context(|| format!("in {}", path.display()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Config::default(),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        Ok(config)
    }

    pub fn parse(text: &str) -> Result<Config> {
        let config: Config = toml::from_str(text)?;
        config.validate(text)?;
        Ok(config)
    }

    fn validate(&self, text: &str) -> Result<()> {
        if self.worker.listen.parse::<std::net::SocketAddr>().is_err() {
            bail!("worker.listen = {:?} is not an address like 127.0.0.1:5000", self.worker.listen);
        }
        if !self.worker.name.is_empty() && !self.worker.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
            bail!("worker.name may hold only letters, digits, '-' and '_'");
        }
        check_weight("worker.cpu_weight", self.worker.cpu_weight)?;
        self.engine().validate(text, &OWN_VOLUMES)?;
        self.app.validate(&self.worker.listen)
    }

    /// The engine's sections.
    pub fn engine(&self) -> EngineConfig {
        EngineConfig {
            sandbox: self.sandbox.clone(),
            isolation: self.isolation.clone(),
            limits: self.limits.clone(),
            instances: self.instances.clone(),
            cgroups: self.cgroups.clone(),
            base: self.base.clone(),
            runc: self.runc.clone(),
            gvisor: self.gvisor.clone(),
            docker: self.docker.clone(),
            vm: self.vm.clone(),
            packages: self.packages.clone(),
            import_cache: self.import_cache.clone(),
            handler_cache: self.handler_cache.clone(),
            logs: self.logs.clone(),
            network: self.network.clone(),
        }
    }

    /// Where the install cache lives.
    pub fn package_cache_dir(&self, dir: &Path) -> PathBuf {
        self.packages.cache_dir(dir)
    }

    /// This worker's name: configured, or derived from the directory's absolute path.
    pub fn worker_name(&self, dir: &Path) -> String {
        if !self.worker.name.is_empty() {
            return self.worker.name.clone();
        }
        let abs = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
        let digest = Sha256::digest(abs.as_os_str().as_encoded_bytes());
        hex::encode(&digest[..4])
    }

    /// Names of the cgroup trees this worker owns (for the pool, and for cleanup).
    pub fn cgroup_parents(&self, dir: &Path) -> Vec<String> {
        let name = self.worker_name(dir);
        vec![format!("sprout-{name}"), format!("sprout-{name}-runc")]
    }

    /// Six hex digits naming this worker's nftables table and host interfaces (`sb<tag>-N`),
    /// and a seed for choosing its address block.
    pub fn network_tag(&self, dir: &Path) -> (String, u32) {
        let digest = Sha256::digest(self.worker_name(dir).as_bytes());
        (hex::encode(&digest[..3]), u32::from_le_bytes(digest[3..7].try_into().unwrap()))
    }
}

#[cfg(test)]
mod tests;
