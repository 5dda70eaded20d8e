//! pip, run inside one-shot sandboxes: it resolves a requirement set (`--dry-run --report`)
//! and installs one package at a time (`--no-deps --target`) into a staging directory.
//!
//! Package installs may run arbitrary code (an sdist's build), so each runs in a sandbox of
//! its own as the unprivileged sandbox user, with the installer's memory, process and time
//! limits, seeing only the base image, its staging directory and, when configured, the local
//! wheel directory (read-only at /wheels). It shares the host's network, DNS and CA bundle,
//! and inherits the host's PIP_* and proxy settings unless the configuration names an index.
//!
//! An index that fails for a moment (a connection refused or reset, a timeout, a name that did
//! not resolve, a 5xx, or an index that listed no version at all) is tried again, at most
//! [`ATTEMPTS`] times in all ([`pip_failure`] decides, from pip's own words); a failure says
//! why in pip's words: the lines of its output that explain, not only its last.

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

/// Most runs of pip for one step when the index fails for a moment.
pub const ATTEMPTS: u32 = 3;
/// The pause before the second attempt; doubled before each later one.
const FIRST_PAUSE: Duration = Duration::from_secs(2);
/// Most lines of pip's output that say why it failed, in a failure's message.
const MAX_REASONS: usize = 6;

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
    /// The lines of pip's output that say why (its errors, and the warnings of what failed).
    pub reasons: Vec<String>,
}

impl PipError {
    fn plain(message: String) -> PipError {
        PipError { message, output: String::new(), reasons: Vec::new() }
    }
}

/// What pip's output says of a failed run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PipFailure {
    /// The lines that say why, in order, without repeats.
    pub reasons: Vec<String>,
    /// The index failed for a moment (or listed nothing): the same run may well succeed.
    pub transient: bool,
}

