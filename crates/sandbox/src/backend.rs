//! The seam between the worker and the ways of making sandboxes: a [`Backend`] makes a
//! [`Sandbox`] for a lambda's code; the sandbox serves requests, pauses and resumes, reports
//! its processes and memory, and destroys itself. Each back-end (a Zygote fork, a fresh
//! interpreter, runc, Docker) keeps its own per-sandbox state behind these two traits, so the
//! worker never names one — and a fake back-end can stand in for all of them in its tests.
//! Every sandbox speaks the same channel protocol ([`crate::session`]), so back-ends differ
//! only in how a sandbox comes to be and goes away, which is what the benchmarks compare.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;

use crate::channel::{Reply, Request};
use crate::session::Calls;
use crate::spec::{BackendStats, CreateError, HandlerKind, InvokeError, SandboxSpec};

/// A live sandbox with a loaded handler, lent to one request at a time.
#[async_trait]
pub trait Sandbox: Send + Sync {
    /// Unique among its back-end's sandboxes.
    fn id(&self) -> u64;
    fn kind(&self) -> HandlerKind;
    /// How long it took to make (for the cold-start metrics).
    fn startup(&self) -> Duration;
    /// Send one request and wait up to `timeout` for the reply, answering the handler's calls
    /// to other lambdas with `calls` meanwhile. After an error the sandbox is not reusable.
    async fn invoke(&mut self, request: &Request, body: &[u8], timeout: Duration, calls: &dyn Calls)
        -> Result<(Reply, Bytes), InvokeError>;
    /// Whether it may serve another request.
    fn reusable(&self) -> bool;
    /// Pause every process of the sandbox; false when this back-end's sandboxes cannot be paused.
    fn pause(&self) -> std::io::Result<bool> {
        Ok(false)
    }
    /// Let a paused sandbox run again.
    fn resume(&self) -> std::io::Result<()> {
        Ok(())
    }
    /// Whether it was killed while paused: its SIGKILL waits for the thaw, so resumed it would
    /// die under the request it was resumed for. Asked before resuming.
    fn killed_while_paused(&self) -> bool {
        false
    }
    /// Host pids of its processes.
    fn pids(&self) -> Vec<i32>;
    /// Its cgroup's share of a contended CPU, where it has a cgroup of its own that the
    /// worker may weigh and idle.
    fn cpu_control(&self) -> Option<crate::cgroup::CpuControl> {
        None
    }
    /// The peak memory of its cgroup during its last request, where it has a cgroup that
    /// tells.
    fn peak_memory(&self) -> Option<u64> {
        None
    }
    /// Memory of its processes, counting each shared page by its share (PSS).
    fn pss_bytes(&self) -> u64 {
        crate::memory::pss_of_pids(&self.pids())
    }
    /// Memory it holds by its cgroup (charged, less page cache no process maps:
    /// [`crate::memory::in_use`]), cheap to read; PSS where it has no cgroup of its own.
    fn memory_bytes(&self) -> u64 {
        self.pss_bytes()
    }
    /// Kill everything in it and give back what it held.
    async fn destroy(self: Box<Self>);
}

/// A way of making sandboxes: `sock`, `sock-nozygote`, `runc` or `docker`.
#[async_trait]
pub trait Backend: Send + Sync {
    /// The back-end's name as configured.
    fn name(&self) -> &'static str;
    /// Provision a sandbox and load the lambda's handler in it.
    async fn create(&self, spec: &SandboxSpec) -> Result<Box<dyn Sandbox>, CreateError>;
    fn stats(&self) -> BackendStats;
    /// Release what the back-end holds itself (Zygotes, pools) at shutdown.
    async fn shutdown(&self);
    /// The import cache of Zygotes, for back-ends that have one.
    fn import_cache(&self) -> Option<Arc<crate::import_cache::ImportCache>> {
        None
    }
    /// The cgroup holding everything the back-end runs (sandboxes, Zygotes, spares): its
    /// layout and name, where a whole-worker memory budget is enforced. None where the
    /// back-end's processes are not under one group of ours.
    fn memory_group(&self) -> Option<(Arc<crate::cgroup::Layout>, String)> {
        None
    }
}

/// What every back-end counts for [`Backend::stats`].
#[derive(Default)]
pub struct Counters {
    created: AtomicU64,
    destroyed: AtomicU64,
    failures: AtomicU64,
}

impl Counters {
    /// Count a create's outcome: a lambda that fails to load is not the platform's failure.
    pub fn record<T>(&self, result: &Result<T, CreateError>) {
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
