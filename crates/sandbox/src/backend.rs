//! The one interface every sandbox backend implements, and the sandbox handle they return.
//!
//! A request walks down once: the worker asks a [`Backend`] to `create` a [`Sandbox`] for a
//! lambda's code, calls [`Sandbox::invoke`] as often as it likes, and hands it back to
//! `destroy`. The handle speaks the same channel protocol whatever made it (a Zygote fork, a
//! fresh interpreter, runc or Docker), so the backends differ only in how a sandbox comes to
//! be and goes away — which is exactly what the benchmarks compare.

use std::any::Any;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use serde::Serialize;

use crate::cgroup::{Cgroup, Limits};
use crate::channel::{Channel, Reply, Request};
use crate::process::PidFd;

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
    pub network: Option<Arc<crate::network::LambdaNetwork>>,
}

impl std::fmt::Debug for SandboxSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxSpec")
            .field("lambda", &self.lambda)
            .field("code_dir", &self.code_dir)
            .field("packages", &self.packages.iter().map(|p| &p.key).collect::<Vec<_>>())
            .finish()
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
}

/// Why a sandbox could not be made.
#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    /// The lambda's code failed to load (an import error, no entry point): the lambda's fault.
    #[error("{message}")]
    Load { message: String, traceback: Option<String> },
    /// The platform failed to provision the sandbox.
    #[error("{0}")]
    Platform(String),
}

impl CreateError {
    pub fn platform(e: impl std::fmt::Display) -> CreateError {
        CreateError::Platform(e.to_string())
    }
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

/// Backend-specific state of one sandbox, kept until `destroy`.
pub enum Resources {
    /// A lean sandbox: its slot (root directory) and cgroup.
    Lean { slot: usize, cgroup: Cgroup },
    /// An OCI container run by runc, with its bundle and scratch directories.
    Runc { container: String, bundle: PathBuf },
    /// A Docker container.
    Docker { container: String, scratch: PathBuf },
}

/// A live sandbox with a loaded handler.
pub struct Sandbox {
    pub id: u64,
    pub lambda: String,
    pub kind: HandlerKind,
    pub created: Instant,
    /// How long provisioning took (for the cold-start metrics).
    pub startup: Duration,
    pub(crate) channel: Channel,
    pub(crate) process: Option<PidFd>,
    pub(crate) cgroup_path: Option<CgroupView>,
    pub(crate) limits: Limits,
    pub(crate) resources: Resources,
    /// Set when the sandbox must not be reused (it failed, or left processes behind).
    pub(crate) tainted: bool,
    /// Dropped with the sandbox: what it was made with (its Zygote's use count, a
    /// per-sandbox package install).
    pub(crate) attached: Vec<Box<dyn Any + Send + Sync>>,
    /// The import cache, to learn the package modules its handler loads on first use.
    pub(crate) learner: Option<std::sync::Weak<crate::import_cache::ImportCache>>,
}

/// What `invoke` needs of a sandbox's cgroup when the backend owns it elsewhere.
#[derive(Debug, Clone)]
pub(crate) struct CgroupView {
    pub procs: PathBuf,
    pub oom_before: u64,
    pub oom_source: Option<PathBuf>,
}

/// What answers a handler's calls to other lambdas (`sprout.invoke`) during a request.
#[async_trait]
pub trait Calls: Send + Sync {
    /// Run `lambda` on `event` within `time_left`; the header and body of the frame sent back
    /// to the handler: `{"status": 200}` and the result, or `{"error": code, "message": ...,
    /// "status": ...}`.
    async fn call(&self, lambda: &str, event: Bytes, time_left: Duration) -> (serde_json::Value, Bytes);
}

impl Sandbox {
    /// Send one request and wait up to `timeout` for the reply, answering the handler's
    /// calls to other lambdas with `calls` meanwhile. On error the sandbox is tainted: the
    /// caller must destroy it; a crash says how far the request had got (once the handler
    /// has made a call, never a phase in which running it again would be safe).
    pub async fn invoke(
        &mut self,
        request: &Request,
        body: &[u8],
        timeout: Duration,
        calls: &dyn Calls,
    ) -> Result<(Reply, Bytes), InvokeError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let exchange = async {
            self.channel.send(request, body).await.map_err(|e| (e, Phase::Sending))?;
            let mut called = false;
            loop {
                let waiting = if called { Phase::Replying } else { Phase::AwaitingReply };
                self.channel.await_frame().await.map_err(|e| (e, waiting))?;
                let (mut reply, body) = self.channel.recv::<Reply>().await.map_err(|e| (e, Phase::Replying))?;
                match reply.op.as_deref() {
                    None => return Ok((reply, body)),
                    Some("invoke") => {}
                    Some(other) => {
                        // Nothing else may be asked of the worker over a sandbox's channel.
                        self.tainted = true;
                        reply.error = Some("invalid_result".into());
                        reply.message = Some(format!("the sandbox asked for {other:?}, which a sandbox cannot ask for"));
                        return Ok((reply, Bytes::new()));
                    }
                }
                called = true;
                let lambda = reply.lambda.unwrap_or_default();
                // The call must end a little before this request does, so the handler hears
                // how it ended (a timeout, say) in time to answer.
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                let budget = left.saturating_sub((left / 10).min(Duration::from_millis(100)));
                let (header, result) = calls.call(&lambda, body, budget).await;
                self.channel.send(&header, &result).await.map_err(|e| (e, Phase::Replying))?;
            }
        };
        let result = tokio::time::timeout(timeout, exchange).await;
        match result {
            Ok(Ok(reply)) => {
                if !self.only_helper_left() {
                    self.tainted = true;
                }
                if let (Some(report), Some(cache)) = (&reply.0.package_modules, self.learner.as_ref().and_then(|l| l.upgrade())) {
                    cache.learn(report);
                }
                Ok(reply)
            }
            Ok(Err((e, phase))) => {
                self.tainted = true;
                Err(self.diagnose(e, phase))
            }
            Err(_) => {
                self.tainted = true;
                Err(InvokeError::Timeout(timeout))
            }
        }
    }

