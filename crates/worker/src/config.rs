//! The worker's configuration: `DIR/config.toml`, every key documented in [`TEMPLATE`],
//! which `sprout worker init` writes. Missing keys take their defaults; unknown keys and
//! values of the wrong type are errors naming the key, so a typo never passes silently.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The documented configuration with every default; parsed, it equals `Config::default()`.
pub const TEMPLATE: &str = include_str!("config-template.toml");

mod app;
mod isolation;
mod logs;
mod network;
mod volumes;

pub use app::{valid_static_prefix, AppSection};
pub use isolation::IsolationSection;
pub use logs::LogsSection;
pub use network::NetworkSection;
pub use volumes::VolumeSection;

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

impl Default for WorkerSection {
    fn default() -> Self {
        WorkerSection { listen: "127.0.0.1:5000".into(), auth: true, name: String::new(), log: "info".into(), cpu_weight: 400 }
    }
}

impl Default for SandboxSection {
    fn default() -> Self {
        SandboxSection {
            backend: BackendKind::Sock,
            uid: 65534,
            gid: 65534,
            mount_proc: true,
            scratch_mb: 64,
            python: "/usr/bin/python3".into(),
            start_timeout_ms: 10_000,
            cgroup_pool: 16,
            zygote_memory_mb: 512,
            spares: 4,
            cpuset: String::new(),
            volumes: Vec::new(),
            seccomp: true,
        }
    }
}

impl Default for LimitsSection {
    fn default() -> Self {
        LimitsSection {
            memory_mb: 128,
            pids: 64,
            cpus: 1.0,
            timeout_ms: 30_000,
            max_body_mb: 6,
            max_response_mb: 16,
            max_upload_mb: 50,
            max_unpacked_mb: 200,
            max_files: 10_000,
            max_invoke_depth: 8,
            cpu_weight: 100,
            long_request_ms: 50,
            preempt_tick_us: 250,
        }
    }
}

impl Default for InstancesSection {
    fn default() -> Self {
        InstancesSection {
            keep_warm: true,
            idle_timeout_s: 300,
            keep_alive: KeepAlive::Histogram,
            max_per_lambda: 16,
            queue_depth: 64,
            max_total: 256,
            memory_budget_mb: 0,
            sandbox_estimate_mb: 32,
        }
    }
}

impl Default for CgroupsSection {
    fn default() -> Self {
        CgroupsSection { version: sprout_sandbox::cgroup::Version::Auto, v2_root: String::new(), favor_dynmods: true }
    }
}

impl Default for BaseSection {
    fn default() -> Self {
        BaseSection { path: PathBuf::from("/var/lib/sprout/base-bookworm"), suite: "bookworm".into(), mirror: String::new() }
    }
}

impl Default for PackagesSection {
    fn default() -> Self {
        PackagesSection {
            cache_dir: String::new(),
            install_cache: true,
            allow_unpinned: false,
            index_url: String::new(),
            extra_index_url: String::new(),
            wheel_dir: String::new(),
            offline: false,
            install_timeout_s: 600,
            install_memory_mb: 1024,
            install_pids: 256,
        }
    }
}

impl Default for ImportCacheSection {
    fn default() -> Self {
        ImportCacheSection {
            enabled: true,
            memory_mb: 2048,
            window_s: 60,
            max_depth: 6,
            learn_imports: true,
            tree: String::new(),
            zygote_uid: 65533,
            zygote_gid: 65533,
            import_timeout_ms: 60_000,
        }
    }
}

impl Default for HandlerCacheSection {
    fn default() -> Self {
        HandlerCacheSection { pause: true, pause_after_ms: 100, memory_mb: 1024 }
    }
}

impl Default for RuncSection {
    fn default() -> Self {
        RuncSection { binary: "runc".into() }
    }
}

impl Default for GvisorSection {
    fn default() -> Self {
        GvisorSection {
            runsc: String::new(),
            spares: 2,
            spares_idle_ms: 2000,
            pod_memory_mb: 1024,
            pod_idle_ms: 60_000,
            templates: true,
            created_ahead: 1,
            network: GvisorNetwork::Sandbox,
        }
    }
}

/// Where lambdas' code is kept beyond this worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RegistrySection {
    /// A PostgreSQL connection string: the fleet's shared registry, which this worker stores
    /// its uploads in and follows; empty: this worker's own registry only.
    pub shared: String,
    /// How often the shared registry is read when no notification came, milliseconds.
    pub poll_ms: u64,
    /// Package-aware routing: the fleet HAProxy's runtime API socket and its routes map, where
    /// a lambda uploaded through this worker is routed by its largest package (`fleet_routes`).
    /// Empty: none.
    pub routes_socket: String,
    pub routes_map: String,
}

