//! What a request's run comes to: a reply from its handler ([`Invocation`]), or why it got none
//! ([`Failure`]), and the error answered for that.

use std::time::Duration;

use bytes::Bytes;
use sprout_sandbox::channel::Reply;
use sprout_sandbox::InvokeError;

use crate::errors::{Error, ErrorCode};
use crate::packages::InstallError;

/// Why a request got no reply from its handler.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    #[error("{0} requests are already waiting for this lambda")]
    QueueFull(usize),
    #[error("no sandbox became free within {0:?}")]
    QueueTimeout(Duration),
    #[error("no memory became free for a new sandbox within {0:?} (the worker's memory budget)")]
    NoMemory(Duration),
    #[error("the worker is shutting down")]
    ShuttingDown,
    #[error("the lambda failed to load: {message}")]
    Load { message: String, traceback: Option<String> },
    #[error("no sandbox could be provisioned: {0}")]
    Platform(String),
    #[error("the lambda's packages could not be installed: {0}")]
    Install(InstallError),
    #[error(transparent)]
    Sandbox(#[from] InvokeError),
}

/// A reply from a handler.
pub struct Invocation {
    pub reply: Reply,
    pub body: Bytes,
    pub cold: bool,
    pub sandbox: u64,
    /// How long it ran in its sandbox (queueing and a cold start left out).
    pub ran: Duration,
}

impl From<Failure> for Error {
    /// The error to answer a request whose handler never replied with.
    fn from(failure: Failure) -> Error {
        let message = failure.to_string();
        match failure {
            Failure::QueueFull(_) => Error::new(ErrorCode::QueueFull, message),
            Failure::QueueTimeout(_) => Error::new(ErrorCode::QueueTimeout, message),
            Failure::NoMemory(_) => Error::new(ErrorCode::MemoryBudget, message),
            Failure::ShuttingDown => Error::new(ErrorCode::ShuttingDown, message),
            Failure::Load { traceback, .. } => {
                let e = Error::new(ErrorCode::LoadError, message);
                match traceback {
                    Some(tb) => e.with("traceback", tb),
                    None => e,
                }
            }
            Failure::Platform(_) => Error::new(ErrorCode::SandboxStartFailed, message),
            Failure::Install(e) => {
                let mut err = Error::new(ErrorCode::InstallFailed, message).with("pip_output", e.output).with("pip_reasons", e.reasons);
                if let Some(package) = e.package {
                    err = err.with("package", package);
                }
                err
            }
            Failure::Sandbox(e) => Error::new(ErrorCode::of_invoke_error(&e), message),
        }
    }
}
