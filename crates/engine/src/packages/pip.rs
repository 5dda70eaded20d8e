//! pip, run inside one-shot sandboxes: it resolves a requirement set (`--dry-run --report`)
//! and installs one package at a time (`--no-deps --target`) into a staging directory.
//!
//! Package installs may run arbitrary code (an sdist's build), so each runs in a sandbox of
//! its own as the unprivileged sandbox user, with the installer's memory, process and time
//! limits, seeing only the base image, its staging directory and, when configured, the local
//! wheel directory (read-only at /wheels). It shares the host's network, DNS and CA bundle,
//! and inherits the host's PIP_* and proxy settings unless the configuration names an index.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Deserialize;
use sprout_sandbox::cgroup::Layout;
use sprout_sandbox::oneshot::{self, Bind, Ending, OneshotSpec};
use sprout_sandbox::stage::Stage;
use sprout_sandbox::Limits;

use super::install_cache::{Pin, Staging};
use super::requirements::normalize;

/// Environment variables passed from the worker's environment to pip.
const PASSED_ENV: [&str; 10] = [
    "PIP_INDEX_URL",
    "PIP_EXTRA_INDEX_URL",
    "PIP_TRUSTED_HOST",
    "PIP_DEFAULT_TIMEOUT",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
];

/// Where the installer's configuration comes from (`[packages]` of config.toml).
#[derive(Debug, Clone)]
pub struct InstallerConfig {
    pub python: String,
    pub uid: u32,
    pub gid: u32,
    pub index_url: String,
    pub extra_index_url: String,
    pub wheel_dir: Option<PathBuf>,
    pub offline: bool,
    pub timeout: Duration,
    pub limits: Limits,
}

/// pip failed; its output says why.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct PipError {
    pub message: String,
    /// The end of what pip printed.
    pub output: String,
}

pub struct Installer {
    stage: Arc<Stage>,
    layout: Arc<Layout>,
    cgroup_parent: String,
    cfg: InstallerConfig,
}

#[derive(Deserialize)]
struct Report {
    install: Vec<ReportItem>,
}

#[derive(Deserialize)]
struct ReportItem {
    metadata: ReportMetadata,
}

#[derive(Deserialize)]
struct ReportMetadata {
    name: String,
    version: String,
    #[serde(default)]
    requires_dist: Vec<String>,
}

impl Installer {
    pub fn new(stage: Arc<Stage>, layout: Arc<Layout>, cgroup_parent: String, cfg: InstallerConfig) -> Installer {
        Installer { stage, layout, cgroup_parent, cfg }
    }

    /// What distinguishes one package source from another (part of a resolution's key).
    pub fn source_fingerprint(&self) -> String {
        format!(
            "index={} extra={} wheels={} offline={}",
            self.index_url(),
            self.cfg.extra_index_url,
            self.cfg.wheel_dir.as_ref().map(|p| p.display().to_string()).unwrap_or_default(),
            self.cfg.offline
        )
    }

    fn index_url(&self) -> String {
        if !self.cfg.index_url.is_empty() {
            return self.cfg.index_url.clone();
        }
        std::env::var("PIP_INDEX_URL").unwrap_or_default()
    }

    fn index_args(&self) -> Vec<String> {
        let mut args = Vec::new();
        if self.cfg.offline {
            args.push("--no-index".to_string());
        } else {
            if !self.cfg.index_url.is_empty() {
                args.extend(["--index-url".to_string(), self.cfg.index_url.clone()]);
            }
            if !self.cfg.extra_index_url.is_empty() {
                args.extend(["--extra-index-url".to_string(), self.cfg.extra_index_url.clone()]);
            }
        }
        if self.cfg.wheel_dir.is_some() {
            args.extend(["--find-links".to_string(), "/wheels".to_string()]);
        }
        args
    }