impl Default for RegistrySection {
    fn default() -> Self {
        RegistrySection { shared: String::new(), poll_ms: 1000, routes_socket: String::new(), routes_map: String::new() }
    }
}

/// The `vm` back-end's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct VmSection {
    /// Where the guest kernel and root disks are built and kept, shared by all workers.
    pub dir: PathBuf,
    /// The VMM program; empty: `sprout-vmm` beside the `sprout` binary.
    pub vmm: String,
}

impl Default for VmSection {
    fn default() -> Self {
        VmSection { dir: PathBuf::from("/var/lib/sprout/vm"), vmm: String::new() }
    }
}

impl Default for DockerSection {
    fn default() -> Self {
        DockerSection { socket: PathBuf::from("/var/run/docker.sock"), image: "sprout-base:bookworm".into() }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WorkerSection {
    pub listen: String,
    /// Whether every endpoint but `/run/...` and `GET /status` needs the token ([`crate::auth`]).
    pub auth: bool,
    pub name: String,
    pub log: String,
    /// The CPU weight of the worker's own threads beside the lambdas' (cgroup v1: a group of
    /// its own in the cpu hierarchy, beside the sandboxes'); 0: left where it started.
    pub cpu_weight: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum BackendKind {
    #[default]
    #[serde(rename = "sock")]
    Sock,
    #[serde(rename = "sock-nozygote")]
    SockNoZygote,
    #[serde(rename = "runc")]
    Runc,
    #[serde(rename = "docker")]
    Docker,
    #[serde(rename = "vm")]
    Vm,
    #[serde(rename = "gvisor")]
    Gvisor,
}

impl BackendKind {
    pub const ALL: [BackendKind; 6] =
        [BackendKind::Sock, BackendKind::SockNoZygote, BackendKind::Runc, BackendKind::Docker, BackendKind::Vm, BackendKind::Gvisor];

    /// The back-end of this configuration name, if there is one.
    pub fn from_name(name: &str) -> Option<BackendKind> {
        BackendKind::ALL.into_iter().find(|k| k.name() == name)
    }

    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Sock => "sock",
            BackendKind::SockNoZygote => "sock-nozygote",
            BackendKind::Runc => "runc",
            BackendKind::Docker => "docker",
            BackendKind::Vm => "vm",
            BackendKind::Gvisor => "gvisor",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SandboxSection {
    pub backend: BackendKind,
    pub uid: u32,
    pub gid: u32,
    pub mount_proc: bool,
    pub scratch_mb: u64,
    pub python: String,
    pub start_timeout_ms: u64,
    pub cgroup_pool: usize,
    pub zygote_memory_mb: u64,
    /// Most spares (children forked ahead of demand, not yet bound to a lambda) per Zygote.
    pub spares: usize,
    pub cpuset: String,
    pub volumes: Vec<VolumeSection>,
    pub seccomp: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsSection {
    pub memory_mb: u64,
    pub pids: u64,
    pub cpus: f64,
    pub timeout_ms: u64,
    pub max_body_mb: u64,
    pub max_response_mb: u64,
    pub max_upload_mb: u64,
    pub max_unpacked_mb: u64,
    pub max_files: usize,
    pub max_invoke_depth: u32,
    /// Each lambda's CPU weight, split among its sandboxes; 0: each sandbox its cgroup's default.
    pub cpu_weight: u64,
    /// A request running longer than this (milliseconds) yields the CPU to other requests for
    /// the rest of its run (its sandbox's cgroup idles); 0: never.
    pub long_request_ms: u64,
    /// While long requests run, wake each CPU this often (microseconds, [`crate::ticker`]); 0: never.
    pub preempt_tick_us: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct InstancesSection {
    pub keep_warm: bool,
    pub idle_timeout_s: u64,
    /// How long idle sandboxes are kept: `idle_timeout_s` for all (`fixed`), or per lambda
    /// from its idle times (`histogram`, the default: the hybrid histogram policy, falling back
    /// to `idle_timeout_s` while it has too few; with a pre-warm window, the sandbox goes
    /// after its request and a new one is started that long after).
    pub keep_alive: KeepAlive,
    pub max_per_lambda: usize,
    pub queue_depth: usize,
    pub max_total: usize,
    /// The whole worker's memory budget, MiB (0: none): see crate::budget.
    pub memory_budget_mb: u64,
    /// Memory a lambda's sandbox is assumed to need until one has been measured, MiB.
    pub sandbox_estimate_mb: u64,
}

/// `[instances] keep_alive`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeepAlive {
    Histogram,
    Fixed,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CgroupsSection {
    pub version: sprout_sandbox::cgroup::Version,
    pub v2_root: String,
    pub favor_dynmods: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BaseSection {
    pub path: PathBuf,
    pub suite: String,
    pub mirror: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RuncSection {
    pub binary: String,
}

/// The gvisor back-end: one gVisor sandbox (a pod) per lambda.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GvisorSection {
    /// runsc; empty: where scripts/gvisor.sh builds the pinned version.
    pub runsc: String,
    /// Spares each pod keeps forked ahead while its lambda has cold starts.
    pub spares: usize,
    /// A pod with no cold start for this long lets its spares go (a spare holds a handler's
    /// pages, several MiB inside gVisor); the next cold start forks one on its path.
    pub spares_idle_ms: u64,
    /// Host memory limit of one pod: gVisor's kernel and all its lambda's handlers.
    pub pod_memory_mb: u64,
    /// How long a pod without sandboxes stays up (then it stops: scale to zero).
    pub pod_idle_ms: u64,
    /// Lambdas' first pods restored from a checkpoint of their package set's template.
    pub templates: bool,
    /// Containers kept created ahead per template.
    pub created_ahead: usize,
    /// Whose network stack a pod's sockets use inside its lambda's namespace.
    pub network: GvisorNetwork,
}

/// Whose network stack a gVisor pod's sockets use, inside its lambda's namespace either way
/// (the allow-list, on the host's side of its link, holds for both).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GvisorNetwork {
    /// gVisor's own network stack (netstack), in the Sentry: the host kernel sees packets only.
    Sandbox,
    /// The host kernel's, the Sentry making its sockets (runsc `--network=host`): no netstack
    /// on each query's path, and socket calls in the Sentry's allowed host calls.
    Host,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DockerSection {
    pub socket: PathBuf,
    pub image: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PackagesSection {
    pub cache_dir: String,
    pub install_cache: bool,
    pub allow_unpinned: bool,
    pub index_url: String,
    pub extra_index_url: String,
    pub wheel_dir: String,
    pub offline: bool,
    pub install_timeout_s: u64,
    pub install_memory_mb: u64,
    pub install_pids: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ImportCacheSection {
    pub enabled: bool,
    pub memory_mb: u64,
    pub window_s: u64,
    pub max_depth: usize,
    pub learn_imports: bool,
    pub tree: String,
    pub zygote_uid: u32,
    pub zygote_gid: u32,
    pub import_timeout_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HandlerCacheSection {
    pub pause: bool,
    pub pause_after_ms: u64,
    pub memory_mb: u64,
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
        config.validate()?;
        network::validate(&config.network, text)?;
        Ok(config)
    }

    fn validate(&self) -> Result<()> {
        if self.worker.listen.parse::<std::net::SocketAddr>().is_err() {
            bail!("worker.listen = {:?} is not an address like 127.0.0.1:5000", self.worker.listen);
        }
        if !self.worker.name.is_empty() && !self.worker.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
            bail!("worker.name may hold only letters, digits, '-' and '_'");
        }
        let positive = [
            ("limits.memory_mb", self.limits.memory_mb),
            ("limits.pids", self.limits.pids),
            ("limits.timeout_ms", self.limits.timeout_ms),
            ("limits.max_body_mb", self.limits.max_body_mb),
            ("limits.max_response_mb", self.limits.max_response_mb),
            ("limits.max_upload_mb", self.limits.max_upload_mb),
            ("limits.max_unpacked_mb", self.limits.max_unpacked_mb),
            ("sandbox.scratch_mb", self.sandbox.scratch_mb),
            ("sandbox.start_timeout_ms", self.sandbox.start_timeout_ms),
            ("instances.max_per_lambda", self.instances.max_per_lambda as u64),
            ("instances.max_total", self.instances.max_total as u64),
        ];
        for (key, value) in positive {
            if value == 0 {
                bail!("{key} must be greater than 0");
            }
        }
        for (key, weight) in [("limits.cpu_weight", self.limits.cpu_weight), ("worker.cpu_weight", self.worker.cpu_weight)] {
            if weight > 10_000 {
                bail!("{key} must be 0 (off) or a weight from 1 to 10000 (100: a default process group's)");
            }
        }
        if self.limits.preempt_tick_us != 0 && !(50..=100_000).contains(&self.limits.preempt_tick_us) {
            bail!("limits.preempt_tick_us must be 0 (none) or from 50 to 100000 microseconds");
        }
        if !(self.limits.cpus >= 0.0 && self.limits.cpus.is_finite()) {
            bail!("limits.cpus must be 0 (unlimited) or a positive number of cores");
        }
        if self.limits.max_response_mb > 4000 || self.limits.max_body_mb > 4000 {
            bail!("limits.max_body_mb and limits.max_response_mb must stay below 4000");
        }
        let ic = &self.import_cache;
        if ic.zygote_uid == self.sandbox.uid || ic.zygote_gid == self.sandbox.gid {
            bail!("import_cache.zygote_uid and zygote_gid must differ from sandbox.uid and sandbox.gid");
        }
        if ic.zygote_uid == 0 || ic.zygote_gid == 0 {
            bail!("import_cache.zygote_uid and zygote_gid must not be root");
        }
        if self.packages.offline && self.packages.wheel_dir.is_empty() {
            bail!("packages.offline needs packages.wheel_dir: with no index, pip installs only from there");
        }
        let positive = [
            ("packages.install_timeout_s", self.packages.install_timeout_s),
            ("packages.install_memory_mb", self.packages.install_memory_mb),
            ("packages.install_pids", self.packages.install_pids),
            ("import_cache.window_s", ic.window_s),
            ("import_cache.import_timeout_ms", ic.import_timeout_ms),
        ];
        for (key, value) in positive {
            if value == 0 {
                bail!("{key} must be greater than 0");
            }
        }
        if ic.max_depth == 0 || ic.max_depth > 16 {
            bail!("import_cache.max_depth must be between 1 and 16");
        }
        volumes::validate(&self.sandbox.volumes)?;
        self.logs.validate()?;
        self.isolation.validate(self.sandbox.backend)?;
        self.app.validate(&self.worker.listen)
    }

    /// Where the install cache lives.
    pub fn package_cache_dir(&self, dir: &Path) -> PathBuf {
        if self.packages.cache_dir.is_empty() {
            dir.join("packages")
        } else {
            PathBuf::from(&self.packages.cache_dir)
        }
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

    pub fn sandbox_limits(&self) -> sprout_sandbox::Limits {
        sprout_sandbox::Limits { memory_bytes: self.limits.memory_mb << 20, pids: self.limits.pids, cpus: self.limits.cpus }
    }

    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.limits.timeout_ms)
    }

    pub fn start_timeout(&self) -> Duration {
        Duration::from_millis(self.sandbox.start_timeout_ms)
    }

    pub fn cpuset(&self) -> Option<String> {
        (!self.sandbox.cpuset.is_empty()).then(|| self.sandbox.cpuset.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn template_documents_exactly_the_defaults() {
        assert_eq!(Config::parse(TEMPLATE).unwrap(), Config::default());
    }

    #[test]
    fn every_key_of_the_defaults_is_in_the_template() {
        let defaults = toml::to_string(&Config::default()).unwrap();
        let mut section = String::new();
        for line in defaults.lines() {
            if let Some(name) = line.strip_prefix('[') {
                section = name.trim_end_matches(']').to_string();
            } else if let Some((key, _)) = line.split_once(" = ") {
                let in_template = TEMPLATE
                    .split(&format!("[{section}]"))
                    .nth(1)
                    .map(|rest| rest.split("\n[").next().unwrap_or("").contains(&format!("\n{key} = ")))
                    .unwrap_or(false);
                assert!(in_template, "{section}.{key} is not documented in the template");
            }
        }
    }

    #[test]
    fn unknown_keys_and_bad_values_are_errors_naming_the_key() {
        let err = Config::parse("[limits]\nmemroy_mb = 5\n").unwrap_err();
        assert!(format!("{err:#}").contains("memroy_mb"), "{err:#}");
        let err = Config::parse("[limits]\nmemory_mb = \"lots\"\n").unwrap_err();
        assert!(format!("{err:#}").contains("memory_mb"), "{err:#}");
        let err = Config::parse("[worker]\nlisten = \"nowhere\"\n").unwrap_err();
        assert!(format!("{err:#}").contains("worker.listen"), "{err:#}");
        let err = Config::parse("[sandbox]\nbackend = \"firecracker\"\n").unwrap_err();
        assert!(format!("{err:#}").contains("firecracker"), "{err:#}");
        let err = Config::parse("[gvisor]\nnetwork = \"bridge\"\n").unwrap_err();
        assert!(format!("{err:#}").contains("bridge"), "{err:#}");
        assert_eq!(Config::parse("[gvisor]\nnetwork = \"host\"\n").unwrap().gvisor.network, GvisorNetwork::Host);
        let err = Config::parse("[limits]\ntimeout_ms = 0\n").unwrap_err();
        assert!(format!("{err:#}").contains("timeout_ms"), "{err:#}");
    }

    #[test]
    fn partial_files_keep_the_other_defaults() {
        let c = Config::parse("[instances]\nkeep_warm = false\n").unwrap();
        assert!(!c.instances.keep_warm);
        assert_eq!(c.limits, Config::default().limits);
    }
}
