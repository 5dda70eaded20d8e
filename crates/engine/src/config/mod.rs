//! The engine's sections of `DIR/config.toml` (`[sandbox]`, `[limits]`, `[instances]`,
//! `[packages]`, `[network]`, ...), each in the file of what it configures, and
//! [`EngineConfig`], all of them together with the checks that span sections. The whole
//! file, with the sections of the layers above, is the worker's `Config` (`sprout-worker`).
//! Every section refuses unknown keys, so a typo never passes silently.

mod backends;
mod isolation;
mod limits;
mod logs;
mod network;
mod packages;
mod sandbox;
mod volumes;

use anyhow::{bail, Result};

pub use backends::{BaseSection, CgroupsSection, DockerSection, GvisorNetwork, GvisorSection, RuncSection, VmSection};
pub use isolation::IsolationSection;
pub use limits::{CpuWeightPer, HandlerCacheSection, InstancesSection, KeepAlive, LimitsSection};
pub use logs::LogsSection;
pub use network::{AllowEntry, NetworkSection};
pub use packages::{ImportCacheSection, PackagesSection};
pub use sandbox::{BackendKind, SandboxSection};
pub use volumes::VolumeSection;

/// The engine's sections of the configuration.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct EngineConfig {
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
    pub packages: PackagesSection,
    pub import_cache: ImportCacheSection,
    pub handler_cache: HandlerCacheSection,
    pub logs: LogsSection,
    pub network: NetworkSection,
}

impl EngineConfig {
    /// Check the sections and what spans them. `text`: the file they were read from (errors
    /// in `[[network.allow]]` name their line); `reserved`: the in-sandbox paths of the
    /// volumes the worker binds for itself, which no configured volume may overlap.
    pub fn validate(&self, text: &str, reserved: &[&str]) -> Result<()> {
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
        check_weight("limits.cpu_weight", self.limits.cpu_weight)?;
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
        volumes::validate(&self.sandbox.volumes, reserved)?;
        self.logs.validate()?;
        self.isolation.validate(self.sandbox.backend)?;
        network::validate(&self.network, text)
    }
}

/// A CPU weight setting: 0 (off) or 1 to 10000.
pub fn check_weight(key: &str, weight: u64) -> Result<()> {
    if weight > 10_000 {
        bail!("{key} must be 0 (off) or a weight from 1 to 10000 (100: a default process group's)");
    }
    Ok(())
}