    fn env(&self) -> Vec<(String, String)> {
        let mut env: Vec<(String, String)> = PASSED_ENV
            .iter()
            .filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v)))
            .filter(|(k, _)| !(k.starts_with("PIP_") && k.contains("INDEX") && (self.cfg.offline || !self.cfg.index_url.is_empty())))
            .collect();
        env.extend([
            ("PIP_DISABLE_PIP_VERSION_CHECK".into(), "1".into()),
            ("PIP_NO_INPUT".into(), "1".into()),
            ("PIP_PROGRESS_BAR".into(), "off".into()),
            ("PIP_ROOT_USER_ACTION".into(), "ignore".into()),
            ("HOME".into(), "/host/work/tmp".into()),
            ("TMPDIR".into(), "/host/work/tmp".into()),
            ("PIP_CERT".into(), "/etc/ssl/certs/ca-certificates.crt".into()),
        ]);
        env
    }

    /// The host's network settings and the staging directory, bound into the sandbox.
    fn binds(&self, staging: &Staging) -> Vec<Bind> {
        let mut binds = vec![Bind { src: staging.dir.clone(), dst: "/host/work".into(), writable: true }];
        for file in ["/etc/resolv.conf", "/etc/hosts"] {
            let in_base = self.stage.base.join(file.trim_start_matches('/'));
            if std::path::Path::new(file).is_file() && in_base.is_file() {
                binds.push(Bind { src: file.into(), dst: file.into(), writable: false });
            }
        }
        let ca = ["PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE"]
            .iter()
            .filter_map(|k| std::env::var(k).ok())
            .map(PathBuf::from)
            .chain(std::iter::once(PathBuf::from("/etc/ssl/certs/ca-certificates.crt")))
            .find(|p| p.is_file());
        let in_base = self.stage.base.join("etc/ssl/certs/ca-certificates.crt");
        if let (Some(ca), true) = (ca, in_base.is_file()) {
            binds.push(Bind { src: ca, dst: "/etc/ssl/certs/ca-certificates.crt".into(), writable: false });
        }
        if let Some(wheels) = &self.cfg.wheel_dir {
            binds.push(Bind { src: wheels.clone(), dst: "/wheels".into(), writable: false });
        }
        binds
    }

    async fn pip(&self, what: &str, staging: &Staging, args: Vec<String>) -> Result<Duration, PipError> {
        let mut argv = vec![self.cfg.python.clone(), "-m".into(), "pip".into()];
        argv.extend(args);
        let spec = OneshotSpec {
            name: what.to_string(),
            argv,
            env: self.env(),
            binds: self.binds(staging),
            limits: self.cfg.limits,
            timeout: self.cfg.timeout,
            uid: self.cfg.uid,
            gid: self.cfg.gid,
            scratch_mb: 16,
            workdir: "/host/work".into(),
        };
        let started = Instant::now();
        let outcome = oneshot::run(&self.stage, self.layout.clone(), &self.cgroup_parent, &spec)
            .await
            .map_err(|e| PipError { message: format!("could not run pip to {what}: {e}"), output: String::new() })?;
        let tail = outcome.output.trim_end().to_string();
        let why = match outcome.ending {
            Ending::Exited(0) => return Ok(started.elapsed()),
            Ending::Exited(code) => format!("pip failed to {what} (exit status {code})"),
            Ending::Signaled(sig) => {
                format!("pip was killed by signal {sig} while trying to {what}")
            }
            Ending::TimedOut => format!("pip did not {what} within the installer's limit of {:?}", self.cfg.timeout),
            Ending::OutOfMemory => format!(
                "pip ran out of memory (the installer's limit is {} MiB) while trying to {what}",
                self.cfg.limits.memory_bytes >> 20
            ),
        };
        let last_error = tail.lines().rev().find(|l| l.contains("ERROR") || l.contains("error:")).map(str::trim);
        let message = match last_error {
            Some(line) => format!("{why}: {line}"),
            None => why,
        };
        Err(PipError { message, output: tail })
    }

    /// Resolve `requirements` (requirements.txt text) to pinned packages with pip's resolver.
    pub async fn resolve(&self, requirements: &str, staging: &Staging) -> Result<Vec<Pin>, PipError> {
        std::fs::write(staging.dir.join("requirements.txt"), requirements).map_err(io_error)?;
        let mut args: Vec<String> = [
            "install",
            "--dry-run",
            "--ignore-installed",
            "--quiet",
            "--report",
            "/host/work/report.json",
            "--no-cache-dir",
            "-r",
            "/host/work/requirements.txt",
        ]
        .map(String::from)
        .to_vec();
        args.extend(self.index_args());
        self.pip("resolve the requirements", staging, args).await?;
        let report = std::fs::read(staging.dir.join("report.json")).map_err(io_error)?;
        let report: Report = serde_json::from_slice(&report)
            .map_err(|e| PipError { message: format!("pip's report is unreadable: {e}"), output: String::new() })?;
        let names: Vec<String> = report.install.iter().map(|i| normalize(&i.metadata.name)).collect();
        let pins = report
            .install
            .iter()
            .map(|item| {
                let mut depends_on: Vec<String> = item
                    .metadata
                    .requires_dist
                    .iter()
                    .filter(|r| !r.split_once(';').map(|(_, m)| m.contains("extra")).unwrap_or(false))
                    .map(|r| normalize(requirement_name(r)))
                    .filter(|n| names.contains(n))
                    .collect();
                depends_on.sort();
                depends_on.dedup();
                Pin { name: normalize(&item.metadata.name), version: item.metadata.version.clone(), depends_on }
            })
            .collect();
        Ok(pins)
    }

    /// Install exactly `pin` (no dependencies) into `staging`'s files directory.
    pub async fn install(&self, pin: &Pin, staging: &Staging) -> Result<Duration, PipError> {
        let mut args: Vec<String> = [
            "install",
            "--no-deps",
            "--ignore-installed",
            "--quiet",
            "--no-warn-script-location",
            "--no-cache-dir",
            "--target",
            "/host/work/files",
        ]
        .map(String::from)
        .to_vec();
        args.extend(self.index_args());
        args.push(format!("{}=={}", pin.name, pin.version));
        self.pip(&format!("install {}=={}", pin.name, pin.version), staging, args).await
    }

    /// Install a whole requirement set with its dependencies into `staging` (the install
    /// cache switched off: what every cold start then pays).
    pub async fn install_all(&self, requirements: &str, staging: &Staging) -> Result<Duration, PipError> {
        std::fs::write(staging.dir.join("requirements.txt"), requirements).map_err(io_error)?;
        let mut args: Vec<String> = [
            "install",
            "--ignore-installed",
            "--quiet",
            "--no-warn-script-location",
            "--no-cache-dir",
            "--target",
            "/host/work/files",
            "-r",
            "/host/work/requirements.txt",
        ]
        .map(String::from)
        .to_vec();
        args.extend(self.index_args());
        self.pip("install the requirements", staging, args).await
    }
}

fn io_error(e: std::io::Error) -> PipError {
    PipError { message: format!("installer staging: {e}"), output: String::new() }
}

/// The distribution name at the start of a Requires-Dist value.
pub fn requirement_name(r: &str) -> &str {
    let end = r.find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))).unwrap_or(r.len());
    &r[..end]
}
