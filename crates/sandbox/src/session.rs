//! The part of a sandbox every back-end shares once its helper has said hello: the channel to
//! the helper, one request at a time over it (answering the handler's calls to other lambdas
//! meanwhile), and the judgement of its health afterwards (a crash, the OOM killer, processes
//! left behind). A back-end's sandbox holds a [`Session`] and adds how it pauses, resumes and
//! goes away.

use std::any::Any;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;

use crate::cgroup::{CgroupView, Limits, PeakMeter, TaskCounter};
use crate::channel::{Channel, Hello, Reply, Request};
use crate::output::OutputPipe;
use crate::process::PidFd;
use crate::spec::{CreateError, HandlerKind, InvokeError, Phase};

/// What answers a handler's calls to other lambdas (`sprout.invoke`) during a request.
#[async_trait]
pub trait Calls: Send + Sync {
    /// Run `lambda` on `event` within `time_left` (with `batch`, over each event of the JSON
    /// array `event`: a map); the header and body of the frame sent back to the handler:
    /// `{"status": 200}` and the result (a map's: the array of outcomes), or `{"error": code,
    /// "message": ..., "status": ...}`.
    async fn call(&self, lambda: &str, event: Bytes, batch: bool, time_left: Duration) -> (serde_json::Value, Bytes);
}

/// A live handler: its channel, its helper process, and what tells its health.
pub struct Session {
    pub id: u64,
    pub kind: HandlerKind,
    /// How long provisioning took (for the cold-start metrics).
    pub startup: Duration,
    pub channel: Channel,
    /// The helper (PID 1 of the sandbox), when known.
    pub process: Option<PidFd>,
    /// The sandbox's cgroup as the session reads it (its processes, its OOM kills).
    pub cgroup: Option<CgroupView>,
    pub limits: Limits,
    /// Set when the sandbox must not be reused (it failed, or left processes behind).
    pub tainted: bool,
    /// Dropped with the sandbox: what it was made with (its Zygote's use count, a
    /// per-sandbox package install, its network namespace).
    pub attached: Vec<Box<dyn Any + Send + Sync>>,
    /// The worker's end of its stdout and stderr, settled after each request.
    pub output: Option<OutputPipe>,
    /// Its cgroup's peak memory, reset before each request.
    pub peak: Option<PeakMeter>,
    /// The peak memory of its last request, when its cgroup tells.
    pub last_peak: Option<u64>,
    /// Its cgroup's task count, read after each request.
    pub tasks: Option<TaskCounter>,
}

impl Session {
    /// Send one request and wait up to `timeout` for the reply, answering the handler's
    /// calls to other lambdas with `calls` meanwhile. On error the session is tainted; a crash
    /// says how far the request had got (once the handler has made a call, never a phase in
    /// which running it again would be safe).
    pub async fn invoke(
        &mut self,
        request: &Request,
        body: &[u8],
        timeout: Duration,
        calls: &dyn Calls,
    ) -> Result<(Reply, Bytes), InvokeError> {
        if let Some(peak) = &self.peak {
            peak.reset();
        }
        if let Some(output) = &self.output {
            output.begin();
        }
        let result = self.exchange(request, body, timeout, calls).await;
        self.last_peak = self.peak.as_ref().and_then(PeakMeter::read);
        if let Some(output) = &self.output {
            output.settle();
        }
        result
    }

