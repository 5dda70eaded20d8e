//! The `vm` back-end: every sandbox is a KVM microVM run by its own `sprout-vmm` process
//! (crates/vmm), booting the guest kernel ([`super::kernel`]) on the read-only root disk
//! ([`super::rootfs`]), whose init starts the helper in its `vm` role. The worker reaches the
//! helper through the VM's vsock socket (`CONNECT 1024`), sends the lambda's code as the first
//! frame (it lands in the guest's /handler, a tmpfs), and from then on speaks the channel
//! protocol every sandbox speaks. Destroying a sandbox kills its VMM: nothing of the guest
//! outlives the process.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

use crate::backend::{Backend, Counters, Sandbox};
use crate::channel::{Channel, Reply, Request};
use crate::error::{helper_failed, Doing, PlatformError};
use crate::output::log_pipe;
use crate::process::PidFd;
use crate::scratch::remove_dir;
use crate::session::{handler_kind, Calls, Session};
use crate::session_methods;
use crate::spec::{sandbox_env, BackendStats, CreateError, InvokeError, SandboxSpec};
use crate::stage::{Stage, HELPER_IN_SANDBOX};

/// The guest port the helper listens on.
pub const HELPER_PORT: u32 = 1024;
/// Largest lambda code a VM takes (its /handler tmpfs is 64 MiB).
const MAX_CODE_BYTES: u64 = 48 << 20;
/// Guest memory below which CPython and the kernel do not fit.
const MIN_MEMORY_MIB: u64 = 96;

/// Settings of the vm back-end.
#[derive(Debug, Clone)]
pub struct VmBackendConfig {
    /// The `sprout-vmm` program.
    pub vmm: PathBuf,
    pub kernel: PathBuf,
    pub root_disk: PathBuf,
    /// The interpreter inside the guest.
    pub python: String,
    pub start_timeout: Duration,
    pub max_response: u32,
}

/// The `vm` back-end.
pub struct VmBackend {
    inner: Arc<Inner>,
}

struct Inner {
    cfg: VmBackendConfig,
    stage: Arc<Stage>,
    next_id: AtomicU64,
    counters: Counters,
}

/// One microVM and its helper.
struct VmSandbox {
    session: Session,
    dir: PathBuf,
    inner: Arc<Inner>,
}

impl VmBackend {
    pub fn new(cfg: VmBackendConfig, stage: Arc<Stage>) -> VmBackend {
        VmBackend { inner: Arc::new(Inner { cfg, stage, next_id: AtomicU64::new(1), counters: Counters::default() }) }
    }
}

/// The lambda's code as the helper's first frame: each regular file's path, size and mode,
/// and their contents one after another.
pub fn code_frame(code_dir: &Path) -> std::io::Result<(serde_json::Value, Vec<u8>)> {
    let mut files = Vec::new();
    let mut body = Vec::new();
    let mut stack = vec![code_dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let mut entries: Vec<_> = std::fs::read_dir(&dir)?.flatten().collect();
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let kind = entry.file_type()?;
            let path = entry.path();
            if kind.is_dir() {
                stack.push(path);
            } else if kind.is_file() {
                let meta = entry.metadata()?;
                if body.len() as u64 + meta.len() > MAX_CODE_BYTES {
                    return Err(std::io::Error::other(format!("the lambda's code is over {} MiB", MAX_CODE_BYTES >> 20)));
                }
                let relative = path.strip_prefix(code_dir).unwrap_or(&path).to_string_lossy().to_string();
                let contents = std::fs::read(&path)?;
                files.push(json!([relative, contents.len(), meta.permissions().mode() & 0o777]));
                body.extend_from_slice(&contents);
            }
        }
    }
    Ok((json!({"op": "code", "files": files}), body))
}

