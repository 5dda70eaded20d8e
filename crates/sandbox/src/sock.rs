//! SOCK's lean sandboxes (section 4.1) provisioned from the import cache's Zygotes (sections
//! 4.2-4.3), and the `sock-nozygote` variant that starts a fresh interpreter in each one.
//!
//! A sandbox is a slot directory whose root is stitched from bind mounts ([`Stage::stitch`]),
//! a cgroup from the pool, and a helper process that is PID 1 of new PID, IPC and UTS
//! namespaces, chrooted into the root, running as an unprivileged user. With Zygotes the
//! worker asks the [`ImportCache`] for the Zygote matching the lambda's packages and has it
//! fork the helper into the sandbox (see `runtime/zygote.py`); without, [`spawn`] clones the helper
//! into the sandbox and execs python3. Either way the helper then gets its lambda's
//! environment and package paths, loads the lambda and says hello.

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;

use crate::backend::{Backend, Counters, Sandbox};
use crate::cgroup::{Cgroup, CgroupPool, Limits};
use crate::channel::{Channel, Endpoint, Hello, Reply, Request};
use crate::error::{helper_failed, Doing, PlatformError};
use crate::import_cache::{accept_and_place, ImportCache, Node, NodeUse};
use crate::mounts;
use crate::output::OutputPipe;
use crate::process::{spawn, PidFd, SpawnSpec};
use crate::session::{handler_kind, Calls, Session};
use crate::session_methods;
use crate::spec::{sandbox_env, BackendStats, CreateError, InvokeError, Package, SandboxSpec};
use crate::stage::{Stage, HELPER_IN_SANDBOX};

/// Settings shared by the lean backends.
#[derive(Debug, Clone)]
pub struct LeanConfig {
    /// The user handlers run as.
    pub uid: u32,
    pub gid: u32,
    pub mount_proc: bool,
    pub scratch_mb: u64,
    /// The interpreter inside the base.
    pub python: String,
    pub start_timeout: Duration,
    /// Largest response body a handler may send, in bytes.
    pub max_response: u32,
    /// Limits of each Zygote's own cgroup.
    pub zygote_limits: Limits,
    /// Filter handlers' system calls (`seccomp`).
    pub seccomp: bool,
}

/// What provisioning a helper yields.
struct Provisioned {
    channel: Channel,
    process: Option<PidFd>,
    hello: Hello,
    hold: Option<NodeUse>,
    output: OutputPipe,
}

/// Why provisioning failed, and the Zygote the helper came from (if it came from one): a
/// Zygote that died meanwhile took its children with it, and is worth one more try.
struct Unprovisioned {
    error: CreateError,
    source: Option<Arc<Node>>,
}

impl<E: Into<CreateError>> From<E> for Unprovisioned {
    fn from(error: E) -> Unprovisioned {
        Unprovisioned { error: error.into(), source: None }
    }
}

/// The `sock` and `sock-nozygote` back-ends.
pub struct SockBackend {
    lean: Arc<Lean>,
}

/// What the back-end and its sandboxes share: a sandbox gives its slot and cgroup back here.
struct Lean {
    cfg: LeanConfig,
    stage: Arc<Stage>,
    pool: Arc<CgroupPool>,
    /// The Zygotes (`sock`); none for `sock-nozygote`.
    zygotes: Option<Arc<ImportCache>>,
    free_slots: Mutex<Vec<usize>>,
    next_slot: AtomicUsize,
    next_id: AtomicU64,
    counters: Counters,
}

/// A lean sandbox: its session, its slot (root directory) and its cgroup.
struct LeanSandbox {
    session: Session,
    slot: usize,
    cgroup: Cgroup,
    lean: Arc<Lean>,
    /// The package Zygote it was forked from and its lambda's packages: what it reports
    /// loading may call for a fuller Zygote.
    learning: Option<(Arc<Node>, Vec<Package>)>,
}