/// Read a failed pip run's output: the lines that say why, and whether the failure was the
/// index's for a moment. `from_index`: pip asked an index (not only a wheel directory), so
/// "from versions: none" may be the index's hiccup rather than a missing package.
pub fn pip_failure(output: &str, from_index: bool) -> PipFailure {
    const NETWORK: [&str; 14] = [
        "Retrying (",
        "Could not fetch URL",
        "NewConnectionError",
        "ConnectTimeoutError",
        "ReadTimeoutError",
        "Read timed out",
        "Connection reset",
        "Connection refused",
        "connection broken",
        "ProtocolError",
        "IncompleteRead",
        "Temporary failure in name resolution",
        "Name or service not known",
        "Max retries exceeded",
    ];
    let server_error =
        |line: &str| line.split(|c: char| !c.is_ascii_digit()).any(|n| n.len() == 3 && n.starts_with('5')) && line.contains("HTTP");
    let mut reasons: Vec<String> = Vec::new();
    let mut network = false;
    for line in output.lines().map(str::trim) {
        let is_network = NETWORK.iter().any(|w| line.contains(w)) || server_error(line);
        let says_why = line.starts_with("ERROR") || line.contains("error:") || (line.starts_with("WARNING") && is_network);
        network |= is_network;
        if says_why && !reasons.iter().any(|r| r == line) {
            reasons.push(line.to_string());
        }
    }
    let listed_nothing = output.contains("(from versions: none)");
    PipFailure { transient: network || (from_index && listed_nothing), reasons }
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

    /// Run pip with `args` to do `what`, again after a pause while the index fails for a
    /// moment (at most [`ATTEMPTS`] runs); how long the successful run took.
    async fn pip(&self, what: &str, staging: &Staging, args: Vec<String>) -> Result<Duration, PipError> {
        let mut pause = FIRST_PAUSE;
        for attempt in 1..=ATTEMPTS {
            match self.pip_once(what, staging, args.clone()).await {
                Ok(took) => return Ok(took),
                Err((e, true)) if attempt < ATTEMPTS => {
                    tracing::warn!(attempt, "pip failed to {what}, the index's failure for a moment; trying again in {pause:?}: {e}");
                    tokio::time::sleep(pause).await;
                    pause *= 2;
                }
                Err((mut e, transient)) => {
                    if transient {
                        e.message = format!("{} (tried {ATTEMPTS} times)", e.message);
                    }
                    return Err(e);
                }
            }
        }
        unreachable!("the last attempt returns")
    }

    /// One run of pip; a failure says whether it was the index's for a moment.
    async fn pip_once(&self, what: &str, staging: &Staging, args: Vec<String>) -> Result<Duration, (PipError, bool)> {
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
            .map_err(|e| (PipError::plain(format!("could not run pip to {what}: {e}")), false))?;
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
        let failure = pip_failure(&tail, !self.cfg.offline);
        let exited = matches!(outcome.ending, Ending::Exited(_));
        // The last lines say what failed; the first warnings, often, why.
        let shown: Vec<&str> = match failure.reasons.len() {
            n if n <= MAX_REASONS => failure.reasons.iter().map(String::as_str).collect(),
            n => failure.reasons[..2].iter().chain(&failure.reasons[n - (MAX_REASONS - 2)..]).map(String::as_str).collect(),
        };
        let message = match shown.is_empty() {
            true => why,
            false => format!("{why}: {}", shown.join(" | ")),
        };
        Err((PipError { message, output: tail, reasons: failure.reasons }, exited && failure.transient))
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
        let report: Report = serde_json::from_slice(&report).map_err(|e| PipError::plain(format!("pip's report is unreadable: {e}")))?;
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
    PipError::plain(format!("installer staging: {e}"))
}

/// The distribution name at the start of a Requires-Dist value.
pub fn requirement_name(r: &str) -> &str {
    let end = r.find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))).unwrap_or(r.len());
    &r[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    const NO_VERSIONS: &str = "ERROR: Could not find a version that satisfies the requirement numpy==2.4.6 (from versions: none)\n\
                               ERROR: No matching distribution found for numpy==2.4.6";

    #[test]
    fn an_index_that_listed_nothing_is_tried_again_but_a_wheel_directory_is_not() {
        let f = pip_failure(NO_VERSIONS, true);
        assert!(f.transient);
        assert_eq!(f.reasons.len(), 2, "both error lines, not only the last: {f:?}");
        assert!(f.reasons[0].contains("from versions: none"));
        assert!(!pip_failure(NO_VERSIONS, false).transient, "offline: no index to hiccup");
    }

    #[test]
    fn network_warnings_say_why_and_make_it_transient() {
        let output = "WARNING: Retrying (Retry(total=4, connect=None, read=None, redirect=None, status=None)) after connection broken by \
                      'NewConnectionError(\"<pip._vendor.urllib3.connection.HTTPSConnection>: Failed to establish a new connection: \
                      [Errno -3] Temporary failure in name resolution\")': /simple/numpy/\n\
                      WARNING: Retrying (Retry(total=4, connect=None, read=None, redirect=None, status=None)) after connection broken by \
                      'NewConnectionError(\"<pip._vendor.urllib3.connection.HTTPSConnection>: Failed to establish a new connection: \
                      [Errno -3] Temporary failure in name resolution\")': /simple/numpy/\n\
                      WARNING: Some unrelated notice\n"
            .to_string()
            + NO_VERSIONS;
        let f = pip_failure(&output, false);
        assert!(f.transient, "a network failure is transient even without an index of our own: {f:?}");
        assert_eq!(f.reasons.len(), 3, "the warning once, not the unrelated one, then the errors: {f:?}");
        assert!(f.reasons[0].contains("Temporary failure in name resolution"));
        let server = pip_failure("WARNING: Could not fetch URL https://index/simple/x/: HTTP error 503 while getting it\nERROR: x", true);
        assert!(server.transient && server.reasons[0].contains("503"), "{server:?}");
    }

    #[test]
    fn a_missing_version_or_a_build_error_is_not_tried_again() {
        let missing = "ERROR: Could not find a version that satisfies the requirement gamma==9.0 (from versions: 1.0, 2.0)\n\
                       ERROR: No matching distribution found for gamma==9.0";
        assert!(!pip_failure(missing, true).transient);
        let build = "  error: subprocess-exited-with-error\n  × python setup.py egg_info did not run successfully.\n\
                     ERROR: Could not build wheels for broken";
        let f = pip_failure(build, true);
        assert!(!f.transient);
        assert_eq!(f.reasons, ["error: subprocess-exited-with-error", "ERROR: Could not build wheels for broken"]);
    }
}
