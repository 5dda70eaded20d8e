//! What the worker and every sandbox back-end share: what to run in a sandbox ([`SandboxSpec`],
//! [`Package`]), how its handler serves ([`HandlerKind`]), why making or using one failed
//! ([`CreateError`], [`InvokeError`]), what back-ends count ([`BackendStats`]) and the
//! environment sandbox processes start with. Types only, no behaviour.

use std::any::Any;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use crate::cgroup::Limits;
use crate::error::PlatformError;
use crate::network::LambdaNetwork;
use crate::output::{OutputSink, TracingSink};

/// A package a handler may import: installed in the install cache, on its `sys.path`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Package {
    /// `<name>==<version>`.
    pub key: String,
    /// Its directory inside the sandbox, e.g. `/packages/django==4.2.7`.
    pub path: String,
    /// Modules worth importing ahead in a Zygote (the top-level modules of a package the
    /// lambda asked for; none for a dependency it did not name).
    pub modules: Vec<String>,
    /// Bytes on disk: the import cache's estimate of what importing it ahead costs.
    pub size_bytes: u64,
}

/// Code that lambdas share but for their settings files (ol.yaml's `preload`): imported once,
/// in a code Zygote, which their sandboxes are forked from ([`crate::import_cache`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedCode {
    /// Digest of the code without its settings files (what to preload included): lambdas
    /// with equal digests and packages share a code Zygote.
    pub digest: String,
    /// That code, without the settings files: the code Zygote's /handler.
    pub dir: PathBuf,
    /// Modules the code Zygote imports from it.
    pub modules: Vec<String>,
    /// `module:function` the code Zygote calls after the imports, if any.
    pub call: Option<String>,
    /// Bytes of the code (what evicting its Zygote would cost to import again).
    pub size_bytes: u64,
}

/// What to run in a new sandbox.
#[derive(Clone)]
pub struct SandboxSpec {
    /// The lambda's name (for logs and labels).
    pub lambda: String,
    /// Directory holding the lambda's code, mounted read-only at /handler.
    pub code_dir: PathBuf,
    pub limits: Limits,
    /// Environment of the handler process.
    pub env: Vec<(String, String)>,
    /// The installed packages the lambda asked for and their dependencies, dependencies
    /// first; what the import cache chooses a Zygote by.
    pub packages: Vec<Package>,
    /// The handler's package directories on sys.path, in order.
    pub paths: Vec<String>,
    /// Kept alive as long as the sandbox (e.g. a per-sandbox package install).
    pub attached: Option<Arc<dyn Any + Send + Sync>>,
    /// The lambda's network namespace, joined by its handlers (lean backends); None: the
    /// host's network.
    pub network: Option<Arc<LambdaNetwork>>,
    /// Where the handler's stdout and stderr go; None: the worker's own log.
    pub output: Option<Arc<dyn OutputSink>>,
    /// Which of the worker's back-ends makes it (its lambda's isolation class, by the
    /// back-end's name); None: the worker's default.
    pub backend: Option<&'static str>,
    /// Code to fork from a code Zygote (the lean back-end's; others load it in the sandbox).
    pub shared_code: Option<SharedCode>,
    /// Modules the lambda's code imports (found at upload): a Zygote made for its packages
    /// imports those belonging to them ahead.
    pub imports: Arc<[String]>,
}

impl std::fmt::Debug for SandboxSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxSpec")
            .field("lambda", &self.lambda)
            .field("code_dir", &self.code_dir)
            .field("packages", &self.packages.iter().map(|p| &p.key).collect::<Vec<_>>())
            .field("backend", &self.backend)
            .finish()
    }
}

impl SandboxSpec {
    /// Where the sandbox's output goes.
    pub(crate) fn output_sink(&self) -> Arc<dyn OutputSink> {
        match &self.output {
            Some(sink) => sink.clone(),
            None => Arc::new(TracingSink(self.lambda.clone())),
        }
    }

    /// What a new sandbox keeps alive from its spec (and its network namespace, if any).
    pub fn attachments(&self) -> Vec<Box<dyn Any + Send + Sync>> {
        let attached = self.attached.iter().map(|a| Box::new(a.clone()) as Box<dyn Any + Send + Sync>);
        let network = self.network.iter().map(|n| Box::new(n.clone()) as Box<dyn Any + Send + Sync>);
        attached.chain(network).collect()
    }
}

/// How a handler serves requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum HandlerKind {
    /// `f(event)`: JSON in, JSON out.
    Function,
    /// A WSGI `app`: the whole HTTP request in, an HTTP response out.
    Wsgi,
    /// An ASGI `app`: the same, served as an ASGI HTTP connection.
    Asgi,
}

impl HandlerKind {
    /// Whether it serves whole HTTP requests (a web application), not events.
    pub fn serves_http(self) -> bool {
        matches!(self, HandlerKind::Wsgi | HandlerKind::Asgi)
    }
}

