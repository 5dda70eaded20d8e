//! Running a map: a lambda's `f(event)` over each item of a JSON array, in chunks run at once
//! on as many of its sandboxes as it may have, each chunk one invocation through
//! [`Invoker::invoke`] (its helper calls `f` on each item in turn and answers one outcome per
//! item); [`crate::map_plan`] decides the chunks and what becomes of a failed one. Outcomes
//! come back in the items' order. `POST /map/<name>` (the HTTP edge's) and a handler's
//! channel call with `batch` ([`MapCalls`]) both run here.
//!
//! Items are never decoded: each is the raw JSON text of its element of the body, copied into
//! its chunk's array, and each outcome the raw text of the helper's.
//!
//! A chunk refused for want of room (its lambda's queue full, no sandbox or memory in time) is
//! sent again after a pause, doubling, for up to the worker's time limit. Any other refusal
//! (the lambda failed to load, is not a function, nests calls too deep...) fails the map as a
//! whole while nothing has run yet; after that, the items still waiting get it as their
//! outcome.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::stream::{FuturesUnordered, StreamExt};
use serde_json::value::RawValue;
use serde_json::{json, Value};
use sprout_sandbox::channel::Request;

use async_trait::async_trait;
use sprout_engine::handler_error;
use sprout_engine::Invocation;
use sprout_engine::Trigger;
use sprout_engine::{BatchCalls, Call, Error, ErrorCode, Invoker, Lambda};

use crate::map_plan::{Planner, SandboxFailure, Settled, Sizing};

/// The most items one map takes.
pub const MAX_ITEMS: usize = 100_000;
/// The first pause before a chunk refused for want of room is sent again.
const FIRST_PAUSE: Duration = Duration::from_millis(10);
/// The longest such pause.
const LONGEST_PAUSE: Duration = Duration::from_millis(500);

/// One map to run.
pub struct MapJob<'a> {
    pub lambda: Arc<Lambda>,
    /// The items, as the body's JSON text.
    pub items: Vec<&'a RawValue>,
    pub sizing: Sizing,
    /// The map's request id: each chunk's too (its log entries are the map's).
    pub request_id: Arc<str>,
    pub trigger: Trigger,
    /// When a handler's map must be over (its caller's time limit); None: each chunk has the
    /// worker's time limit.
    pub deadline: Option<Instant>,
    /// How many calls deep the chunks run.
    pub depth: u32,
    /// Who asked (the chunks' `remote_addr`).
    pub remote_addr: String,
}

/// A map's outcomes, one per item in the items' order, and what it took.
pub struct Mapped {
    pub outcomes: Vec<Box<RawValue>>,
    /// Invocations made.
    pub chunks: u64,
    /// Items run again.
    pub retries: u64,
}

impl Mapped {
    /// The outcomes as one JSON array.
    pub fn body(&self) -> Vec<u8> {
        json_array(self.outcomes.iter().map(|o| o.get()))
    }
}

/// A JSON array of these JSON texts.
fn json_array<'a>(texts: impl Iterator<Item = &'a str>) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.push(b'[');
    for (i, text) in texts.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(text.as_bytes());
    }
    out.push(b']');
    out
}

/// Refuse, before any sandbox, a lambda that is a WSGI or ASGI app by its `ol.yaml`; one
/// whose entry module only turns out to be one is refused by its helper, with the same error.
pub fn check_function(lambda: &Lambda) -> Result<(), Error> {
    let env = &lambda.config.environment;
    match ["OL_WSGI_ENTRY", "OL_ASGI_ENTRY"].into_iter().find(|key| env.contains_key(*key)) {
        Some(key) => Err(not_a_function(&lambda.name, &format!("its ol.yaml names an app ({key})"))),
        None => Ok(()),
    }
}

fn not_a_function(name: &str, why: &str) -> Error {
    Error::new(ErrorCode::NotAFunction, format!("lambda {name:?} is a web app, not a function f(event), so it cannot map: {why}"))
        .with("lambda", name)
}