impl SockBackend {
    pub fn new(cfg: LeanConfig, stage: Arc<Stage>, pool: Arc<CgroupPool>, zygotes: Option<Arc<ImportCache>>) -> SockBackend {
        let lean = Lean {
            cfg,
            stage,
            pool,
            zygotes,
            free_slots: Mutex::new(Vec::new()),
            next_slot: AtomicUsize::new(0),
            next_id: AtomicU64::new(1),
            counters: Counters::default(),
        };
        SockBackend { lean: Arc::new(lean) }
    }

    /// Start the root Zygote now rather than on the first request.
    pub async fn start(&self) -> Result<(), CreateError> {
        if let Some(zygotes) = &self.lean.zygotes {
            zygotes.root().await?;
        }
        Ok(())
    }
}

impl Lean {
    fn take_slot(&self) -> usize {
        self.free_slots.lock().unwrap().pop().unwrap_or_else(|| self.next_slot.fetch_add(1, Ordering::Relaxed))
    }

    /// Kill a sandbox's processes and return its slot and cgroup. Killing the helper, PID 1
    /// of the sandbox's namespace, makes the kernel kill everything else in it; the cgroup
    /// sweep (which freezes the group on v1, a costly system-wide operation) is the fallback.
    async fn release(&self, slot: usize, root: PathBuf, cgroup: Cgroup, process: Option<PidFd>) {
        let _ = cgroup.set_frozen(false); // a paused sandbox cannot die
        match &process {
            Some(p) => {
                p.kill();
                p.exited(Duration::from_secs(2)).await;
                p.reap();
            }
            None => cgroup.kill_all(),
        }
        let empty = cgroup.procs().is_empty() || cgroup.wait_empty(Duration::from_secs(5)).await;
        // Unmounting waits for an RCU grace period: keep it off the async threads.
        let unmounted = tokio::task::spawn_blocking(move || mounts::detach(&root).map_err(|e| (e, root))).await;
        if let Ok(Err((e, root))) = unmounted {
            tracing::warn!("unmounting sandbox root {}: {e}", root.display());
        }
        if empty {
            self.pool.release(cgroup);
        } else {
            tracing::warn!(cgroup = %cgroup.name, "processes survived SIGKILL; the cgroup is retired");
        }
        self.free_slots.lock().unwrap().push(slot);
    }

    /// Stitch a root, take a cgroup, provision the helper and wait for its hello. A helper
    /// lost because its Zygote died (a Zygote is PID 1 of the namespace its children live
    /// in, so they die with it) is provisioned once more from what is chosen then.
    async fn make(self: &Arc<Self>, spec: &SandboxSpec) -> Result<LeanSandbox, CreateError> {
        let failed = match self.make_once(spec).await {
            Ok(sandbox) => return Ok(sandbox),
            Err(failed) => failed,
        };
        match (&self.zygotes, failed.source) {
            (Some(zygotes), Some(source)) if zygotes.lost(&source).await => {
                tracing::warn!(zygote = source.id, "a sandbox's helper died with its Zygote ({}); provisioning it again", failed.error);
                self.make_once(spec).await.map_err(|f| f.error)
            }
            _ => Err(failed.error),
        }
    }

