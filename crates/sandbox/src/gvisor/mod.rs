//! The `gvisor` back-end: a second kernel between tenants. Each lambda's sandboxes run in
//! one gVisor sandbox of that lambda's (a [`pod`]), under gVisor's user-space kernel on the
//! systrap platform ([`runsc`]), so a kernel bug reachable from a handler is gVisor's, not
//! the host's. The hard boundary is between lambdas; inside a pod the lambda's Zygote forks
//! its handlers (SOCK's idea, kept inside the boundary), from spares forked ahead, so only a
//! lambda's first cold start pays for starting gVisor, and that start is a restore of its
//! package set's [`template`] once there is one. A pod whose sandboxes have all been paused
//! for `park_after` is parked to disk, its handlers in it, and restored by the next request
//! ([`parking`]); a pod goes when its last handler does (scale to zero). Why this shape, and
//! what each alternative measured: docs/isolation.md.
//!
//! A handler in a pod is the lean sandboxes' helper with their channel protocol; it differs
//! in how it is reached: it connects to the pod's socket on its own, its output goes to a
//! FIFO per handler in the pod's scratch (host descriptors cannot be handed into gVisor),
//! its memory limit is its address space (gVisor enforces it per process; past it the
//! handler dies as under the OOM killer and the pod reports why), and the pod's cgroup on
//! the host bounds the whole pod.

mod ahead;
mod background;
mod bundle;
mod claim;
mod ledger;
mod parking;
pub mod pod;
mod room;
pub mod runsc;
mod settings;
mod slot;
mod template;
mod zygote;

pub use settings::GvisorConfig;

use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use serde_json::{json, Value};

use crate::backend::{Backend, Counters, Sandbox};
use crate::cgroup::{Layout, Version};
use crate::channel::{Init, Reply, Request};
use crate::error::{Doing, PlatformError};
use crate::output::OutputSink;
use crate::session::{handler_kind, Calls, Session};
use crate::session_methods;
use crate::spec::{BackendStats, CreateError, InvokeError, Phase, SandboxSpec};
use crate::stage::Stage;
use ahead::Created;
use ledger::DiskLedger;
use pod::Pod;
use runsc::Runsc;
use settings::PodSettings;
use slot::{ParkingCounters, PodSlot, SlotRef};
use template::Templates;

/// The exit status of a handler that went past its memory limit (runtime/dispatch.py).
const EXIT_OUT_OF_MEMORY: i32 = 75;

/// The `gvisor` back-end.
pub struct GvisorBackend {
    inner: Arc<Inner>,
}

/// What the back-end and its sandboxes share.
struct Inner {
    settings: PodSettings,
    runsc: Runsc,
    stage: Arc<Stage>,
    layout: Option<Layout>,
    /// Each lambda's pod (by lambda and code), with the count of its sandboxes.
    pods: Mutex<HashMap<String, Arc<PodSlot>>>,
    next_id: AtomicU64,
    counters: Counters,
    /// Spares pods let go after `spares_idle` without a cold start.
    spares_let_go: AtomicU64,
    /// Checkpoints to restore lambdas' first pods from, by package set.
    templates: Arc<Templates>,
    /// Whether pods come from templates (`[gvisor] templates`).
    use_templates: bool,
    /// Containers created ahead, by template (package set), and how many are being made.
    ahead: Mutex<HashMap<String, (Vec<Created>, usize)>>,
    /// Parked pods' images against the disk budget.
    ledger: Mutex<DiskLedger<SlotRef>>,
    parking: ParkingCounters,
    /// Parks in the background take turns, one at a time: each ends in its own checkpoint's
    /// time (a hundred idled at once all ended a minute or two later, memory held and
    /// requests waiting meanwhile), and a request waits only for its own pod's.
    park_turn: tokio::sync::Semaphore,
    /// Work off the requests' paths, which the shutdown waits for.
    background: background::Background,
}

/// One handler in a pod.
struct GvisorSandbox {
    session: Session,
    pid: i32,
    slot: Arc<PodSlot>,
    inner: Arc<Inner>,
    /// The pod its channel leads into (a parked pod comes back as a new one).
    pod_id: u64,
    /// Paused by the worker (counted in its slot's paused sandboxes).
    paused: AtomicBool,
    sink: Arc<dyn OutputSink>,
}