    /// After a request the helper (PID 1 of the sandbox) kills what the handler left running;
    /// the worker checks rather than trusts it, since the helper runs the handler's code.
    fn only_helper_left(&self) -> bool {
        match &self.cgroup_path {
            Some(view) => crate::cgroup::read_pids(&view.procs).len() <= 1,
            None => true,
        }
    }

    /// Why the channel broke: the OOM killer, or some other death.
    fn diagnose(&self, e: std::io::Error, phase: Phase) -> InvokeError {
        if let Some(view) = &self.cgroup_path {
            let oom_now = match &view.oom_source {
                Some(path) => crate::cgroup::read_oom_kills(path),
                None => 0,
            };
            if oom_now > view.oom_before {
                return InvokeError::OutOfMemory { limit_mb: self.limits.memory_bytes >> 20 };
            }
        }
        InvokeError::Crashed { message: e.to_string(), phase }
    }

    /// Whether the sandbox may serve another request.
    pub fn reusable(&self) -> bool {
        !self.tainted && !self.process.as_ref().map(|p| p.has_exited()).unwrap_or(false)
    }

    /// Host pid of the helper (PID 1 inside the sandbox), when known.
    pub fn pid(&self) -> Option<i32> {
        self.process.as_ref().map(|p| p.pid())
    }

    /// Pause every process of the sandbox (the cgroup freezer); false when this backend's
    /// sandboxes cannot be paused.
    pub fn pause(&self) -> std::io::Result<bool> {
        match &self.resources {
            Resources::Lean { cgroup, .. } => cgroup.set_frozen(true).map(|_| true),
            _ => Ok(false),
        }
    }