    async fn make_once(self: &Arc<Self>, spec: &SandboxSpec) -> Result<LeanSandbox, Unprovisioned> {
        let started = Instant::now();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let slot = self.take_slot();
        let root = match self.stage.slot_root(slot) {
            Ok(r) => r,
            Err(e) => {
                self.free_slots.lock().unwrap().push(slot);
                return Err(PlatformError::io(format!("making the root of slot {slot}"), e).into());
            }
        };
        if let Err(e) = self.stage.stitch(&root, Some(&spec.code_dir), self.cfg.scratch_mb, self.cfg.uid, self.cfg.gid) {
            self.free_slots.lock().unwrap().push(slot);
            return Err(PlatformError::Path { doing: "stitching the sandbox's root".into(), path: root, error: e }.into());
        }
        let cgroup = match self.pool.acquire(&spec.limits) {
            Ok(c) => c,
            Err(e) => {
                let _ = mounts::detach(&root);
                self.free_slots.lock().unwrap().push(slot);
                return Err(PlatformError::io("taking a cgroup from the pool", e).into());
            }
        };
        let view = cgroup.view();
        let prepared = started.elapsed();
        let provisioned = match self.provision(id, spec, &root, &cgroup).await {
            Ok(p) => p,
            Err(e) => {
                self.release(slot, root, cgroup, None).await;
                return Err(e);
            }
        };
        let Provisioned { channel, process, hello, hold, output } = provisioned;
        tracing::debug!(sandbox = id, stitch_us = prepared.as_micros() as u64, total_us = started.elapsed().as_micros() as u64, "made");
        // Learn what the lambda loaded of its packages; a Zygote holding exactly them but not
        // all of that is replaced in the background from now on.
        let learning = match (&self.zygotes, &hold) {
            (Some(_), Some(hold)) if !hold.node().is_root() => Some((hold.node().clone(), spec.packages.clone())),
            _ => None,
        };
        if let (Some(zygotes), Some(report)) = (&self.zygotes, &hello.package_modules) {
            zygotes.learn(report);
            if let Some((node, packages)) = &learning {
                zygotes.refresh_after_learning(node, packages);
            }
        }
        match handler_kind(hello) {
            Ok(kind) => {
                let mut attached = spec.attachments();
                if let Some(hold) = hold {
                    attached.push(Box::new(hold));
                }
                let session = Session::new(id, kind, started.elapsed(), channel, process, Some(view), spec.limits, attached, Some(output));
                Ok(LeanSandbox { session, slot, cgroup, lean: self.clone(), learning })
            }
            Err(load_error) => {
                self.release(slot, root, cgroup, process).await;
                Err(load_error.into())
            }
        }
    }

    async fn provision(&self, id: u64, spec: &SandboxSpec, root: &Path, cgroup: &Cgroup) -> Result<Provisioned, Unprovisioned> {
        let t0 = Instant::now();
        let endpoint = Endpoint::listen_in(&root.join("host"))?;
        let (output, log) = OutputPipe::new(id, spec.output_sink()).doing("making the sandbox's log pipe")?;
        let netns = spec.network.as_ref().map(|n| n.fd());
        let (forked, hold, tree) = match &self.zygotes {
            Some(zygotes) => {
                zygotes.hint(&spec.packages, &spec.imports);
                let mut attempt = 0;
                loop {
                    let source = zygotes.source_for(&spec.packages, spec.shared_code.as_ref()).await?;
                    match zygotes.fork_handler(&source.node, root, &log, cgroup, self.cfg.mount_proc, netns).await {
                        Ok(f) => break (f.process, Some(f.hold), f.tree),
                        // The Zygote died under us: choose again (it is gone from the tree).
                        Err(e) if attempt == 0 => {
                            tracing::warn!("forking from Zygote {}: {e}; retrying", source.node.id)
                        }
                        Err(e) => return Err(e.into()),
                    }
                    attempt += 1;
                }
            }
            None => {
                let argv = [self.cfg.python.clone(), "-I".into(), "-S".into(), HELPER_IN_SANDBOX.into(), "handler".into()];
                let process = spawn(&SpawnSpec {
                    root,
                    cgroup_procs: cgroup.procs_fds(),
                    new_namespaces: true,
                    new_network: false,
                    netns: spec.network.as_ref().map(|n| n.fd()),
                    seccomp: self.cfg.seccomp,
                    mount_proc: self.cfg.mount_proc,
                    hostname: Some("sandbox"),
                    user: Some((self.cfg.uid, self.cfg.gid)),
                    argv: &argv,
                    env: &sandbox_env(&spec.env),
                    output: Some(log.as_raw_fd()),
                    workdir: None,
                })
                .doing(format!("running {} for the sandbox's helper", self.cfg.python))?;
                (Some(process), None, None)
            }
        };
        drop(log);
        let source = hold.as_ref().map(|h| h.node().clone());
        // Wait for the helper to connect and say hello.
        let connected = async {
            let forked_at = t0.elapsed();
            let (mut channel, process) = match forked {
                Some(process) => {
                    let channel = tokio::select! {
                        accepted = endpoint.accept(self.cfg.start_timeout, self.cfg.max_response) => accepted?.0,
                        dead = process.exited(self.cfg.start_timeout) => return Err(helper_failed(dead, self.cfg.start_timeout).into()),
                    };
                    (channel, process)
                }
                // Forked by a package Zygote: the kernel says who connected; we place it.
                None => accept_and_place(endpoint, cgroup, self.cfg.start_timeout, self.cfg.max_response).await?,
            };
            drop(tree); // the handler holds its root now: closing ours is not the last reference
            let connected_at = t0.elapsed();
            let hello = channel.handshake(&spec.env, &spec.paths, self.cfg.start_timeout).await;
            if let (Some(zygotes), Some(hold)) = (&self.zygotes, &hold) {
                zygotes.replenish(hold); // now that this handler no longer competes with it
            }
            let hello = hello?;
            tracing::debug!(
                sandbox = id,
                fork_us = forked_at.as_micros() as u64,
                connect_us = (connected_at - forked_at).as_micros() as u64,
                load_us = (t0.elapsed() - connected_at).as_micros() as u64,
                "provisioned"
            );
            Ok(Provisioned { channel, process: Some(process), hello, hold, output })
        };
        connected.await.map_err(|error| Unprovisioned { error, source })
    }
}