    async fn exchange(
        &mut self,
        request: &Request,
        body: &[u8],
        timeout: Duration,
        calls: &dyn Calls,
    ) -> Result<(Reply, Bytes), InvokeError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let exchange = async {
            self.channel.send(request, body).await.map_err(|e| (e, Phase::Sending))?;
            let mut called = false;
            loop {
                let waiting = if called { Phase::Replying } else { Phase::AwaitingReply };
                self.channel.await_frame().await.map_err(|e| (e, waiting))?;
                let (mut reply, body) = self.channel.recv::<Reply>().await.map_err(|e| (e, Phase::Replying))?;
                match reply.op.as_deref() {
                    None => return Ok((reply, body)),
                    Some("invoke") => {}
                    Some(other) => {
                        // Nothing else may be asked of the worker over a sandbox's channel.
                        self.tainted = true;
                        reply.error = Some("invalid_result".into());
                        reply.message = Some(format!("the sandbox asked for {other:?}, which a sandbox cannot ask for"));
                        return Ok((reply, Bytes::new()));
                    }
                }
                called = true;
                let lambda = reply.lambda.unwrap_or_default();
                // The call must end a little before this request does, so the handler hears
                // how it ended (a timeout, say) in time to answer.
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                let budget = left.saturating_sub((left / 10).min(Duration::from_millis(100)));
                let (header, result) = calls.call(&lambda, body, reply.batch, budget).await;
                self.channel.send(&header, &result).await.map_err(|e| (e, Phase::Replying))?;
            }
        };
        match tokio::time::timeout(timeout, exchange).await {
            Ok(Ok(reply)) => {
                if !self.only_helper_left() {
                    self.tainted = true;
                }
                Ok(reply)
            }
            Ok(Err((e, phase))) => {
                self.tainted = true;
                Err(self.diagnose(e, phase))
            }
            Err(_) => {
                self.tainted = true;
                Err(InvokeError::Timeout(timeout))
            }
        }
    }

    /// After a request the helper (PID 1 of the sandbox) kills what the handler left running;
    /// the worker checks rather than trusts it, since the helper runs the handler's code. A
    /// task count of one settles it; more (a handler's threads, say) asks `cgroup.procs`.
    fn only_helper_left(&self) -> bool {
        if self.tasks.as_ref().and_then(TaskCounter::read).is_some_and(|n| n <= 1) {
            return true;
        }
        match &self.cgroup {
            Some(view) => crate::cgroup::read_pids(&view.procs).len() <= 1,
            None => true,
        }
    }

    /// Why the channel broke: the OOM killer, or some other death.
    fn diagnose(&self, e: std::io::Error, phase: Phase) -> InvokeError {
        if let Some(view) = &self.cgroup {
            let oom_now = view.oom_source.as_deref().map(crate::cgroup::read_oom_kills).unwrap_or(0);
            if oom_now > view.oom_before {
                return InvokeError::OutOfMemory { limit_mb: self.limits.memory_bytes >> 20 };
            }
        }
        InvokeError::Crashed { message: e.to_string(), phase }
    }

    /// A session over `channel` with the helper `process`, in the cgroup `cgroup` views.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: u64,
        kind: HandlerKind,
        startup: Duration,
        channel: Channel,
        process: Option<PidFd>,
        cgroup: Option<CgroupView>,
        limits: Limits,
        attached: Vec<Box<dyn Any + Send + Sync>>,
        output: Option<OutputPipe>,
    ) -> Session {
        let peak = cgroup.as_ref().and_then(|c| c.peak.as_deref()).and_then(PeakMeter::open);
        let tasks = cgroup.as_ref().and_then(|c| c.tasks.as_deref()).and_then(TaskCounter::open);
        // What the handler printed while loading is in the pipe before its hello: taken now,
        // it belongs to no request (left to the poller, a busy CPU could leave it for the
        // first request's end, inside that request's START and REPORT).
        if let Some(output) = &output {
            output.settle();
        }
        Session { id, kind, startup, channel, process, cgroup, limits, tainted: false, attached, output, peak, last_peak: None, tasks }
    }

    /// Whether the sandbox may serve another request.
    pub fn reusable(&self) -> bool {
        !self.tainted && !self.process.as_ref().map(|p| p.has_exited()).unwrap_or(false)
    }

    /// Host pids of the sandbox's processes.
    pub fn pids(&self) -> Vec<i32> {
        match &self.cgroup {
            Some(view) => crate::cgroup::read_pids(&view.procs),
            None => self.process.iter().map(|p| p.pid()).collect(),
        }
    }
}

/// The hello's handler kind, or the load failure it reports.
pub fn handler_kind(hello: Hello) -> Result<HandlerKind, CreateError> {
    match hello.kind.as_deref() {
        Some("wsgi") => Ok(HandlerKind::Wsgi),
        Some("asgi") => Ok(HandlerKind::Asgi),
        Some("function") => Ok(HandlerKind::Function),
        _ => Err(CreateError::Load {
            message: hello.message.unwrap_or_else(|| "the handler failed to load".into()),
            traceback: hello.traceback,
        }),
    }
}

/// The [`crate::Sandbox`] methods every back-end answers from its `session` field (a
/// [`Session`]), for back-ends here and outside this crate (sprout-docker).
#[macro_export]
macro_rules! session_methods {
    () => {
        fn id(&self) -> u64 {
            self.session.id
        }
        fn kind(&self) -> $crate::spec::HandlerKind {
            self.session.kind
        }
        fn startup(&self) -> std::time::Duration {
            self.session.startup
        }
        fn reusable(&self) -> bool {
            self.session.reusable()
        }
        fn pids(&self) -> Vec<i32> {
            self.session.pids()
        }
        fn peak_memory(&self) -> Option<u64> {
            self.session.last_peak
        }
    };
}
