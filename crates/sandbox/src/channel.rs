//! The channel between the worker and a sandbox's helper: a Unix-domain socket in the
//! sandbox's scratch directory, carrying frames and, to Zygotes, file descriptors.
//!
//! A frame is `<u32 header length><u32 body length><JSON header><body>`, little endian; the
//! Python side is `python/sprout/runtime/channel.py`. The worker listens on
//! `<scratch>/sprout.sock` before the helper starts and the helper connects to
//! `/host/sprout.sock`; the kernel then tells us, race-free, which process connected
//! (SO_PEERPIDFD), whatever PID namespace it lives in.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, Interest};
use tokio::net::{UnixListener, UnixStream};

use crate::error::{Doing, PlatformError};
use crate::process::PidFd;

/// The socket's name in the scratch directory (`/host/sprout.sock` inside the sandbox).
pub const SOCKET_NAME: &str = "sprout.sock";

/// Largest header we accept from a sandbox.
const MAX_HEADER: u32 = 1 << 20;

/// What a helper says first: whether its lambda loaded, and as what.
#[derive(Debug, Clone, Deserialize)]
pub struct Hello {
    #[serde(default)]
    pub kind: Option<String>,
    #[serde(default)]
    pub role: Option<String>,
    #[serde(default)]
    pub error: Option<String>,
    #[serde(default)]
    pub message: Option<String>,
    #[serde(default)]
    pub traceback: Option<String>,
    /// A handler's: the modules its lambda loaded from each package directory.
    #[serde(default)]
    pub package_modules: Option<std::collections::BTreeMap<String, Vec<String>>>,
    /// A child Zygote's: the modules it imported, and why the others failed.
    #[serde(default)]
    pub imported: Option<Vec<String>>,
    #[serde(default)]
    pub failed: Option<std::collections::BTreeMap<String, String>>,
    /// Names it was asked to import that are no modules (`from X import Y`'s `X.Y`).
    #[serde(default)]
    pub absent: Option<Vec<String>>,
}

/// One request to a lambda, as the helper receives it (the body travels beside it).
#[derive(Debug, Clone, Serialize)]
pub struct Request {
    pub method: String,
    /// The URL prefix naming the lambda, e.g. `/run/echo` (WSGI's SCRIPT_NAME).
    pub script_name: String,
    /// The path after the lambda's name, e.g. `/users/3` (WSGI's PATH_INFO, still escaped).
    pub path: String,
    pub query: String,
    pub headers: Vec<(String, String)>,
    pub protocol: String,
    pub remote_addr: String,
    /// How deep in a chain of `sprout.invoke` calls this request is (0: from outside).
    pub depth: u32,
    /// The worker's id of this request (`sprout.request_id()` in the handler).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub request_id: String,
    /// A map's chunk: the body is a JSON array of events, `f(event)` runs for each in turn and
    /// the reply's body is a JSON array of their outcomes (a function's handler only).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub batch: bool,
}

/// The worker's first frame to a handler: its environment and its packages' directories.
#[derive(Debug, Clone, Serialize)]
pub struct Init<'a> {
    pub op: &'static str,
    pub env: std::collections::BTreeMap<&'a str, &'a str>,
    pub paths: &'a [String],
    /// A gVisor pod's handler: the FIFO (its path inside the sandbox) its stdout and stderr
    /// go to, and its memory limit (enforced on its address space).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
}

impl<'a> Init<'a> {
    pub fn new(env: &'a [(String, String)], paths: &'a [String]) -> Init<'a> {
        Init { op: "init", env: env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect(), paths, output: None, memory_bytes: None }
    }
}

/// The worker's first frame to a new child Zygote: what to import, from where.
#[derive(Debug, Clone, Serialize)]
pub struct ZygoteOrder<'a> {
    pub op: &'static str,
    pub paths: &'a [String],
    pub imports: &'a [String],
    /// A code Zygote's: the lambda code's modules to import from /handler, then the function
    /// to call; any failure fails the Zygote.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<CodeOrder<'a>>,
}

/// What a code Zygote loads of the lambda code at its /handler.
#[derive(Debug, Clone, Serialize)]
pub struct CodeOrder<'a> {
    pub modules: &'a [String],
    pub call: Option<&'a str>,
}

/// A helper's answer: an HTTP status with headers, or an error the handler caused — or,
/// while the handler runs, a call to another lambda (`op` = "invoke", `lambda` its name,
/// the body its event; with `batch`, a JSON array of events to map the lambda over), which
/// the worker answers with one frame before the handler goes on.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Reply {
    #[serde(default)]
    pub op: Option<String>,
    #[serde(default)]
    pub lambda: Option<String>,
    /// A call's: the body is an array of events, run as a map (the reply: their outcomes).
    #[serde(default)]
    pub batch: bool,
    /// Package modules the handler first loaded while serving this request (early requests).
    #[serde(default)]
    pub package_modules: Option<std::collections::BTreeMap<String, Vec<String>>>,
    #[serde(default)]
    pub status: Option<u16>,
    #[serde(default)]
    pub headers: Vec<(String, String)>,
    #[serde(default)]
    pub error: Option<String>,
    #[serde(default)]
    pub message: Option<String>,
    #[serde(default)]
    pub traceback: Option<String>,
}

