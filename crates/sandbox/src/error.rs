//! Why the platform could not make a sandbox, as types that keep their cause (the `io::Error`,
//! the path, the process and what it was doing) instead of a formatted string, in the manner
//! of Firecracker's jailer. A leaf: depends on no other module of the crate.

use std::borrow::Cow;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// What the platform was doing, or who it was waiting for, in an error message.
pub type What = Cow<'static, str>;

/// A platform failure while making a sandbox: never the lambda's fault.
#[derive(Debug, thiserror::Error)]
pub enum PlatformError {
    /// A file-system or kernel call on a path failed.
    #[error("{doing} {}: {error}", path.display())]
    Path { doing: What, path: PathBuf, error: io::Error },
    /// A system call, a pipe or a sandbox's channel failed.
    #[error("{doing}: {error}")]
    Io { doing: What, error: io::Error },
    /// A sandbox process (a handler's helper, a Zygote, a container) exited before it was ready.
    #[error("{process} exited {during}")]
    Exited { process: What, during: What },
    /// A sandbox process did not get ready in time.
    #[error("{process} did not {doing} within {after:?}")]
    TimedOut { process: What, doing: What, after: Duration },
    /// A sandbox process answered other than the protocol says.
    #[error("{process} said {said}")]
    Protocol { process: What, said: String },
    /// A Zygote refused to fork (it is still usable).
    #[error("Zygote {id} could not fork: {error}")]
    ForkRefused { id: u64, error: io::Error },
    /// A Zygote stopped answering or is gone (it is forgotten).
    #[error("Zygote {id} {why}")]
    ZygoteLost { id: u64, why: String },
    /// A container engine (runc, Docker) refused; its own words.
    #[error("{engine} could not {doing}: {message}")]
    Engine { engine: &'static str, doing: What, message: String },
}

impl PlatformError {
    /// The system error behind this failure, if one is.
    pub fn io_error(&self) -> Option<&io::Error> {
        match self {
            PlatformError::Path { error, .. } | PlatformError::Io { error, .. } | PlatformError::ForkRefused { error, .. } => Some(error),
            _ => None,
        }
    }

    /// The `io::ErrorKind` this failure is best read as.
    pub fn kind(&self) -> io::ErrorKind {
        match self {
            PlatformError::TimedOut { .. } => io::ErrorKind::TimedOut,
            PlatformError::Exited { .. } | PlatformError::ZygoteLost { .. } => io::ErrorKind::BrokenPipe,
            _ => self.io_error().map_or(io::ErrorKind::Other, io::Error::kind),
        }
    }

    pub fn io(doing: impl Into<What>, error: impl Into<io::Error>) -> PlatformError {
        PlatformError::Io { doing: doing.into(), error: error.into() }
    }

    pub fn exited(process: impl Into<What>, during: impl Into<What>) -> PlatformError {
        PlatformError::Exited { process: process.into(), during: during.into() }
    }

    pub fn timed_out(process: impl Into<What>, doing: impl Into<What>, after: Duration) -> PlatformError {
        PlatformError::TimedOut { process: process.into(), doing: doing.into(), after }
    }

    pub fn protocol(process: impl Into<What>, said: impl std::fmt::Debug) -> PlatformError {
        PlatformError::Protocol { process: process.into(), said: format!("{said:?}") }
    }
}

/// Why a sandbox's helper never connected: it exited (`dead`), or did not start in time.
pub fn helper_failed(dead: bool, timeout: Duration) -> PlatformError {
    if dead {
        PlatformError::exited("the sandbox's helper", "during setup (its output is in the worker log)")
    } else {
        PlatformError::timed_out("the sandbox's helper", "start", timeout)
    }
}

/// Functions that return `io::Result` keep a `PlatformError` whole inside the `io::Error`
/// (its kind outside, the typed error as the inner error).
impl From<PlatformError> for io::Error {
    fn from(e: PlatformError) -> io::Error {
        io::Error::new(e.kind(), e)
    }
}

/// Context for a failed system call: what was being done, and on which path.
pub trait Doing<T> {
    /// The call failed while doing `doing`.
    fn doing(self, doing: impl Into<What>) -> Result<T, PlatformError>;
    /// The call failed while doing `doing` to `path`.
    fn at(self, doing: impl Into<What>, path: &Path) -> Result<T, PlatformError>;
}

impl<T, E: Into<io::Error>> Doing<T> for Result<T, E> {
    fn doing(self, doing: impl Into<What>) -> Result<T, PlatformError> {
        self.map_err(|e| PlatformError::io(doing, e))
    }

    fn at(self, doing: impl Into<What>, path: &Path) -> Result<T, PlatformError> {
        self.map_err(|e| PlatformError::Path { doing: doing.into(), path: path.to_path_buf(), error: e.into() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_error_names_what_where_and_why_and_keeps_the_io_error() {
        let failed: Result<(), io::Error> = Err(io::Error::from_raw_os_error(libc::EACCES));
        let e = failed.at("creating the sandbox root", Path::new("/run/x")).unwrap_err();
        assert!(e.to_string().starts_with("creating the sandbox root /run/x: Permission denied"), "{e}");
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        assert_eq!(e.io_error().and_then(io::Error::raw_os_error), Some(libc::EACCES));
    }

    #[test]
    fn an_io_error_made_from_a_platform_error_keeps_it_inside() {
        let e = PlatformError::timed_out("the root Zygote", "start", Duration::from_secs(2));
        let io: io::Error = e.into();
        assert_eq!(io.kind(), io::ErrorKind::TimedOut);
        assert_eq!(io.to_string(), "the root Zygote did not start within 2s");
        let inner = io.get_ref().and_then(|i| i.downcast_ref::<PlatformError>());
        assert!(matches!(inner, Some(PlatformError::TimedOut { .. })));
    }

    #[test]
    fn errno_values_convert_too() {
        let failed: Result<(), nix::Error> = Err(nix::Error::EPERM);
        let e = failed.doing("moving the process into its cgroup").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        assert_eq!(e.to_string(), "moving the process into its cgroup: Operation not permitted (os error 1)");
    }
}
