//! SOCK's lean sandboxes (section 4.1) provisioned by a Zygote (section 4.2), and the
//! `sock-nozygote` variant that starts a fresh interpreter in each one.
//!
//! A sandbox is a slot directory whose root is stitched from bind mounts ([`Stage::stitch`]),
//! a cgroup from the pool, and a helper process that is PID 1 of new PID, IPC and UTS
//! namespaces, chrooted into the root, running as an unprivileged user. With a Zygote the
//! worker sends the root Zygote descriptors of the new root, a log pipe and the cgroup's
//! cgroup.procs files; the Zygote forks the helper into them (see `helper.py`). Without one,
//! [`spawn`] clones the helper into the sandbox and execs python3.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;

use crate::backend::{handler_kind, sandbox_env, Backend, BackendStats, Counters, CreateError, Resources, Sandbox, SandboxSpec};
use crate::cgroup::{Cgroup, CgroupPool, Limits};
use crate::channel::{Channel, Endpoint, Hello};
use crate::mounts;
use crate::output::log_pipe;
use crate::process::{spawn, PidFd, SpawnSpec};
use crate::stage::{Stage, HELPER_IN_SANDBOX};

/// Settings shared by the lean backends.
#[derive(Debug, Clone)]
pub struct LeanConfig {
    /// Provision from a Zygote (`sock`) or exec a fresh interpreter (`sock-nozygote`).
    pub zygote: bool,
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
    /// Limits of the Zygote's own cgroup.
    pub zygote_limits: Limits,
}

/// The root Zygote: an initialized interpreter in its own sandbox.
struct Zygote {
    channel: Channel,
    process: PidFd,
    cgroup: Cgroup,
    root: PathBuf,
}

/// A fork request to the Zygote's C loop (`struct fork_request` in csrc/zygote.c).
fn fork_request(uid: u32, gid: u32, mount_proc: bool) -> [u8; 16] {
    const FORK_MAGIC: u32 = 0x4652_5053; // "SPRF"
    let mut buf = [0u8; 16];
    for (i, v) in [FORK_MAGIC, uid, gid, mount_proc as u32].into_iter().enumerate() {
        buf[i * 4..i * 4 + 4].copy_from_slice(&v.to_ne_bytes());
    }
    buf
}

pub struct SockBackend {
    cfg: LeanConfig,
    stage: Arc<Stage>,
    pool: Arc<CgroupPool>,
    free_slots: Mutex<Vec<usize>>,
    next_slot: AtomicUsize,
    next_id: AtomicU64,
    zygote: tokio::sync::Mutex<Option<Zygote>>,
    counters: Counters,
    zygote_restarts: AtomicU64,
}

impl SockBackend {
    pub fn new(cfg: LeanConfig, stage: Arc<Stage>, pool: Arc<CgroupPool>) -> SockBackend {
        SockBackend {
            cfg,
            stage,
            pool,
            free_slots: Mutex::new(Vec::new()),
            next_slot: AtomicUsize::new(0),
            next_id: AtomicU64::new(1),
            zygote: tokio::sync::Mutex::new(None),
            counters: Counters::default(),
            zygote_restarts: AtomicU64::new(0),
        }
    }

    /// Start the root Zygote now rather than on the first request.
    pub async fn start(&self) -> Result<(), CreateError> {
        if self.cfg.zygote {
            let mut guard = self.zygote.lock().await;
            if guard.is_none() {
                *guard = Some(self.start_zygote().await?);
            }
        }
        Ok(())
    }

    fn take_slot(&self) -> usize {
        self.free_slots.lock().unwrap().pop().unwrap_or_else(|| self.next_slot.fetch_add(1, Ordering::Relaxed))
    }