/// Why a sandbox could not be made.
#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    /// The lambda's code failed to load (an import error, no entry point): the lambda's fault.
    #[error("{message}")]
    Load { message: String, traceback: Option<String> },
    /// The platform failed to provision the sandbox.
    #[error(transparent)]
    Platform(#[from] PlatformError),
}

/// Why an invocation failed inside the sandbox (the sandbox is unusable afterwards).
#[derive(Debug, thiserror::Error)]
pub enum InvokeError {
    #[error("the handler ran past its time limit of {0:?} and was killed")]
    Timeout(Duration),
    #[error("the handler exceeded its memory limit of {limit_mb} MiB and was killed")]
    OutOfMemory { limit_mb: u64 },
    #[error("the sandbox died during the request: {message}")]
    Crashed { message: String, phase: Phase },
}

/// How far a request had got when its sandbox's channel broke: until a byte of the reply
/// arrives, a request that is safe to run twice may be sent to another sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Writing the request failed: the handler never received all of it.
    Sending,
    /// The request was sent, and not one byte of the reply had arrived.
    AwaitingReply,
    /// The reply had begun (or was malformed, or too large): the handler had finished.
    Replying,
}

/// Counters a backend reports for /stats and /metrics.
#[derive(Debug, Default, Clone, Serialize)]
pub struct BackendStats {
    pub created: u64,
    pub destroyed: u64,
    pub create_failures: u64,
    pub cgroups_created: u64,
    pub cgroups_reused: u64,
    pub zygote_restarts: u64,
    /// Spares let go after a quiet spell (gvisor: a pod's, after `spares_idle`).
    pub spares_let_go: u64,
    /// Pods parked to disk and restored (gvisor, where parking is on).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parking: Option<ParkingStats>,
}

/// What parking pods to disk has done ([`BackendStats::parking`]).
#[derive(Debug, Default, Clone, Serialize)]
pub struct ParkingStats {
    pub parks: u64,
    pub park_failures: u64,
    pub park_ms_mean: f64,
    pub restores: u64,
    pub restore_failures: u64,
    pub restore_ms_mean: f64,
    /// CPU a restore costs, mean: what the restored pod's processes (the Sentry, the gofer)
    /// had used by its end, their creation ahead included (0 where it cannot be read).
    pub restore_cpu_ms_mean: f64,
    /// Parked images removed for the disk budget (their sandboxes start afresh).
    pub evicted: u64,
    /// Pods started or restored over the resident budget (`[gvisor] resident_mb`: nothing
    /// idle was left to park).
    pub over_budget: u64,
    /// Pods being parked now (their checkpoints under way).
    pub parking_now: u64,
    /// Background parks a request came to wait for, given their CPU weight back so that the
    /// request waits no longer than the park needs.
    pub parks_hurried: u64,
    /// Parks a pod's start or restore waited for, to fit the resident budget (room made
    /// ahead, in the background, had not been enough).
    pub parks_waited_for: u64,
    /// Pods parked now, and their images' bytes on disk.
    pub parked: u64,
    pub parked_bytes: u64,
    /// Parked handlers' first requests, timed in the worker from the request's start to its
    /// reply (the pod's restore when the request waited for it, the handler's binding, the
    /// request): how many, and their p50, p99 and longest (0 when none).
    pub first_requests_after_park: u64,
    pub first_request_after_park_p50_ms: f64,
    pub first_request_after_park_p99_ms: f64,
    pub first_request_after_park_max_ms: f64,
}

/// The environment every sandbox process starts with; `extra` adds to it and overrides it.
pub(crate) fn sandbox_env(extra: &[(String, String)]) -> Vec<(String, String)> {
    let base = [("PATH", "/usr/local/bin:/usr/bin:/bin"), ("LANG", "C.UTF-8"), ("HOME", "/host"), ("TMPDIR", "/tmp")];
    let mut env: Vec<(String, String)> = base.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    for (key, value) in extra {
        match env.iter_mut().find(|(k, _)| k == key) {
            Some(slot) => slot.1 = value.clone(),
            None => env.push((key.clone(), value.clone())),
        }
    }
    env
}

/// [`sandbox_env`] as `KEY=value` strings, as OCI specs and the Docker API take it.
pub fn sandbox_env_strings(extra: &[(String, String)]) -> Vec<String> {
    sandbox_env(extra).into_iter().map(|(k, v)| format!("{k}={v}")).collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn extra_variables_override_the_defaults() {
        let env = super::sandbox_env(&[("TMPDIR".into(), "/host/work/tmp".into()), ("X".into(), "1".into())]);
        assert_eq!(
            env.iter().filter(|(k, _)| k == "TMPDIR").collect::<Vec<_>>(),
            vec![&("TMPDIR".to_string(), "/host/work/tmp".to_string())]
        );
        assert!(env.contains(&("X".into(), "1".into())));
    }
}
