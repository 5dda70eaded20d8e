//! One Zygote as the worker sees it: a pre-initialized interpreter in a sandbox of its own,
//! and the fork protocol its C loop answers (csrc/zygote.c, `struct fork_request`).

use std::os::fd::{OwnedFd, RawFd};
use std::path::PathBuf;
use std::time::Duration;

use crate::cgroup::Cgroup;
use crate::channel::Channel;
use crate::mounts;
use crate::process::PidFd;

/// Mount a /proc of the child's own PID namespace.
pub const FLAG_MOUNT_PROC: u32 = 1;
/// The child becomes a Zygote rather than a handler.
pub const FLAG_ZYGOTE: u32 = 2;
/// The descriptors carry a user namespace (third) for the child to join.
pub const FLAG_USERNS: u32 = 4;
/// The descriptors carry a network namespace (after the user namespace, if any) for the
/// child to join.
pub const FLAG_NETNS: u32 = 8;
/// Fork a spare: a child bound to no sandbox yet, waiting on a link of its own (no
/// descriptors are sent; the reply carries the pidfd and the link).
pub const FLAG_SPARE: u32 = 16;

const FORK_MAGIC: u32 = 0x4652_5053; // "SPRF"

/// What the child becomes: its ids (inside the user namespace it ends up in) and flags.
#[derive(Debug, Clone, Copy)]
pub struct ForkRequest {
    pub uid: u32,
    pub gid: u32,
    pub flags: u32,
}

impl ForkRequest {
    pub(crate) fn encode(&self) -> [u8; 16] {
        let mut buf = [0u8; 16];
        for (i, v) in [FORK_MAGIC, self.uid, self.gid, self.flags].into_iter().enumerate() {
            buf[i * 4..i * 4 + 4].copy_from_slice(&v.to_ne_bytes());
        }
        buf
    }
}

/// Why a fork failed.
#[derive(Debug, thiserror::Error)]
pub enum ForkError {
    /// The Zygote answered with an error (it is still usable).
    #[error("the Zygote could not fork: {0}")]
    Refused(std::io::Error),
    /// The Zygote died or stopped answering (it is not).
    #[error("the Zygote stopped answering: {0}")]
    Broken(String),
}

/// A running Zygote: its channel, process, cgroup and root (stitched on the host).
pub struct ZygoteProcess {
    pub channel: Channel,
    pub process: PidFd,
    pub cgroup: Cgroup,
    /// The directory its root was stitched at (its own directory is the parent).
    pub root: PathBuf,
}

impl ZygoteProcess {
    /// Ask the Zygote to fork a child with descriptors `fds` ([root, log, (userns), (netns),
    /// cgroup procs...]); returns the pidfd it answers with.
    pub async fn fork(&mut self, request: ForkRequest, fds: &[RawFd], timeout: Duration) -> Result<PidFd, ForkError> {
        let mut reply = self.exchange(request, fds, timeout).await?;
        if reply.len() != 1 {
            return Err(ForkError::Broken(format!("a reply with {} descriptors rather than a pidfd", reply.len())));
        }
        PidFd::from_fd(reply.remove(0)).map_err(|e| ForkError::Broken(format!("a bad pidfd: {e}")))
    }

    /// Ask the Zygote to fork a spare; returns its pidfd and the link it waits on.
    pub async fn fork_spare(&mut self, timeout: Duration) -> Result<(PidFd, OwnedFd), ForkError> {
        let request = ForkRequest { uid: 0, gid: 0, flags: FLAG_SPARE };
        let mut reply = self.exchange(request, &[], timeout).await?;
        if reply.len() != 2 {
            return Err(ForkError::Broken(format!("a spare's reply with {} descriptors rather than 2", reply.len())));
        }
        let link = reply.pop().expect("two descriptors");
        let pidfd = PidFd::from_fd(reply.pop().expect("two descriptors")).map_err(|e| ForkError::Broken(format!("a bad pidfd: {e}")))?;
        Ok((pidfd, link))
    }

    /// Send one request and read its reply: the descriptors it carried when it succeeded.
    async fn exchange(&mut self, request: ForkRequest, fds: &[RawFd], timeout: Duration) -> Result<Vec<OwnedFd>, ForkError> {
        let bytes = request.encode();
        let channel = &mut self.channel;
        let exchange = async {
            channel.send_raw_with_fds(&bytes, fds).await?;
            let mut reply = [0u8; 8];
            let received = channel.recv_raw_with_fds(&mut reply).await?;
            Ok::<_, std::io::Error>((i32::from_ne_bytes(reply[..4].try_into().unwrap()), received))
        };
        match tokio::time::timeout(timeout, exchange).await {
            Ok(Ok((0, received))) => Ok(received),
            Ok(Ok((errno, _))) => Err(ForkError::Refused(std::io::Error::from_raw_os_error(errno))),
            Ok(Err(e)) => Err(ForkError::Broken(e.to_string())),
            Err(_) => Err(ForkError::Broken(format!("no reply within {timeout:?}"))),
        }
    }

    /// Kill the Zygote (and with it every process in its PID namespace: its handlers and
    /// child Zygotes), then remove its cgroup and mounts.
    pub async fn stop(self) {
        let ZygoteProcess { channel, process, cgroup, root } = self;
        drop(channel);
        process.kill();
        cgroup.kill_all();
        process.exited(Duration::from_secs(2)).await;
        process.reap();
        cgroup.wait_empty(Duration::from_secs(5)).await;
        if let Err(e) = mounts::detach(&root) {
            tracing::warn!("unmounting Zygote root {}: {e}", root.display());
        }
        if let Some(dir) = root.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
        if let Err(e) = cgroup.remove() {
            tracing::warn!("removing a Zygote's cgroup: {e}");
        }
    }
}
