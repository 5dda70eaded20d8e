//! One invocation path: every way a lambda runs — `/run`, the app port, `sprout.invoke` and
//! Kafka deliveries go through [`Invoker::invoke`], a user lease's calls through
//! [`Invoker::invoke_held`], which both check the call's limits, run it
//! on a sandbox ([`Instances`]), counts it ([`Metrics`]) and logs what no sandbox logs
//! ([`Logs`]: why a request found no sandbox). Request ids come from here too ([`RequestIds`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use serde_json::{json, Value};
use sprout_sandbox::channel::Request;
use sprout_sandbox::Calls;

use crate::errors::{handler_error, Error, ErrorCode};
use crate::instances::{Failure, Held, Instances, Invocation};
use crate::logs::{Details, Entry, Kind, Logs, RequestTag, Trigger};
use crate::metrics::Metrics;
use crate::names::valid_name;
use crate::registry::{Lambda, Registry};

/// What an invocation may ask for.
#[derive(Debug, Clone, Copy)]
pub struct InvokeLimits {
    /// Largest event or request body, in bytes.
    pub max_body: usize,
    /// How deep handlers' calls to other lambdas may nest.
    pub max_invoke_depth: u32,
}

/// One invocation to make.
pub struct Call<'a> {
    pub lambda: Arc<Lambda>,
    /// The request as the handler sees it (its `depth` is set from `depth`).
    pub request: Request,
    pub body: &'a [u8],
    pub request_id: Arc<str>,
    pub trigger: Trigger,
    /// How long it may take, queueing included (the worker's time limit for a request from
    /// outside; what is left of the caller's for a handler's call).
    pub limit: Duration,
    /// How many calls deep (0: from outside).
    pub depth: u32,
}

/// A handler's batch calls (`sprout.map` inside a lambda, over its channel): run by the layer
/// that runs maps ([`Invoker::new`] is given it), answered as one frame.
#[async_trait]
pub trait BatchCalls: Send + Sync {
    /// `f(event)` of lambda `name` over the items of `event`, a JSON array, `depth` calls deep
    /// from request `caller`, within `time_left`: the frame to send back, and its body.
    async fn call(
        &self,
        invoker: &Arc<Invoker>,
        name: &str,
        event: Bytes,
        time_left: Duration,
        depth: u32,
        caller: Arc<str>,
    ) -> (Value, Bytes);
}

pub struct Invoker {
    registry: Arc<Registry>,
    instances: Arc<Instances>,
    metrics: Arc<Metrics>,
    logs: Arc<Logs>,
    limits: InvokeLimits,
    ids: RequestIds,
    /// Runs handlers' batch calls; None: they are refused.
    batches: Option<Arc<dyn BatchCalls>>,
    /// Which lambdas a handler may call (`sprout.invoke`, maps); unset: any.
    call_policy: std::sync::OnceLock<Arc<dyn CallPolicy>>,
    me: Weak<Invoker>,
}

/// Which lambdas a lambda's handler may call: the API's tenants decide (a tenant's lambdas
/// reach only their own tenant's).
pub trait CallPolicy: Send + Sync {
    fn may_call(&self, caller: &str, callee: &str) -> bool;
}

impl Invoker {
    pub fn new(
        registry: Arc<Registry>,
        instances: Arc<Instances>,
        metrics: Arc<Metrics>,
        logs: Arc<Logs>,
        limits: InvokeLimits,
        batches: Option<Arc<dyn BatchCalls>>,
    ) -> Arc<Invoker> {
        Arc::new_cyclic(|me| Invoker {
            registry,
            instances,
            metrics,
            logs,
            limits,
            ids: RequestIds::new(),
            batches,
            call_policy: std::sync::OnceLock::new(),
            me: me.clone(),
        })
    }

    /// Set which lambdas handlers may call (once; later calls are ignored).
    pub fn set_call_policy(&self, policy: Arc<dyn CallPolicy>) {
        let _ = self.call_policy.set(policy);
    }

    /// Whether `caller`'s handler may call `callee`.
    pub fn may_call(&self, caller: &str, callee: &str) -> bool {
        self.call_policy.get().is_none_or(|p| p.may_call(caller, callee))
    }

    /// The registry lambdas are looked up in.
    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// A new request id.
    pub fn new_id(&self) -> Arc<str> {
        self.ids.next()
    }

    pub fn limits(&self) -> InvokeLimits {
        self.limits
    }

    /// The time limit of a request from outside.
    pub fn timeout(&self) -> Duration {
        self.instances.timeout()
    }