impl GvisorBackend {
    pub fn new(cfg: GvisorConfig, stage: Arc<Stage>) -> GvisorBackend {
        let layout = Layout::detect(Version::Auto, None)
            .map_err(|e| tracing::warn!("no cgroup hierarchy found; gVisor pods go unmeasured: {e}"))
            .ok();
        let seccomp = cfg.seccomp.then(crate::seccomp::program_bytes).transpose().unwrap_or_else(|e| {
            tracing::error!("compiling the seccomp filter for gVisor's handlers: {e}");
            None
        });
        if let (Some(cpus), Some(Layout::V1 { .. })) = (&cfg.cpuset, &layout) {
            if let Err(e) = cpuset_parent(&cfg.cgroup_parent, cpus) {
                tracing::warn!("preparing the pods' cpuset group: {e}");
            }
        }
        let runsc = Runsc {
            binary: cfg.runsc.clone(),
            root: stage.run.join("runsc-state"),
            host_network: cfg.host_network,
            background_restore: cfg.background_restore,
            worker_cpuset: if cfg.cpuset.is_none() { crate::runc::worker_cpuset().zip(crate::runc::cpuset_mount()) } else { None },
        };
        let use_templates = cfg.templates;
        let ledger = Mutex::new(DiskLedger::new(cfg.park_disk_bytes));
        let inner = Inner {
            settings: PodSettings { cfg, seccomp: seccomp.map(hex::encode) },
            runsc,
            stage,
            layout,
            pods: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            counters: Counters::default(),
            spares_let_go: AtomicU64::new(0),
            templates: Arc::new(Templates::default()),
            use_templates,
            ahead: Mutex::new(HashMap::new()),
            ledger,
            parking: ParkingCounters::default(),
            park_turn: tokio::sync::Semaphore::new(1),
            background: background::Background::default(),
        };
        GvisorBackend { inner: Arc::new(inner) }
    }

    /// Check that runsc runs here, before the worker serves (a missing build says how to
    /// make it).
    pub async fn check(&self) -> Result<String, PlatformError> {
        let runsc = &self.inner.runsc;
        let out = runsc.command(false, None).arg("--version").output().await.map_err(|e| runsc.spawn_error(e))?;
        Ok(String::from_utf8_lossy(&out.stdout).lines().next().unwrap_or("").to_string())
    }
}

/// On cgroup v1 runsc makes each pod's cpuset group under `parent` but does not fill the
/// parent's CPUs and memory nodes first (runc does), so a pod's CPUs could not be set: the
/// parent gets `cpus` and the root's memory nodes.
fn cpuset_parent(parent: &str, cpus: &str) -> std::io::Result<()> {
    let root = std::path::Path::new("/sys/fs/cgroup/cpuset");
    let dir = root.join(parent);
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("cpuset.mems"), std::fs::read_to_string(root.join("cpuset.mems"))?.trim())?;
    std::fs::write(dir.join("cpuset.cpus"), cpus)
}

impl Inner {
    /// Bind a spare of `pod` to a sandbox for `spec`.
    async fn provision(self: &Arc<Self>, pod: &Arc<Pod>, spec: &SandboxSpec) -> Result<(Session, i32), CreateError> {
        let started = Instant::now();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (spare, cold_starts) = pod.take_spare(&self.settings, self.settings.cfg.start_timeout).await?;
        // Replacements (a restored pod's first: all but the one its template held), off this
        // request's path, and let go again once cold starts stop for `spares_idle`.
        let wanted = self.settings.cfg.spares.saturating_sub(pod.pending());
        tokio::spawn({
            let (inner, pod) = (self.clone(), pod.clone());
            async move {
                if wanted > 0 {
                    if let Err(e) = pod.fork_spares(&inner.settings, wanted).await {
                        tracing::warn!(pod = pod.id, "forking a spare: {e}");
                    }
                }
                tokio::time::sleep(inner.settings.cfg.spares_idle).await;
                let gone = pod.let_spares_go(cold_starts).await;
                inner.spares_let_go.fetch_add(gone as u64, Ordering::Relaxed);
            }
        });
        let (host_fifo, fifo) = pod.output_fifo();
        let (output, hold) =
            crate::output::OutputPipe::fifo(&host_fifo, id, spec.output_sink()).at("making the output FIFO", &host_fifo)?;
        let mut init = Init::new(&spec.env, &spec.paths);
        init.output = Some(&fifo);
        init.memory_bytes = (spec.limits.memory_bytes > 0).then_some(spec.limits.memory_bytes);
        let mut channel = spare.channel;
        let hello = channel.handshake_with(&init, self.settings.cfg.start_timeout).await;
        drop(hold);
        let _ = std::fs::remove_file(&host_fifo);
        let hello = match hello {
            Ok(hello) => hello,
            Err(e) => {
                pod.kill(spare.pid).await;
                return Err(e.into());
            }
        };
        let kind = match handler_kind(hello) {
            Ok(kind) => kind,
            Err(e) => {
                pod.kill(spare.pid).await;
                return Err(e);
            }
        };
        let session = Session::new(id, kind, started.elapsed(), channel, None, None, spec.limits, spec.attachments(), Some(output));
        Ok((session, spare.pid))
    }
}

