//! What handlers print: each sandbox's stdout and stderr go into a pipe that the worker reads
//! and logs line by line, labelled with the lambda and sandbox, at target `sandbox`.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

use tokio::io::AsyncReadExt;
use tokio::net::unix::pipe;

/// Longest line logged; the rest of a longer line is dropped.
const MAX_LINE: usize = 4096;

/// Make a pipe whose read end is logged; returns the write end for the sandbox.
pub fn log_pipe(lambda: &str, sandbox: u64) -> io::Result<OwnedFd> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: `fds` is a live array of two c_ints, exactly what pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded, so both are fresh descriptors that nothing else owns; each is
    // wrapped exactly once.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // The sandbox's end must block like an ordinary stdout.
    // SAFETY: fds[1] is owned by `write`, which is alive here; F_SETFL takes an int, no pointer.
    unsafe { libc::fcntl(fds[1], libc::F_SETFL, 0) };
    let receiver = pipe::Receiver::from_owned_fd(read)?;
    let lambda = lambda.to_string();
    tokio::spawn(async move {
        let mut receiver = receiver;
        let mut chunk = [0u8; 8192];
        let mut line: Vec<u8> = Vec::new();
        let mut skipping = false; // inside an over-long line, dropping until its end
        let emit = |bytes: &[u8]| {
            let text = String::from_utf8_lossy(bytes);
            tracing::info!(target: "sandbox", lambda = %lambda, sandbox, "{}", text.trim_end());
        };
        loop {
            let n = match receiver.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            for piece in chunk[..n].split_inclusive(|b| *b == b'\n') {
                let complete = piece.ends_with(b"\n");
                if !skipping {
                    let room = MAX_LINE - line.len();
                    line.extend_from_slice(&piece[..piece.len().min(room)]);
                    if line.len() >= MAX_LINE && !complete {
                        emit(&line);
                        line.clear();
                        skipping = true;
                    }
                }
                if complete {
                    if !skipping {
                        emit(&line);
                    }
                    line.clear();
                    skipping = false;
                }
            }
        }
        if !line.is_empty() {
            emit(&line);
        }
    });
    Ok(write)
}