    /// How many sandboxes one lambda may have at once: how many chunks of a map run at once.
    pub fn max_per_lambda(&self) -> usize {
        self.instances.max_per_lambda()
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The lambda named `name`, or the error to answer.
    pub fn lambda(&self, name: &str) -> Result<Arc<Lambda>, Error> {
        if !valid_name(name) {
            return Err(Error::new(ErrorCode::InvalidName, format!("{name:?} is not a lambda name")));
        }
        self.registry.get(name).ok_or_else(|| Error::new(ErrorCode::LambdaNotFound, format!("no lambda named {name:?}")))
    }

    /// Run `call`: its handler's reply — which may report the handler's own error (it raised,
    /// or sent no valid result: [`handler_failure`]) — or the error to answer (with `lambda` in
    /// its body).
    pub async fn invoke(&self, call: Call<'_>) -> Result<Invocation, Error> {
        self.invoke_on(call, None).await
    }

    /// Run `call` on a held sandbox (a user lease's part), as
    /// [`Invoker::invoke`] runs one: the same checks, metrics and logs; never retried.
    pub async fn invoke_held(&self, call: Call<'_>, held: &mut Held) -> Result<Invocation, Error> {
        self.invoke_on(call, Some(held)).await
    }

    async fn invoke_on(&self, call: Call<'_>, held: Option<&mut Held>) -> Result<Invocation, Error> {
        let Call { lambda, mut request, body, request_id, trigger, limit, depth } = call;
        let name = lambda.name.clone();
        let refused = if depth > self.limits.max_invoke_depth {
            let message = format!("calls nest at most {} deep (limits.max_invoke_depth)", self.limits.max_invoke_depth);
            Some(Error::new(ErrorCode::CallDepthExceeded, message))
        } else if body.len() > self.limits.max_body {
            Some(Error::new(ErrorCode::PayloadTooLarge, format!("the event exceeds the limit of {} bytes", self.limits.max_body)))
        } else if limit.is_zero() {
            Some(Error::new(ErrorCode::Timeout, "the caller's time limit has passed"))
        } else {
            None
        };
        if let Some(e) = refused {
            self.metrics.failed(&name, e.code, Duration::ZERO);
            return Err(self.failed(&lambda, &request_id, e));
        }
        request.depth = depth;
        request.request_id = request_id.to_string();
        let started = Instant::now();
        let calls = LambdaCalls { invoker: self.me.clone(), depth, caller: request_id.clone(), caller_lambda: name.clone() };
        let tag = RequestTag { id: request_id.clone(), trigger };
        let outcome = match held {
            None => self.instances.invoke(&lambda, &request, body, limit, &calls, &tag).await,
            Some(held) => self.instances.run_held(held, &request, body, limit, &calls, &tag).await,
        };
        match outcome {
            Ok(invocation) => {
                let code = invocation.reply.error.as_deref().unwrap_or("ok");
                self.metrics.invocation(&name, invocation.cold, code, started.elapsed());
                // Logged by the run (its error and report entries): only counted here.
                if let Some(e) = handler_error(&invocation.reply) {
                    self.metrics.error(e.code);
                }
                Ok(invocation)
            }
            Err(failure) => {
                // A sandbox's failure was logged by its run; one that came before any sandbox
                // is logged here.
                let ran = matches!(failure, Failure::Sandbox(_));
                let e = Error::from(failure);
                self.metrics.failed(&name, e.code, started.elapsed());
                if ran {
                    self.metrics.error(e.code);
                    return Err(e.with("lambda", name).counted());
                }
                Err(self.failed(&lambda, &request_id, e))
            }
        }
    }

    /// A request that reached no sandbox: logged as an `error` entry of its lambda, counted,
    /// and answered with `e`.
    fn failed(&self, lambda: &Lambda, request_id: &Arc<str>, e: Error) -> Error {
        self.metrics.error(e.code);
        let message = format!("ERROR RequestId: {request_id} {}: {}", e.code.as_str(), e.message());
        let traceback = e.get("traceback").and_then(Value::as_str).map(str::to_string);
        let details = Details { outcome: Some(e.code.as_str().into()), traceback, ..Details::default() };
        let mut entry = Entry::now(&Arc::from(lambda.name.as_str()), lambda.version, Kind::Error, message).details(details);
        entry.request_id = Some(request_id.clone());
        self.logs.record(entry);
        e.with("lambda", lambda.name.clone()).counted()
    }
}

/// The error a reply reports (the handler raised, or sent no valid result), to answer with;
/// counted already.
pub fn handler_failure(invocation: &Invocation, lambda: &str) -> Option<Error> {
    handler_error(&invocation.reply).map(|e| e.with("lambda", lambda).counted())
}

/// Answers the calls (`sprout.invoke`) of a handler serving request `caller`, `depth` calls
/// deep: each runs as `POST /run/<name>` with the event as its body would (a call with
/// `batch`, as `POST /map/<name>`: [`BatchCalls`]), with the same limits and error
/// codes, within what is left of the caller's time limit, at most `limits.max_invoke_depth`
/// calls deep. The channel carries nothing else a handler could ask
/// of the worker: a lambda can call others, never deploy, replace or delete one.
pub struct LambdaCalls {
    invoker: Weak<Invoker>,
    depth: u32,
    caller: Arc<str>,
    /// The calling lambda, for the call policy.
    caller_lambda: String,
}

#[async_trait]
impl Calls for LambdaCalls {
    async fn call(&self, lambda: &str, event: Bytes, batch: bool, time_left: Duration) -> (Value, Bytes) {
        let Some(invoker) = self.invoker.upgrade() else {
            return (Error::new(ErrorCode::ShuttingDown, "the worker is shutting down").into_call_reply(), Bytes::new());
        };
        let (name, depth, caller) = (lambda.to_string(), self.depth + 1, self.caller.clone());
        if !invoker.may_call(&self.caller_lambda, &name) {
            // As a lambda that does not exist: another tenant's names are not disclosed.
            let e = Error::new(ErrorCode::LambdaNotFound, format!("no lambda named {name:?}"));
            return (e.with("request_id", &*invoker.new_id()).into_call_reply(), Bytes::new());
        }
        // A task of its own: the callee's sandbox is returned (or destroyed) properly even if
        // the caller's request is cut off meanwhile; it ends within `time_left` anyway.
        let call = async move {
            match (batch, invoker.batches.clone()) {
                (true, Some(batches)) => batches.call(&invoker, &name, event, time_left, depth, caller).await,
                (true, None) => (Error::new(ErrorCode::InvalidRequest, "this worker runs no maps").into_call_reply(), Bytes::new()),
                (false, _) => invoker.call(name, event, time_left, depth, caller).await,
            }
        };
        match tokio::spawn(call).await {
            Ok(reply) => reply,
            Err(e) => (Error::new(ErrorCode::Internal, e.to_string()).into_call_reply(), Bytes::new()),
        }
    }
}

impl Invoker {
    /// A handler's call: the frame sent back to it (`{"status": 200, "request_id": ...}` and the
    /// result, or the error's body with its status).
    async fn call(&self, name: String, event: Bytes, time_left: Duration, depth: u32, caller: Arc<str>) -> (Value, Bytes) {
        let request_id = self.new_id();
        let lambda = match self.lambda(&name) {
            Ok(l) => l,
            Err(e) => return (e.with("request_id", &*request_id).into_call_reply(), Bytes::new()),
        };
        let request = Request {
            method: "POST".into(),
            script_name: format!("/run/{name}"),
            path: "/".into(),
            query: String::new(),
            headers: vec![("Content-Type".into(), "application/json".into())],
            protocol: "HTTP/1.1".into(),
            remote_addr: String::new(),
            depth,
            request_id: String::new(),
            batch: false,
        };
        let call = Call {
            lambda,
            request,
            body: &event,
            request_id: request_id.clone(),
            trigger: Trigger::Invoke { caller },
            limit: time_left,
            depth,
        };
        let failed = |e: Error| (e.with("request_id", &*request_id).into_call_reply(), Bytes::new());
        match self.invoke(call).await {
            Ok(invocation) => match handler_failure(&invocation, &name) {
                Some(e) => failed(e),
                None => (json!({"status": invocation.reply.status.unwrap_or(200), "request_id": &*request_id}), invocation.body),
            },
            Err(e) => failed(e),
        }
    }
}

/// Request ids: 16 hex digits, unique within a worker (a bijection of a counter, from a
/// random start), unpredictable enough across workers.
pub struct RequestIds {
    seed: u64,
    next: AtomicU64,
}

impl RequestIds {
    pub fn new() -> RequestIds {
        let mut bytes = [0u8; 8];
        let seeded = std::fs::File::open("/dev/urandom").and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes));
        let seed = match seeded {
            Ok(()) => u64::from_le_bytes(bytes),
            Err(_) => {
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
                    ^ u64::from(std::process::id())
            }
        };
        RequestIds { seed, next: AtomicU64::new(0) }
    }

    pub fn next(&self) -> Arc<str> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        Arc::from(format!("{:016x}", splitmix64(self.seed.wrapping_add(n))))
    }
}

impl Default for RequestIds {
    fn default() -> RequestIds {
        RequestIds::new()
    }
}

/// SplitMix64's finalizer: a bijection of u64, so distinct counters give distinct ids.
fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_are_sixteen_hex_digits_and_never_repeat() {
        let ids = RequestIds::new();
        let mut seen = std::collections::HashSet::new();
        for _ in 0..100_000 {
            let id = ids.next();
            assert_eq!(id.len(), 16);
            assert!(id.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
            assert!(seen.insert(id));
        }
        assert!(crate::logs::query::is_request_id(&ids.next()));
    }
}
