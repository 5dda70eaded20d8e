//! A back-end for the instance manager's tests, as OpenLambda's `sandbox/mock.go` is for its
//! worker: sandboxes are plain values whose creation and requests follow a script (answer,
//! crash at a given phase, run out of time, fail to be made) and whose every pause, resume
//! and destruction is recorded, so the tests need neither root nor a Python.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use sprout_sandbox::channel::{Reply, Request};
use sprout_sandbox::{Backend, BackendStats, Calls, CreateError, HandlerKind, InvokeError, Limits, Phase, Sandbox, SandboxSpec};

use super::prepare::Prepare;
use super::Failure;
use crate::registry::Lambda;

/// What the next request to a fake sandbox does.
#[derive(Debug, Clone, Copy)]
pub enum Outcome {
    /// Answer with a body naming the sandbox.
    Answer,
    /// The sandbox dies at this phase of the request.
    Crash(Phase),
    /// The handler runs past its limit.
    Timeout,
    /// Answer after this long (to keep a sandbox busy).
    Slow(Duration),
}

/// What happened to fake sandboxes, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Created(u64),
    Invoked(u64),
    Paused(u64),
    Resumed(u64),
    Destroyed(u64),
}

#[derive(Default)]
pub struct Script {
    /// Outcomes of the next requests, in order (then: answer).
    pub outcomes: VecDeque<Outcome>,
    /// Errors of the next creates, in order (then: success).
    pub create_errors: VecDeque<CreateError>,
    /// How long a create takes.
    pub create_delay: Duration,
    /// Whether sandboxes can be paused.
    pub pausable: bool,
    /// Sandboxes killed while paused (a SIGKILL waiting for the thaw).
    pub killed: Vec<u64>,
    pub events: Vec<Event>,
}

/// A back-end of fake sandboxes sharing one [`Script`].
#[derive(Default)]
pub struct FakeBackend {
    pub script: Arc<Mutex<Script>>,
    next_id: AtomicU64,
    /// Its name; empty: "fake".
    name: &'static str,
}

impl FakeBackend {
    /// One answering to `name`, as a worker's second back-end does.
    pub fn named(name: &'static str) -> FakeBackend {
        FakeBackend { name, ..FakeBackend::default() }
    }

    pub fn events(&self) -> Vec<Event> {
        self.script.lock().unwrap().events.clone()
    }

    pub fn count(&self, kind: fn(u64) -> Event) -> usize {
        self.events().iter().filter(|e| std::mem::discriminant(*e) == std::mem::discriminant(&kind(0))).count()
    }
}

struct FakeSandbox {
    id: u64,
    kind: HandlerKind,
    dead: bool,
    script: Arc<Mutex<Script>>,
}

#[async_trait]
impl Backend for FakeBackend {
    fn name(&self) -> &'static str {
        if self.name.is_empty() {
            "fake"
        } else {
            self.name
        }
    }

    async fn create(&self, _spec: &SandboxSpec) -> Result<Box<dyn Sandbox>, CreateError> {
        let delay = self.script.lock().unwrap().create_delay;
        tokio::time::sleep(delay).await;
        let mut script = self.script.lock().unwrap();
        if let Some(e) = script.create_errors.pop_front() {
            return Err(e);
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        script.events.push(Event::Created(id));
        Ok(Box::new(FakeSandbox { id, kind: HandlerKind::Wsgi, dead: false, script: self.script.clone() }))
    }

    fn stats(&self) -> BackendStats {
        BackendStats {
            created: self.count(Event::Created) as u64,
            destroyed: self.count(Event::Destroyed) as u64,
            ..BackendStats::default()
        }
    }

    async fn shutdown(&self) {}
}

#[async_trait]
impl Sandbox for FakeSandbox {
    fn id(&self) -> u64 {
        self.id
    }

    fn kind(&self) -> HandlerKind {
        self.kind
    }

    fn startup(&self) -> Duration {
        Duration::from_millis(1)
    }

    async fn invoke(
        &mut self,
        _request: &Request,
        _body: &[u8],
        timeout: Duration,
        _calls: &dyn Calls,
    ) -> Result<(Reply, Bytes), InvokeError> {
        let outcome = {
            let mut script = self.script.lock().unwrap();
            script.events.push(Event::Invoked(self.id));
            script.outcomes.pop_front().unwrap_or(Outcome::Answer)
        };
        let answer = || Ok((Reply { status: Some(200), ..Reply::default() }, Bytes::from(format!("sandbox {}", self.id))));
        match outcome {
            Outcome::Answer => answer(),
            Outcome::Slow(took) if took < timeout => {
                tokio::time::sleep(took).await;
                answer()
            }
            Outcome::Slow(_) | Outcome::Timeout => {
                self.dead = true;
                Err(InvokeError::Timeout(timeout))
            }
            Outcome::Crash(phase) => {
                self.dead = true;
                Err(InvokeError::Crashed { message: "the fake sandbox crashed".into(), phase })
            }
        }
    }

    fn reusable(&self) -> bool {
        !self.dead
    }

    fn pause(&self) -> std::io::Result<bool> {
        let mut script = self.script.lock().unwrap();
        if script.pausable {
            script.events.push(Event::Paused(self.id));
        }
        Ok(script.pausable)
    }

    fn resume(&self) -> std::io::Result<()> {
        self.script.lock().unwrap().events.push(Event::Resumed(self.id));
        Ok(())
    }

    fn killed_while_paused(&self) -> bool {
        self.script.lock().unwrap().killed.contains(&self.id)
    }

    fn pids(&self) -> Vec<i32> {
        Vec::new()
    }

    fn pss_bytes(&self) -> u64 {
        0
    }

    async fn destroy(self: Box<Self>) {
        self.script.lock().unwrap().events.push(Event::Destroyed(self.id));
    }
}

/// Specs with nothing to install and the host's network.
pub struct PlainSpecs;

#[async_trait]
impl Prepare for PlainSpecs {
    async fn spec(&self, lambda: &Lambda, limits: Limits) -> Result<SandboxSpec, Failure> {
        Ok(plain_spec(&lambda.name, lambda.dir.clone(), limits))
    }
}

/// A spec with nothing to install, the host's network and the default back-end.
pub fn plain_spec(lambda: &str, code_dir: std::path::PathBuf, limits: Limits) -> SandboxSpec {
    SandboxSpec {
        lambda: lambda.to_string(),
        code_dir,
        limits,
        env: Vec::new(),
        packages: Vec::new(),
        paths: Vec::new(),
        attached: None,
        network: None,
        output: None,
        backend: None,
        shared_code: None,
        imports: Arc::from([]),
    }
}