/// A connected channel.
pub struct Channel {
    stream: BufReader<UnixStream>,
    max_body: u32,
}

impl AsRawFd for Channel {
    fn as_raw_fd(&self) -> RawFd {
        self.stream.get_ref().as_raw_fd()
    }
}

impl Channel {
    pub fn new(stream: UnixStream, max_body: u32) -> Channel {
        Channel { stream: BufReader::with_capacity(64 * 1024, stream), max_body }
    }

    fn encode(header: &impl Serialize, body: &[u8]) -> io::Result<Vec<u8>> {
        let head = serde_json::to_vec(header)?;
        let mut buf = Vec::with_capacity(8 + head.len() + body.len());
        buf.extend_from_slice(&(head.len() as u32).to_le_bytes());
        buf.extend_from_slice(&(body.len() as u32).to_le_bytes());
        buf.extend_from_slice(&head);
        buf.extend_from_slice(body);
        Ok(buf)
    }

    /// Whether the other end has closed its side (it exited, or is exiting: a process's
    /// files close early in its exit). Does not wait or read.
    pub fn peer_closed(&self) -> bool {
        let events = libc::POLLRDHUP | libc::POLLHUP;
        let mut pfd = libc::pollfd { fd: self.stream.get_ref().as_raw_fd(), events, revents: 0 };
        // SAFETY: `pfd` is one live pollfd, matching nfds = 1; its fd is this channel's stream.
        let ready = unsafe { libc::poll(&mut pfd, 1, 0) };
        ready == 1 && pfd.revents & (events | libc::POLLERR) != 0
    }

    pub async fn send(&mut self, header: &impl Serialize, body: &[u8]) -> io::Result<()> {
        let buf = Self::encode(header, body)?;
        self.stream.write_all(&buf).await
    }

    /// Send raw bytes with descriptors attached to the first of them (SCM_RIGHTS).
    pub async fn send_raw_with_fds(&mut self, buf: &[u8], fds: &[RawFd]) -> io::Result<()> {
        let fd = self.stream.get_ref().as_raw_fd();
        let sent = self
            .stream
            .get_ref()
            .async_io(Interest::WRITABLE, || {
                let iov = [io::IoSlice::new(buf)];
                let cmsg = [ControlMessage::ScmRights(fds)];
                sendmsg::<()>(fd, &iov, &cmsg, MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL, None).map_err(io::Error::from)
            })
            .await?;
        if sent < buf.len() {
            self.stream.write_all(&buf[sent..]).await?;
        }
        Ok(())
    }

    /// Read exactly `buf.len()` raw bytes and the descriptors attached to them. Only for
    /// request/reply exchanges (the Zygote's), where nothing is buffered in between.
    pub async fn recv_raw_with_fds(&mut self, buf: &mut [u8]) -> io::Result<Vec<OwnedFd>> {
        debug_assert!(self.stream.buffer().is_empty());
        let fd = self.stream.get_ref().as_raw_fd();
        let (got, fds) = self
            .stream
            .get_ref()
            .async_io(Interest::READABLE, || {
                let mut iov = [io::IoSliceMut::new(&mut *buf)];
                let mut space = nix::cmsg_space!([RawFd; 8]);
                let msg = recvmsg::<()>(fd, &mut iov, Some(&mut space), MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_CMSG_CLOEXEC)
                    .map_err(io::Error::from)?;
                let mut fds = Vec::new();
                for cmsg in msg.cmsgs().map_err(io::Error::from)? {
                    if let ControlMessageOwned::ScmRights(received) = cmsg {
                        // SAFETY: SCM_RIGHTS installed each of these as a new descriptor in our
                        // table (close-on-exec); nothing else holds them, and each is wrapped once.
                        fds.extend(received.into_iter().map(|f| unsafe { OwnedFd::from_raw_fd(f) }));
                    }
                }
                Ok((msg.bytes, fds))
            })
            .await?;
        if got == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the peer closed the channel"));
        }
        if got < buf.len() {
            self.stream.read_exact(&mut buf[got..]).await?;
        }
        Ok(fds)
    }

    /// Wait until the first byte of the next frame has arrived; an error (`UnexpectedEof`
    /// when the peer closed the channel) if it never will.
    pub async fn await_frame(&mut self) -> io::Result<()> {
        if self.stream.fill_buf().await?.is_empty() {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the sandbox closed the channel"));
        }
        Ok(())
    }

    /// Read one frame: its header decoded as `T`, and its body.
    pub async fn recv<T: DeserializeOwned>(&mut self) -> io::Result<(T, Bytes)> {
        let mut prefix = [0u8; 8];
        self.stream.read_exact(&mut prefix).await?;
        let head_len = u32::from_le_bytes(prefix[..4].try_into().unwrap());
        let body_len = u32::from_le_bytes(prefix[4..].try_into().unwrap());
        if head_len > MAX_HEADER {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "frame header too large"));
        }
        if body_len > self.max_body {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("response body of {body_len} bytes exceeds the limit of {}", self.max_body),
            ));
        }
        let mut head = vec![0u8; head_len as usize];
        self.stream.read_exact(&mut head).await?;
        let header = serde_json::from_slice(&head)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("malformed frame header: {e}")))?;
        let mut body = vec![0u8; body_len as usize];
        self.stream.read_exact(&mut body).await?;
        Ok((header, Bytes::from(body)))
    }
}