    async fn start_zygote(&self) -> Result<Zygote, CreateError> {
        let root = self.stage.run.join("zygote").join("root");
        std::fs::create_dir_all(&root).map_err(CreateError::platform)?;
        let _ = mounts::detach(&root);
        self.stage.stitch(&root, None, 16, 0, 0).map_err(CreateError::platform)?;
        let result = async {
            let endpoint = Endpoint::listen_in(&root.join("host")).map_err(CreateError::platform)?;
            let mut cgroup = Cgroup::create(self.pool.layout().clone(), &format!("{}/zygote", self.pool.parent()))
                .map_err(CreateError::platform)?;
            cgroup.set_limits(&self.cfg.zygote_limits).map_err(CreateError::platform)?;
            let procs = cgroup.procs_fds();
            let log = log_pipe("<zygote>", 0).map_err(CreateError::platform)?;
            let argv = [self.cfg.python.clone(), "-I".into(), "-S".into(), HELPER_IN_SANDBOX.into(), "zygote".into()];
            let env = sandbox_env(&[]);
            let process = spawn(&SpawnSpec {
                root: &root,
                cgroup_procs: procs,
                new_namespaces: true,
                mount_proc: false,
                hostname: Some("zygote"),
                user: None,
                argv: &argv,
                env: &env,
                output: Some(log.as_raw_fd()),
            })
            .map_err(CreateError::platform)?;
            drop(log);
            let (mut channel, _) = match endpoint.accept(self.cfg.start_timeout, 1 << 20).await {
                Ok(c) => c,
                Err(e) => {
                    process.kill();
                    process.reap();
                    return Err(CreateError::platform(format!("the Zygote did not start: {e}")));
                }
            };
            let hello: Hello = channel.recv().await.map(|(h, _)| h).map_err(CreateError::platform)?;
            if hello.role.as_deref() != Some("zygote") {
                process.kill();
                return Err(CreateError::platform(format!("the Zygote said {hello:?}")));
            }
            tracing::info!(pid = process.pid(), "root Zygote ready");
            Ok(Zygote { channel, process, cgroup, root: root.clone() })
        }
        .await;
        if result.is_err() {
            let _ = mounts::detach(&root);
        }
        result
    }

    async fn stop_zygote(&self, z: Zygote) {
        z.process.kill();
        z.cgroup.kill_all();
        z.process.exited(Duration::from_secs(2)).await;
        z.process.reap();
        z.cgroup.wait_empty(Duration::from_secs(5)).await;
        let _ = mounts::detach(&z.root);
        let _ = z.cgroup.remove();
    }

    /// Ask the Zygote to fork a helper into the sandbox at `root`; returns a pidfd of it.
    /// A Zygote that died is replaced, once per request.
    async fn fork_from_zygote(&self, root: &std::path::Path, log: &OwnedFd, procs: &[OwnedFd]) -> Result<PidFd, CreateError> {
        let root_dir = std::fs::File::open(root).map_err(CreateError::platform)?;
        let mut fds = vec![root_dir.as_raw_fd(), log.as_raw_fd()];
        fds.extend(procs.iter().map(|f| f.as_raw_fd()));
        let request = fork_request(self.cfg.uid, self.cfg.gid, self.cfg.mount_proc);
        let mut guard = self.zygote.lock().await;
        for attempt in 0..2 {
            if guard.is_none() {
                *guard = Some(self.start_zygote().await?);
                if attempt > 0 {
                    self.zygote_restarts.fetch_add(1, Ordering::Relaxed);
                }
            }
            let z = guard.as_mut().unwrap();
            let exchange = async {
                z.channel.send_raw_with_fds(&request, &fds).await?;
                let mut reply = [0u8; 8];
                let pidfds = z.channel.recv_raw_with_fds(&mut reply).await?;
                Ok::<_, std::io::Error>((i32::from_ne_bytes(reply[..4].try_into().unwrap()), pidfds))
            };
            match tokio::time::timeout(self.cfg.start_timeout, exchange).await {
                Ok(Ok((0, mut pidfds))) if pidfds.len() == 1 => {
                    return PidFd::from_fd(pidfds.remove(0)).map_err(CreateError::platform)
                }
                Ok(Ok((errno, _))) => {
                    let e = std::io::Error::from_raw_os_error(errno);
                    return Err(CreateError::platform(format!("the Zygote could not fork: {e}")));
                }
                Ok(Err(e)) => tracing::warn!("the root Zygote died ({e}); starting a new one"),
                Err(_) => tracing::warn!("the root Zygote stopped answering; starting a new one"),
            }
            if let Some(dead) = guard.take() {
                self.stop_zygote(dead).await;
            }
        }
        Err(CreateError::platform("the root Zygote failed twice in a row"))
    }

    /// Kill a sandbox's processes and return its slot and cgroup. Killing the helper, PID 1
    /// of the sandbox's namespace, makes the kernel kill everything else in it; the cgroup
    /// sweep (which freezes the group on v1, a costly system-wide operation) is the fallback.
    async fn release(&self, slot: usize, root: PathBuf, cgroup: Cgroup, process: Option<PidFd>) {
        match &process {
            Some(p) => {
                p.kill();
                p.exited(Duration::from_secs(2)).await;
                p.reap();
            }
            None => cgroup.kill_all(),
        }
        let empty = cgroup.procs().is_empty() || cgroup.wait_empty(Duration::from_secs(5)).await;
        if let Err(e) = mounts::detach(&root) {
            tracing::warn!("unmounting sandbox root {}: {e}", root.display());
        }
        if empty {
            self.pool.release(cgroup);
        } else {
            tracing::warn!(cgroup = %cgroup.name, "processes survived SIGKILL; the cgroup is retired");
        }
        self.free_slots.lock().unwrap().push(slot);
    }