#[async_trait]
impl Backend for SockBackend {
    fn name(&self) -> &'static str {
        if self.lean.zygotes.is_some() {
            "sock"
        } else {
            "sock-nozygote"
        }
    }

    async fn create(&self, spec: &SandboxSpec) -> Result<Box<dyn Sandbox>, CreateError> {
        let result = self.lean.make(spec).await;
        self.lean.counters.record(&result);
        Ok(Box::new(result?))
    }

    fn stats(&self) -> BackendStats {
        let pool = self.lean.pool.stats();
        BackendStats {
            cgroups_created: pool.created,
            cgroups_reused: pool.reused,
            zygote_restarts: self
                .lean
                .zygotes
                .as_ref()
                .and_then(|z| z.counters().into_iter().find(|c| c.0 == "sprout_zygote_restarts").map(|c| c.2))
                .unwrap_or(0),
            ..self.lean.counters.stats()
        }
    }

    async fn shutdown(&self) {
        if let Some(zygotes) = &self.lean.zygotes {
            zygotes.shutdown().await;
        }
    }

    fn import_cache(&self) -> Option<Arc<ImportCache>> {
        self.lean.zygotes.clone()
    }

    fn memory_group(&self) -> Option<(Arc<crate::cgroup::Layout>, String)> {
        Some((self.lean.pool.layout().clone(), self.lean.pool.parent().to_string()))
    }
}

#[async_trait]
impl Sandbox for LeanSandbox {
    session_methods!();

    fn cpu_control(&self) -> Option<crate::cgroup::CpuControl> {
        self.cgroup.cpu_control()
    }

    async fn invoke(
        &mut self,
        request: &Request,
        body: &[u8],
        timeout: Duration,
        calls: &dyn Calls,
    ) -> Result<(Reply, Bytes), InvokeError> {
        let reply = self.session.invoke(request, body, timeout, calls).await?;
        // The package modules its handler imported on first use: what a Zygote could import ahead.
        if let (Some(report), Some(zygotes)) = (&reply.0.package_modules, &self.lean.zygotes) {
            zygotes.learn(report);
            if let Some((node, packages)) = &self.learning {
                zygotes.refresh_after_learning(node, packages);
            }
        }
        Ok(reply)
    }

    fn pause(&self) -> std::io::Result<bool> {
        self.cgroup.set_frozen(true).map(|_| true)
    }

    fn resume(&self) -> std::io::Result<()> {
        self.cgroup.set_frozen(false)
    }

    fn killed_while_paused(&self) -> bool {
        self.session.process.as_ref().is_some_and(|p| p.sigkill_pending())
    }

    fn memory_bytes(&self) -> u64 {
        self.cgroup.memory_in_use()
    }

    async fn destroy(self: Box<Self>) {
        let LeanSandbox { session, slot, cgroup, lean, .. } = *self;
        let Session { channel, process, attached, .. } = session;
        drop(channel);
        let root = lean.stage.slot_root_path(slot);
        lean.release(slot, root, cgroup, process).await;
        lean.counters.destroyed();
        drop(attached); // its Zygote's use count, its packages: only now that nothing runs
    }
}