/// The items of a map's body: a JSON array of at most [`MAX_ITEMS`].
pub fn parse_items(body: &[u8]) -> Result<Vec<&RawValue>, Error> {
    let items: Vec<&RawValue> = serde_json::from_slice(body)
        .map_err(|e| Error::new(ErrorCode::InvalidJson, format!("a map's body must be a JSON array of events: {e}")))?;
    if items.len() > MAX_ITEMS {
        let message = format!("a map takes at most {MAX_ITEMS} items, not {}", items.len());
        return Err(Error::new(ErrorCode::PayloadTooLarge, message));
    }
    Ok(items)
}

/// Run `job`: every item's outcome, or the error that stopped the map before anything ran.
pub async fn run(invoker: &Arc<Invoker>, job: MapJob<'_>) -> Result<Mapped, Error> {
    let MapJob { lambda, items, sizing, request_id, trigger, deadline, depth, remote_addr } = job;
    let runners = invoker.max_per_lambda().max(1);
    let mut planner = Planner::new(items.len(), runners, sizing);
    let request = Request {
        method: "POST".into(),
        script_name: format!("/map/{}", lambda.name),
        path: "/".into(),
        query: String::new(),
        headers: vec![("Content-Type".into(), "application/json".into())],
        protocol: "HTTP/1.1".into(),
        remote_addr,
        depth,
        request_id: String::new(), // the invoker's
        batch: true,
    };
    let name = lambda.name.clone();
    let sender = Arc::new(ChunkSender { invoker: invoker.clone(), lambda, request, request_id, trigger, deadline, depth });
    let mut outcomes: Vec<Option<Box<RawValue>>> = (0..items.len()).map(|_| None).collect();
    let mut running = FuturesUnordered::new();
    let mut refused: Option<Error> = None;
    let mut ran = false;
    loop {
        while refused.is_none() && running.len() < runners {
            let Some(chunk) = planner.next() else { break };
            let body = json_array(items[chunk.items.clone()].iter().map(|item| item.get()));
            // A task of its own: a chunk under way ends properly (its sandbox returned or
            // destroyed) even if the map is cut off meanwhile.
            let task = tokio::spawn(sender.clone().send(chunk.len(), body));
            running.push(async move { (chunk, task.await) });
        }
        let Some((chunk, joined)) = running.next().await else { break };
        let end = joined.unwrap_or_else(|e| ChunkEnd::Refused(Error::new(ErrorCode::Internal, format!("a chunk's task failed: {e}"))));
        match end {
            ChunkEnd::Ran { outcomes: got, took } => {
                ran = true;
                planner.ran(&chunk, took);
                for (i, outcome) in chunk.items.zip(got) {
                    outcomes[i] = Some(outcome);
                }
            }
            ChunkEnd::SandboxFailed(failure, e) => {
                ran = true;
                let first = chunk.items.start;
                if let Settled::Failed(_) = planner.failed(chunk, failure) {
                    outcomes[first] = Some(error_outcome(&e));
                }
            }
            // Chunks under way finish on their own.
            ChunkEnd::Refused(e) if !ran => return Err(e),
            ChunkEnd::Refused(e) => {
                refused.get_or_insert(e);
            }
        }
    }
    debug_assert!(refused.is_some() || planner.is_done());
    let waiting = refused.map(|e| error_outcome(&e));
    let outcomes: Vec<Box<RawValue>> = outcomes
        .into_iter()
        .map(|o| o.or_else(|| waiting.clone()).unwrap_or_else(|| error_outcome(&Error::new(ErrorCode::Internal, "no outcome"))))
        .collect();
    invoker.metrics().map_items(&name, outcomes.iter().map(|o| outcome_code(o)));
    Ok(Mapped { outcomes, chunks: planner.chunks(), retries: planner.retries() })
}

/// How a chunk ended.
enum ChunkEnd {
    /// It ran, and these are its items' outcomes; its sandbox took `took`.
    Ran { outcomes: Vec<Box<RawValue>>, took: Duration },
    /// Its sandbox failed (the error says how).
    SandboxFailed(SandboxFailure, Error),
    /// It was refused, without running.
    Refused(Error),
}

/// Sends the chunks of one map, each with the same request, id and limits.
struct ChunkSender {
    invoker: Arc<Invoker>,
    lambda: Arc<Lambda>,
    request: Request,
    request_id: Arc<str>,
    trigger: Trigger,
    deadline: Option<Instant>,
    depth: u32,
}