impl Channel {
    /// Send the handler the environment variables of its lambda (beyond the sandbox's own)
    /// and its packages' directories, and wait for its hello: its lambda loaded, or not.
    pub async fn handshake(&mut self, env: &[(String, String)], paths: &[String], timeout: Duration) -> Result<Hello, PlatformError> {
        self.handshake_with(&Init::new(env, paths), timeout).await
    }

    /// [`Channel::handshake`] with an init frame of the caller's making.
    pub async fn handshake_with(&mut self, init: &Init<'_>, timeout: Duration) -> Result<Hello, PlatformError> {
        self.send(init, &[]).await.doing("sending the handler its lambda's environment")?;
        match tokio::time::timeout(timeout, self.recv::<Hello>()).await {
            Ok(Ok((hello, _))) => Ok(hello),
            Ok(Err(e)) => Err(e).doing("the handler died while loading"),
            Err(_) => Err(PlatformError::timed_out("the handler", "finish loading", timeout)),
        }
    }
}

/// The worker's end of a sandbox channel before the helper has connected.
pub struct Endpoint {
    listener: UnixListener,
}

impl Endpoint {
    /// Listen at `dir/sprout.sock` (`dir` is the sandbox's scratch directory). The path is
    /// reached through /proc/self/fd so its length never hits the 108-byte limit of a socket
    /// address. The socket is connectable by any user: only that sandbox can reach it.
    pub fn listen_in(dir: &Path) -> Result<Endpoint, PlatformError> {
        let listen = || {
            let dir_fd = std::fs::File::open(dir)?;
            let path = PathBuf::from(format!("/proc/self/fd/{}/{SOCKET_NAME}", dir_fd.as_raw_fd()));
            let _ = std::fs::remove_file(&path);
            let listener = UnixListener::bind(&path)?;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666))?;
            Ok::<_, io::Error>(Endpoint { listener })
        };
        listen().at("listening for the sandbox's helper in", dir)
    }

    /// Wait up to `timeout` for the helper; returns its channel and a pidfd of the process
    /// that connected.
    pub async fn accept(self, timeout: Duration, max_body: u32) -> Result<(Channel, Option<PidFd>), PlatformError> {
        self.accept_next(timeout, max_body).await
    }

    /// [`Endpoint::accept`], leaving the endpoint listening for more (a gVisor pod's helpers
    /// all connect to one).
    pub async fn accept_next(&self, timeout: Duration, max_body: u32) -> Result<(Channel, Option<PidFd>), PlatformError> {
        let (stream, _) = tokio::time::timeout(timeout, self.listener.accept())
            .await
            .map_err(|_| PlatformError::timed_out("the sandbox's helper", "connect", timeout))?
            .doing("accepting the sandbox's helper")?;
        let pidfd = peer_pidfd(stream.as_raw_fd());
        Ok((Channel::new(stream, max_body), pidfd))
    }
}

/// A pidfd of the peer of a connected Unix socket: SO_PEERPIDFD (Linux 6.5) when the kernel
/// has it, else pidfd_open of SO_PEERCRED's pid.
fn peer_pidfd(sock: RawFd) -> Option<PidFd> {
    const SO_PEERPIDFD: libc::c_int = 77;
    let mut fd: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `sock` (the accepted stream's) is open for the call; the kernel writes at most
    // `len` (the size of a c_int) bytes into `fd` and updates `len`, both live locals.
    let rc = unsafe { libc::getsockopt(sock, libc::SOL_SOCKET, SO_PEERPIDFD, &mut fd as *mut _ as *mut libc::c_void, &mut len) };
    // SAFETY: ucred is three plain integers, for which all-zero bytes are a valid value.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut clen = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: as above; `cred` and `clen` are live locals and `clen` is the size of ucred.
    let crc = unsafe { libc::getsockopt(sock, libc::SOL_SOCKET, libc::SO_PEERCRED, &mut cred as *mut _ as *mut libc::c_void, &mut clen) };
    if crc != 0 || cred.pid <= 0 {
        if rc == 0 && fd >= 0 {
            // SAFETY: SO_PEERPIDFD gave us this new descriptor; nothing else owns it, and it is
            // closed once here and not used again.
            unsafe { libc::close(fd) };
        }
        return None;
    }
    if rc == 0 && fd >= 0 {
        // SAFETY: SO_PEERPIDFD gave us this new descriptor and nothing else owns it; it was not
        // closed above (that branch returned).
        return Some(PidFd::from_parts(unsafe { OwnedFd::from_raw_fd(fd) }, cred.pid));
    }
    PidFd::open(cred.pid).ok()
}