#[async_trait]
impl Backend for GvisorBackend {
    fn name(&self) -> &'static str {
        "gvisor"
    }

    async fn create(&self, spec: &SandboxSpec) -> Result<Box<dyn Sandbox>, CreateError> {
        let inner = &self.inner;
        let mut slot = inner.slot(spec);
        if slot.lost.load(Ordering::SeqCst) {
            // Lost after it was looked up: its successor is a new slot.
            inner.release(&slot).await;
            slot = inner.slot(spec);
        }
        let started = inner.pod_for(&slot, Some(spec)).await;
        let result = match started {
            Ok(pod) => inner.provision(&pod, spec).await.map(|(session, pid)| (session, pid, pod.id)),
            Err(e) => Err(e),
        };
        inner.counters.record(&result);
        match result {
            Ok((session, pid, pod_id)) => {
                slot.handlers.lock().expect("handlers lock").insert(pid, session.channel.as_raw_fd());
                let (inner, sink) = (inner.clone(), spec.output_sink());
                Ok(Box::new(GvisorSandbox { session, pid, slot, inner, pod_id, paused: AtomicBool::new(false), sink }))
            }
            Err(e) => {
                inner.release(&slot).await;
                Err(e)
            }
        }
    }

    fn stats(&self) -> BackendStats {
        BackendStats {
            spares_let_go: self.inner.spares_let_go.load(Ordering::Relaxed),
            parking: self.inner.parking_stats(),
            ..self.inner.counters.stats()
        }
    }

    async fn shutdown(&self) {
        let inner = &self.inner;
        // Parks and ends under way finish first: a container deleted under a checkpoint, or
        // a pod's cgroup left by a park that failed late, would outlive the worker.
        inner.background.close();
        inner.background.settle().await;
        let created: Vec<Created> = inner.ahead.lock().expect("ahead lock").drain().flat_map(|(_, (ready, _))| ready).collect();
        for created in created {
            created.discard(&inner.runsc).await;
        }
        let slots: Vec<Arc<PodSlot>> = inner.pods.lock().expect("pods lock").drain().map(|(_, s)| s).collect();
        for slot in slots {
            inner.end(&slot).await;
        }
        for container in inner.runsc.list().await {
            if container.starts_with("sprout-pod-") {
                inner.runsc.delete(&container).await;
            }
        }
        ahead::remove_bundle(&inner.stage.run.join("gvisor")).await;
        inner.background.settle().await; // a pod's last sandbox may have gone meanwhile
        if let Some(layout) = &inner.layout {
            layout.remove_container_parent(&inner.settings.cfg.cgroup_parent);
        }
    }
}

impl GvisorSandbox {
    /// The running pod, if it is this sandbox's.
    fn pod(&self) -> Option<Arc<Pod>> {
        self.slot.running().filter(|pod| pod.id == self.pod_id)
    }

    /// Make sure the handler's pod runs and its channel leads there: a parked pod is restored
    /// (by this request or another's), and the handler, which has reached the restored pod on
    /// its own, is bound again with a new output FIFO. When it was: how long the pod took to
    /// be running, and the handler to be bound after that.
    async fn bind(&mut self) -> Result<Option<(Duration, Duration)>, CreateError> {
        if self.pod().is_some() {
            return Ok(None);
        }
        let started = Instant::now();
        let pod = self.inner.pod_for(&self.slot, None).await?;
        if pod.id == self.pod_id {
            return Ok(None);
        }
        let running = started.elapsed();
        let timeout = self.inner.settings.cfg.start_timeout;
        let mut channel = pod.resumed(self.pid, timeout).await?;
        let (host_fifo, fifo) = pod.output_fifo();
        let (output, hold) =
            crate::output::OutputPipe::fifo(&host_fifo, self.session.id, self.sink.clone()).at("making the output FIFO", &host_fifo)?;
        channel.send(&json!({"op": "bind", "output": fifo}), &[]).await.doing("binding a restored handler")?;
        let bound = tokio::time::timeout(timeout, channel.recv::<Value>()).await;
        drop(hold);
        let _ = std::fs::remove_file(&host_fifo);
        match bound {
            Ok(Ok((said, _))) if said["op"] == "bound" => {}
            Ok(Ok((said, _))) => {
                return Err(PlatformError::Protocol { process: "a restored handler".into(), said: said.to_string() }.into())
            }
            Ok(Err(e)) => return Err(e).doing("binding a restored handler").map_err(Into::into),
            Err(_) => return Err(PlatformError::timed_out("a restored handler", "take its output", timeout).into()),
        }
        self.slot.handlers.lock().expect("handlers lock").insert(self.pid, channel.as_raw_fd());
        self.session.channel = channel;
        self.session.output = Some(output);
        self.pod_id = pod.id;
        Ok(Some((running, started.elapsed() - running)))
    }
}