impl Inner {
    /// Start the VMM for sandbox `id` in `dir`.
    fn start_vmm(&self, id: u64, dir: &Path, spec: &SandboxSpec) -> Result<std::process::Child, CreateError> {
        let memory_mib = (spec.limits.memory_bytes >> 20).max(MIN_MEMORY_MIB);
        let log = log_pipe(&spec.lambda, id).doing("making the sandbox's log pipe")?;
        let err = log.try_clone().doing("duplicating the log pipe")?;
        let cmdline = format!("quiet init=/sbin/sprout-init -- {} -I -S {HELPER_IN_SANDBOX} vm", self.cfg.python);
        let child = std::process::Command::new(&self.cfg.vmm)
            .arg("--kernel")
            .arg(&self.cfg.kernel)
            .arg("--disk")
            .arg(&self.cfg.root_disk)
            .arg("--vsock")
            .arg(dir.join("vsock.sock"))
            .arg("--console")
            .arg(dir.join("console.log"))
            .arg("--memory-mib")
            .arg(memory_mib.to_string())
            .arg("--cmdline")
            .arg(cmdline)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(err))
            .spawn()
            .map_err(|error| PlatformError::Path { doing: "starting the VMM".into(), path: self.cfg.vmm.clone(), error })?;
        Ok(child)
    }

    /// Boot a VM and wait for its helper to load the lambda.
    async fn provision(
        self: &Arc<Self>,
        id: u64,
        dir: &Path,
        spec: &SandboxSpec,
        vmm: &mut Option<PidFd>,
    ) -> Result<VmSandbox, CreateError> {
        let started = Instant::now();
        tokio::fs::create_dir_all(dir).await.at("making the VM's directory", dir)?;
        let (code_header, code_body) = code_frame(&spec.code_dir).at("reading the lambda's code", &spec.code_dir)?;
        let child = self.start_vmm(id, dir, spec)?;
        // Watched, killed and reaped through its pidfd from here on.
        *vmm = PidFd::open(child.id() as i32).ok();
        let socket = dir.join("vsock.sock");
        let connect = connect_helper(&socket, self.cfg.start_timeout);
        let stream = match vmm.as_ref() {
            Some(p) => tokio::select! {
                stream = connect => stream?,
                dead = p.exited(self.cfg.start_timeout) => return Err(helper_failed(dead, self.cfg.start_timeout).into()),
            },
            None => connect.await?,
        };
        let mut channel = Channel::new(stream, self.cfg.max_response);
        channel.send(&code_header, &code_body).await.doing("sending the lambda's code to the VM")?;
        let hello = channel.handshake(&sandbox_env(&spec.env), &spec.paths, self.cfg.start_timeout).await?;
        let kind = handler_kind(hello)?;
        // The guest's output reaches the worker's log through the VMM's console (no request
        // boundaries to settle on).
        let session = Session::new(id, kind, started.elapsed(), channel, vmm.take(), None, spec.limits, spec.attachments(), None);
        Ok(VmSandbox { session, dir: dir.to_path_buf(), inner: self.clone() })
    }

    async fn remove(&self, dir: &Path, vmm: Option<&PidFd>) {
        if let Some(vmm) = vmm {
            vmm.kill();
            vmm.exited(Duration::from_secs(2)).await;
            vmm.reap();
        }
        remove_dir(dir).await;
    }
}

/// Connect to the helper's vsock port through the VMM's socket, retrying while the VMM has
/// not made its socket yet or the guest is not listening (it resets the connection).
async fn connect_helper(socket: &Path, timeout: Duration) -> Result<UnixStream, PlatformError> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(mut stream) = UnixStream::connect(socket).await {
            stream.write_all(format!("CONNECT {HELPER_PORT}\n").as_bytes()).await.doing("asking the VMM for the helper's port")?;
            let mut reader = BufReader::new(stream);
            let mut line = String::new();
            if reader.read_line(&mut line).await.is_ok() && line.starts_with("OK ") {
                // The VMM writes nothing after its line until the guest does.
                return Ok(reader.into_inner());
            }
        }
        if Instant::now() >= deadline {
            return Err(PlatformError::timed_out("the VM's helper", "listen on vsock", timeout));
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

#[async_trait]
impl Backend for VmBackend {
    fn name(&self) -> &'static str {
        "vm"
    }

    async fn create(&self, spec: &SandboxSpec) -> Result<Box<dyn Sandbox>, CreateError> {
        let inner = &self.inner;
        let id = inner.next_id.fetch_add(1, Ordering::Relaxed);
        let dir = inner.stage.run.join("vm").join(id.to_string());
        let mut vmm = None;
        let result = inner.provision(id, &dir, spec, &mut vmm).await;
        inner.counters.record(&result);
        if result.is_err() {
            inner.remove(&dir, vmm.as_ref()).await;
        }
        Ok(Box::new(result?))
    }

    fn stats(&self) -> BackendStats {
        self.inner.counters.stats()
    }

    async fn shutdown(&self) {
        remove_dir(&self.inner.stage.run.join("vm")).await;
    }
}

#[async_trait]
impl Sandbox for VmSandbox {
    session_methods!();

    async fn invoke(
        &mut self,
        request: &Request,
        body: &[u8],
        timeout: Duration,
        calls: &dyn Calls,
    ) -> Result<(Reply, Bytes), InvokeError> {
        self.session.invoke(request, body, timeout, calls).await
    }

    async fn destroy(self: Box<Self>) {
        let VmSandbox { session, dir, inner } = *self;
        let Session { channel, process, attached, .. } = session;
        drop(channel);
        inner.remove(&dir, process.as_ref()).await;
        inner.counters.destroyed();
        drop(attached);
    }
}