impl ChunkSender {
    /// Run one chunk of `len` items, `body` their JSON array, sending it again while it is
    /// refused for want of room.
    async fn send(self: Arc<Self>, len: usize, body: Vec<u8>) -> ChunkEnd {
        let first_sent = Instant::now();
        let mut pause = FIRST_PAUSE;
        loop {
            let limit = match self.deadline {
                Some(deadline) => deadline.saturating_duration_since(Instant::now()).min(self.invoker.timeout()),
                None => self.invoker.timeout(),
            };
            if limit.is_zero() {
                return ChunkEnd::Refused(Error::new(ErrorCode::Timeout, "the caller's time limit has passed"));
            }
            let call = Call {
                lambda: self.lambda.clone(),
                request: self.request.clone(),
                body: &body,
                request_id: self.request_id.clone(),
                trigger: self.trigger.clone(),
                limit,
                depth: self.depth,
            };
            let e = match self.invoker.invoke(call).await {
                Ok(invocation) => return chunk_end(invocation, len, &self.lambda.name),
                Err(e) => e,
            };
            let out_of_time = self.deadline.is_some_and(|d| Instant::now() >= d);
            let failure = match e.code {
                _ if out_of_time => return ChunkEnd::Refused(e),
                ErrorCode::SandboxCrashed => SandboxFailure::Crashed,
                ErrorCode::OutOfMemory => SandboxFailure::OutOfMemory,
                ErrorCode::Timeout => SandboxFailure::Timeout,
                ErrorCode::QueueFull | ErrorCode::QueueTimeout | ErrorCode::MemoryBudget
                    if first_sent.elapsed() + pause < self.invoker.timeout() =>
                {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(LONGEST_PAUSE);
                    continue;
                }
                _ => return ChunkEnd::Refused(e),
            };
            return ChunkEnd::SandboxFailed(failure, e);
        }
    }
}

/// What the reply to a chunk of `len` items of lambda `name` says: their outcomes, or the
/// helper's refusal.
fn chunk_end(invocation: Invocation, len: usize, name: &str) -> ChunkEnd {
    let took = invocation.ran;
    if let Some(e) = handler_error(&invocation.reply) {
        if e.code == ErrorCode::NotAFunction {
            return ChunkEnd::Refused(not_a_function(name, e.message()).counted());
            // by the invoker
        }
        // Nothing a function's helper answers a well-formed chunk with (the handler misused
        // its channel): every item's outcome.
        return ChunkEnd::Ran { outcomes: vec![error_outcome(&e); len], took };
    }
    let outcomes = match serde_json::from_slice::<Vec<Box<RawValue>>>(&invocation.body) {
        Ok(outcomes) if outcomes.len() == len => outcomes,
        Ok(outcomes) => {
            let message = format!("the handler answered {} outcomes for a chunk of {len} items", outcomes.len());
            vec![error_outcome(&Error::new(ErrorCode::InvalidResult, message)); len]
        }
        Err(e) => {
            let message = format!("the handler's outcomes are not a JSON array: {e}");
            vec![error_outcome(&Error::new(ErrorCode::InvalidResult, message)); len]
        }
    };
    ChunkEnd::Ran { outcomes, took }
}

/// An item's outcome for an error: `{"error": code, "message": ..., "traceback": ...}`.
fn error_outcome(e: &Error) -> Box<RawValue> {
    let outcome =
        json!({"error": e.code.as_str(), "message": e.message(), "traceback": e.get("traceback").cloned().unwrap_or(Value::Null)});
    RawValue::from_string(outcome.to_string()).expect("a JSON value's text is JSON")
}

/// An outcome's error code, or `ok`: one of the codes the API knows (any other is a handler
/// exception), for the metrics.
fn outcome_code(outcome: &RawValue) -> &'static str {
    #[derive(serde::Deserialize)]
    struct Head {
        error: Option<String>,
    }
    let text = outcome.get();
    if text.starts_with("{\"result\"") {
        return "ok"; // how the helper writes every result
    }
    match serde_json::from_str::<Head>(text) {
        Ok(Head { error: None }) => "ok",
        Ok(Head { error: Some(code) }) => {
            ErrorCode::ALL.iter().find(|c| c.as_str() == code).unwrap_or(&ErrorCode::HandlerException).as_str()
        }
        Err(_) => ErrorCode::InvalidResult.as_str(),
    }
}

