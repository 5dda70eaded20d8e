//! One-shot lean sandboxes: run one program (pip, for the install cache) in a sandbox of its
//! own, with its own cgroup limits, a time limit and extra bind mounts, and keep the tail of
//! what it printed.
//!
//! The root is stitched like a handler's (the read-only base, a tmpfs scratch at /host), plus
//! the binds of the [`OneshotSpec`]; the program runs as the unprivileged sandbox user in new
//! PID, IPC and UTS namespaces with its own /proc. Whatever happens — exit, time-out, the OOM
//! killer — everything it started is killed and its mounts and cgroup are removed before
//! [`run`] returns.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::AsyncReadExt;

use crate::cgroup::{Cgroup, Layout, Limits};
use crate::mounts;
use crate::process::{spawn, SpawnSpec};
use crate::stage::Stage;

/// Most output kept from a program (its last bytes).
const OUTPUT_TAIL: usize = 64 * 1024;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A host path made visible inside the sandbox.
#[derive(Debug, Clone)]
pub struct Bind {
    pub src: PathBuf,
    /// Absolute path inside the sandbox: an existing file or directory of the base, or a
    /// directory below /host (created on the scratch).
    pub dst: String,
    pub writable: bool,
}

/// What to run.
#[derive(Debug, Clone)]
pub struct OneshotSpec {
    /// Names the cgroup and the log lines.
    pub name: String,
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub binds: Vec<Bind>,
    pub limits: Limits,
    pub timeout: Duration,
    pub uid: u32,
    pub gid: u32,
    pub scratch_mb: u64,
    pub workdir: String,
}

/// How the program ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    Exited(i32),
    Signaled(i32),
    TimedOut,
    OutOfMemory,
}

#[derive(Debug, Clone)]
pub struct Outcome {
    pub ending: Ending,
    /// The last 64 KiB of stdout and stderr, interleaved as printed.
    pub output: String,
    pub elapsed: Duration,
}

impl Outcome {
    pub fn success(&self) -> bool {
        self.ending == Ending::Exited(0)
    }
}

/// Run `spec` in a fresh sandbox under `cgroup_parent` and wait for it.
pub async fn run(stage: &Stage, layout: Arc<Layout>, cgroup_parent: &str, spec: &OneshotSpec) -> io::Result<Outcome> {
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    let dir = stage.run.join("oneshot").join(id.to_string());
    let root = dir.join("root");
    std::fs::create_dir_all(&root)?;
    let stitched = stitch(stage, &root, spec);
    let result = match stitched {
        Ok(()) => {
            let cgroup_name = format!("{cgroup_parent}/oneshot-{id}");
            match Cgroup::create(layout, &cgroup_name) {
                Ok(mut cgroup) => {
                    let outcome = match cgroup.set_limits(&spec.limits) {
                        Ok(()) => execute(&root, &cgroup, spec).await,
                        Err(e) => Err(e),
                    };
                    cgroup.kill_all();
                    cgroup.wait_empty(Duration::from_secs(10)).await;
                    if let Err(e) = cgroup.remove() {
                        tracing::warn!("removing cgroup {cgroup_name}: {e}");
                    }
                    outcome
                }
                Err(e) => Err(e),
            }
        }
        Err(e) => Err(e),
    };
    if let Err(e) = mounts::detach(&root) {
        tracing::warn!("unmounting {}: {e}", root.display());
    }
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn stitch(stage: &Stage, root: &Path, spec: &OneshotSpec) -> io::Result<()> {
    stage.stitch(root, None, spec.scratch_mb, spec.uid, spec.gid)?;
    for bind in &spec.binds {
        let dst = root.join(bind.dst.trim_start_matches('/'));
        if bind.dst.starts_with("/host/") {
            std::fs::create_dir_all(&dst)?;
        }
        if bind.writable {
            mounts::bind(&bind.src, &dst, false)?;
        } else {
            mounts::bind_readonly(&bind.src, &dst, true)?;
        }
    }
    Ok(())
}

async fn execute(root: &Path, cgroup: &Cgroup, spec: &OneshotSpec) -> io::Result<Outcome> {
    let started = Instant::now();
    let (reader, writer) = pipe()?;
    let oom_before = cgroup.oom_kills();
    let argv = spec.argv.clone();
    let env = crate::spec::sandbox_env(&spec.env);
    let process = spawn(&SpawnSpec {
        root,
        cgroup_procs: cgroup.procs_fds(),
        new_namespaces: true,
        // pip must reach the package index: the host's network.
        new_network: false,
        netns: None,
        seccomp: true,
        mount_proc: true,
        hostname: Some("installer"),
        user: Some((spec.uid, spec.gid)),
        argv: &argv,
        env: &env,
        output: Some(writer.as_raw_fd()),
        workdir: Some(&spec.workdir),
    })?;
    drop(writer);
    let reading = tokio::spawn(read_tail(reader));
    let finished = process.exited(spec.timeout).await;
    if !finished {
        process.kill();
        cgroup.kill_all();
    }
    let status = process.wait_status().await;
    // The program's children may still hold the pipe open: stop them before reading on.
    cgroup.kill_all();
    let output = tokio::time::timeout(Duration::from_secs(10), reading).await.ok().and_then(|r| r.ok()).unwrap_or_default();
    let ending = if !finished {
        Ending::TimedOut
    } else if cgroup.oom_kills() > oom_before {
        Ending::OutOfMemory
    } else if libc::WIFEXITED(status) {
        Ending::Exited(libc::WEXITSTATUS(status))
    } else {
        Ending::Signaled(libc::WTERMSIG(status))
    };
    Ok(Outcome { ending, output, elapsed: started.elapsed() })
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: `fds` is a live array of two c_ints, exactly what pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded, so both are fresh descriptors that nothing else owns; each is
    // wrapped exactly once.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Read a pipe to its end, keeping the last [`OUTPUT_TAIL`] bytes.
async fn read_tail(reader: OwnedFd) -> String {
    // SAFETY: `reader` owns the descriptor and outlives the call; F_SETFL takes an int, no pointer.
    unsafe { libc::fcntl(reader.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) };
    let Ok(mut receiver) = tokio::net::unix::pipe::Receiver::from_owned_fd(reader) else {
        return String::new();
    };
    let mut tail: Vec<u8> = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        match receiver.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                tail.extend_from_slice(&chunk[..n]);
                if tail.len() > 2 * OUTPUT_TAIL {
                    tail.drain(..tail.len() - OUTPUT_TAIL);
                }
            }
        }
    }
    if tail.len() > OUTPUT_TAIL {
        tail.drain(..tail.len() - OUTPUT_TAIL);
    }
    String::from_utf8_lossy(&tail).into_owned()
}