    /// Stitch a root, take a cgroup, provision the helper and wait for its hello.
    async fn make(&self, spec: &SandboxSpec) -> Result<Sandbox, CreateError> {
        let started = Instant::now();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let slot = self.take_slot();
        let root = match self.stage.slot_root(slot) {
            Ok(r) => r,
            Err(e) => {
                self.free_slots.lock().unwrap().push(slot);
                return Err(CreateError::platform(e));
            }
        };
        if let Err(e) = self.stage.stitch(&root, Some(&spec.code_dir), self.cfg.scratch_mb, self.cfg.uid, self.cfg.gid) {
            self.free_slots.lock().unwrap().push(slot);
            return Err(CreateError::platform(e));
        }
        let cgroup = match self.pool.acquire(&spec.limits) {
            Ok(c) => c,
            Err(e) => {
                let _ = mounts::detach(&root);
                self.free_slots.lock().unwrap().push(slot);
                    return Err(CreateError::platform(e));
            }
        };
        let view = cgroup.view();
        match self.provision(id, spec, &root, &cgroup).await {
            Ok((channel, process, hello)) => {
                match handler_kind(hello) {
                    Ok(kind) => {
                        Ok(Sandbox {
                            id,
                            lambda: spec.lambda.clone(),
                            kind,
                            created: Instant::now(),
                            startup: started.elapsed(),
                            channel,
                            process,
                            cgroup_path: Some(view),
                            limits: spec.limits,
                            resources: Resources::Lean { slot, cgroup },
                            tainted: false,
                        })
                    }
                    Err(load_error) => {
                        self.release(slot, root, cgroup, process).await;
                        Err(load_error)
                    }
                }
            }
            Err(e) => {
                    self.release(slot, root, cgroup, None).await;
                Err(e)
            }
        }
    }

    async fn provision(&self, id: u64, spec: &SandboxSpec, root: &std::path::Path, cgroup: &Cgroup) -> Result<(Channel, Option<PidFd>, Hello), CreateError> {
        let endpoint = Endpoint::listen_in(&root.join("host")).map_err(CreateError::platform)?;
        let procs = cgroup.procs_fds();
        let log = log_pipe(&spec.lambda, id).map_err(CreateError::platform)?;
        let env = sandbox_env(&spec.env);
        let process = if self.cfg.zygote {
            self.fork_from_zygote(root, &log, procs).await?
        } else {
            let argv = [self.cfg.python.clone(), "-I".into(), "-S".into(), HELPER_IN_SANDBOX.into(), "handler".into()];
            spawn(&SpawnSpec {
                    root,
                    cgroup_procs: procs,
                    new_namespaces: true,
                    mount_proc: self.cfg.mount_proc,
                    hostname: Some("sandbox"),
                    user: Some((self.cfg.uid, self.cfg.gid)),
                    argv: &argv,
                    env: &env,
                    output: Some(log.as_raw_fd()),
            })
            .map_err(CreateError::platform)?
        };
        drop(log);
        let died = |dead: bool| {
            CreateError::platform(if dead {
                "the sandbox's helper exited during setup (its output is in the worker log)"
            } else {
                "the sandbox's helper did not start in time"
            })
        };
        let mut channel = tokio::select! {
            accepted = endpoint.accept(self.cfg.start_timeout, self.cfg.max_response) => {
                accepted.map_err(CreateError::platform)?.0
            }
            dead = process.exited(self.cfg.start_timeout) => return Err(died(dead)),
        };
        let hello = channel.handshake(&spec.env, self.cfg.start_timeout).await.map_err(CreateError::platform)?;
        Ok((channel, Some(process), hello))
    }
}

#[async_trait]
impl Backend for SockBackend {
    fn name(&self) -> &'static str {
        if self.cfg.zygote {
            "sock"
        } else {
            "sock-nozygote"
        }
    }

    async fn create(&self, spec: &SandboxSpec) -> Result<Sandbox, CreateError> {
        let result = self.make(spec).await;
        self.counters.record(&result);
        result
    }

    async fn destroy(&self, sandbox: Sandbox) {
        let Sandbox { resources, process, channel, .. } = sandbox;
        drop(channel);
        if let Resources::Lean { slot, cgroup } = resources {
            let root = self.stage.run.join("sb").join(slot.to_string()).join("root");
            self.release(slot, root, cgroup, process).await;
            self.counters.destroyed();
        }
    }

    fn stats(&self) -> BackendStats {
        let pool = self.pool.stats();
        BackendStats {
            cgroups_created: pool.created,
            cgroups_reused: pool.reused,
            zygote_restarts: self.zygote_restarts.load(Ordering::Relaxed),
            ..self.counters.stats()
        }
    }

    async fn shutdown(&self) {
        if let Some(z) = self.zygote.lock().await.take() {
            self.stop_zygote(z).await;
        }
    }
}