/// Handlers' maps: the invoker's [`BatchCalls`].
pub struct MapCalls;

#[async_trait]
impl BatchCalls for MapCalls {
    async fn call(
        &self,
        invoker: &Arc<Invoker>,
        name: &str,
        event: Bytes,
        time_left: Duration,
        depth: u32,
        caller: Arc<str>,
    ) -> (Value, Bytes) {
        call(invoker, name, event, time_left, depth, caller).await
    }
}

/// A handler's map (its channel call with `batch`): the frame sent back to it, the map's
/// outcomes with `{"status": 200, "request_id": ..., "chunks": ..., "retries": ...}`, or the
/// error's body with its status. It runs `depth` calls deep, within `time_left`.
async fn call(invoker: &Arc<Invoker>, name: &str, event: Bytes, time_left: Duration, depth: u32, caller: Arc<str>) -> (Value, Bytes) {
    let deadline = Instant::now() + time_left;
    let request_id = invoker.new_id();
    let mapped = async {
        let lambda = invoker.lambda(name)?;
        check_function(&lambda)?;
        let max_body = invoker.limits().max_body;
        if event.len() > max_body {
            return Err(Error::new(ErrorCode::PayloadTooLarge, format!("the events exceed the limit of {max_body} bytes")));
        }
        let items = parse_items(&event)?;
        let trigger = Trigger::Invoke { caller };
        let job = MapJob {
            lambda,
            items,
            sizing: Sizing::Adaptive,
            request_id: request_id.clone(),
            trigger,
            deadline: Some(deadline),
            depth,
            remote_addr: String::new(),
        };
        run(invoker, job).await
    };
    match mapped.await {
        Ok(m) => {
            let header = json!({"status": 200, "request_id": &*request_id, "chunks": m.chunks, "retries": m.retries});
            (header, Bytes::from(m.body()))
        }
        Err(e) => (e.with("request_id", &*request_id).into_call_reply(), Bytes::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_are_the_bodys_own_text_and_outcomes_join_back_into_an_array() {
        let body = br#"[1, {"a": [2, "x"]},"\u00e9" , null]"#;
        let items = parse_items(body).unwrap();
        let texts: Vec<&str> = items.iter().map(|i| i.get()).collect();
        assert_eq!(texts, ["1", r#"{"a": [2, "x"]}"#, r#""\u00e9""#, "null"]);
        assert_eq!(json_array(texts[1..3].iter().copied()), br#"[{"a": [2, "x"]},"\u00e9"]"#);
        assert_eq!(json_array(std::iter::empty()), b"[]");
    }

    #[test]
    fn a_body_that_is_no_array_or_too_long_is_refused() {
        for body in [&b"{}"[..], b"", b"[1,", b"\"x\"", b"[1] 2"] {
            assert_eq!(parse_items(body).unwrap_err().code, ErrorCode::InvalidJson, "{body:?}");
        }
        let long = format!("[{}0]", "0,".repeat(MAX_ITEMS));
        assert_eq!(parse_items(long.as_bytes()).unwrap_err().code, ErrorCode::PayloadTooLarge);
    }

    #[test]
    fn outcomes_are_counted_by_a_known_code() {
        let raw = |s: &str| RawValue::from_string(s.to_string()).unwrap();
        assert_eq!(outcome_code(&raw(r#"{"result": {"error": 1}}"#)), "ok");
        assert_eq!(outcome_code(&raw(r#"{"error": "handler_exception", "message": "x", "traceback": "t"}"#)), "handler_exception");
        assert_eq!(outcome_code(&raw(r#"{"error": "made_up"}"#)), "handler_exception");
        assert_eq!(outcome_code(&error_outcome(&Error::new(ErrorCode::OutOfMemory, "m"))), "out_of_memory");
    }

    #[test]
    fn an_error_outcome_carries_code_message_and_traceback() {
        let e = Error::new(ErrorCode::SandboxCrashed, "it died").with("traceback", "tb");
        let outcome: Value = serde_json::from_str(error_outcome(&e).get()).unwrap();
        assert_eq!(outcome, json!({"error": "sandbox_crashed", "message": "it died", "traceback": "tb"}));
    }
}