    /// Let a paused sandbox run again.
    pub fn resume(&self) -> std::io::Result<()> {
        match &self.resources {
            Resources::Lean { cgroup, .. } => cgroup.set_frozen(false),
            _ => Ok(()),
        }
    }

    /// Host pids of the sandbox's processes.
    pub fn pids(&self) -> Vec<i32> {
        match &self.cgroup_path {
            Some(view) => crate::cgroup::read_pids(&view.procs),
            None => self.pid().into_iter().collect(),
        }
    }

    /// Memory of the sandbox's processes, counting each shared page by its share (PSS).
    pub fn pss_bytes(&self) -> u64 {
        crate::memory::pss_of_pids(&self.pids())
    }
}

/// What every backend counts for [`Backend::stats`].
#[derive(Default)]
pub(crate) struct Counters {
    created: AtomicU64,
    destroyed: AtomicU64,
    failures: AtomicU64,
}

impl Counters {
    /// Count a create's outcome: a lambda that fails to load is not the platform's failure.
    pub fn record(&self, result: &Result<Sandbox, CreateError>) {
        let counter = match result {
            Ok(_) => &self.created,
            Err(CreateError::Platform(_)) => &self.failures,
            Err(CreateError::Load { .. }) => return,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub fn destroyed(&self) {
        self.destroyed.fetch_add(1, Ordering::Relaxed);
    }

    pub fn stats(&self) -> BackendStats {
        BackendStats {
            created: self.created.load(Ordering::Relaxed),
            destroyed: self.destroyed.load(Ordering::Relaxed),
            create_failures: self.failures.load(Ordering::Relaxed),
            ..BackendStats::default()
        }
    }
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
pub(crate) fn sandbox_env_strings(extra: &[(String, String)]) -> Vec<String> {
    sandbox_env(extra).into_iter().map(|(k, v)| format!("{k}={v}")).collect()
}

/// What a new sandbox keeps alive from its spec.
pub(crate) fn attachments(spec: &SandboxSpec) -> Vec<Box<dyn Any + Send + Sync>> {
    spec.attached.iter().map(|a| Box::new(a.clone()) as Box<dyn Any + Send + Sync>).collect()
}

/// The hello's handler kind, or the load failure it reports.
pub(crate) fn handler_kind(hello: crate::channel::Hello) -> Result<HandlerKind, CreateError> {
    match hello.kind.as_deref() {
        Some("wsgi") => Ok(HandlerKind::Wsgi),
        Some("function") => Ok(HandlerKind::Function),
        _ => Err(CreateError::Load {
            message: hello.message.unwrap_or_else(|| "the handler failed to load".into()),
            traceback: hello.traceback,
        }),
    }
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

/// Counters a backend reports for /stats and /metrics.
#[derive(Debug, Default, Clone, Serialize)]
pub struct BackendStats {
    pub created: u64,
    pub destroyed: u64,
    pub create_failures: u64,
    pub cgroups_created: u64,
    pub cgroups_reused: u64,
    pub zygote_restarts: u64,
}

/// A way of making sandboxes: `sock`, `sock-nozygote`, `runc` or `docker`.
#[async_trait]
pub trait Backend: Send + Sync {
    /// The backend's name as configured.
    fn name(&self) -> &'static str;
    /// Provision a sandbox and load the lambda's handler in it.
    async fn create(&self, spec: &SandboxSpec) -> Result<Sandbox, CreateError>;
    /// Kill everything in the sandbox and give back what it held.
    async fn destroy(&self, sandbox: Sandbox);
    fn stats(&self) -> BackendStats;
    /// Release what the backend holds itself (Zygotes, pools) at shutdown.
    async fn shutdown(&self);
    /// The import cache of Zygotes, for backends that have one.
    fn import_cache(&self) -> Option<Arc<crate::import_cache::ImportCache>> {
        None
    }
}