#[async_trait]
impl Sandbox for GvisorSandbox {
    session_methods!();

    async fn invoke(
        &mut self,
        request: &Request,
        body: &[u8],
        timeout: Duration,
        calls: &dyn Calls,
    ) -> Result<(Reply, Bytes), InvokeError> {
        let bound = match self.bind().await {
            Ok(bound) => bound,
            Err(e) => {
                self.session.tainted = true;
                return Err(InvokeError::Crashed { message: format!("its parked pod could not be restored: {e}"), phase: Phase::Sending });
            }
        };
        let started = Instant::now();
        let invoked = self.session.invoke(request, body, timeout, calls).await;
        if let Some((running, bind)) = bound {
            self.inner.parking.first_request(running + bind + started.elapsed());
            // Where a parked handler's first request spends its time (the fleet's first
            // requests after idle).
            tracing::info!(
                pod = self.pod_id,
                pid = self.pid,
                running_ms = running.as_secs_f64() * 1e3,
                bind_ms = bind.as_secs_f64() * 1e3,
                request_ms = started.elapsed().as_secs_f64() * 1e3,
                "a parked handler's first request"
            );
        }
        match invoked {
            Err(InvokeError::Crashed { message, phase }) => {
                // The pod knows how its handler ended (it may take a moment to have reaped it).
                let mut status = None;
                if let Some(pod) = self.pod() {
                    for _ in 0..20 {
                        status = pod.status(self.pid).await;
                        if status.is_some() {
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
                match status {
                    Some(EXIT_OUT_OF_MEMORY) => Err(InvokeError::OutOfMemory { limit_mb: self.session.limits.memory_bytes >> 20 }),
                    _ => Err(InvokeError::Crashed { message, phase }),
                }
            }
            other => other,
        }
    }

    /// Paused by the worker: once every sandbox of its pod is, the pod is parked after
    /// `park_after` (where parking is on; else a gVisor sandbox is not paused).
    fn pause(&self) -> std::io::Result<bool> {
        if self.inner.settings.cfg.park_after.is_none() {
            return Ok(false);
        }
        if !self.paused.swap(true, Ordering::SeqCst) {
            self.slot.paused.fetch_add(1, Ordering::SeqCst);
        }
        self.slot.touch();
        self.inner.plan_park(&self.slot);
        Ok(true)
    }

    /// Taken for a request: a park planned meanwhile is called off (a parked pod is restored
    /// by the request itself, in `invoke`).
    fn resume(&self) -> std::io::Result<()> {
        self.slot.epoch.fetch_add(1, Ordering::SeqCst);
        self.slot.touch();
        if self.paused.swap(false, Ordering::SeqCst) {
            self.slot.paused.fetch_sub(1, Ordering::SeqCst);
        }
        Ok(())
    }

    /// Its parked pod's image was evicted (or parking it failed): the handler is gone.
    fn killed_while_paused(&self) -> bool {
        self.slot.lost.load(Ordering::SeqCst)
    }

    /// Its share of its pod's memory on the host (gVisor's kernel holds every handler's
    /// pages); none while the pod is parked.
    fn memory_bytes(&self) -> u64 {
        match (self.pod(), &self.inner.layout) {
            (Some(pod), Some(layout)) => layout.memory_in_use_of(&pod.cgroup) / self.slot.sandboxes.load(Ordering::Relaxed).max(1) as u64,
            _ => 0,
        }
    }

    fn pss_bytes(&self) -> u64 {
        self.memory_bytes()
    }

    async fn destroy(self: Box<Self>) {
        let pod = self.pod();
        let GvisorSandbox { session, pid, slot, inner, paused, .. } = *self;
        let Session { channel, attached, tainted, .. } = session;
        if paused.load(Ordering::SeqCst) {
            slot.paused.fetch_sub(1, Ordering::SeqCst);
        }
        // A handler waiting for its next request exits when its channel closes; one that
        // failed or overran its time may be running still, and is killed. (In a parked pod,
        // it is killed once the pod is restored, if it ever is.)
        slot.handlers.lock().expect("handlers lock").remove(&pid);
        drop(channel);
        if let (true, Some(pod)) = (tainted, pod) {
            pod.kill(pid).await;
        }
        inner.counters.destroyed();
        inner.release(&slot).await;
        drop(attached);
    }
}
