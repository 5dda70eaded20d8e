//! A handler's calls to other lambdas (`sprout.invoke`), arriving over its sandbox's own
//! channel: each runs as `POST /run/<name>` with the event as its body would, with the same
//! limits and error codes, within what is left of the caller's time limit, and at most
//! `limits.max_invoke_depth` calls deep. The channel carries nothing else a handler could
//! ask of the worker: a lambda can call others, never deploy, replace or delete one.

use std::time::{Duration, Instant};

use async_trait::async_trait;

use bytes::Bytes;
use serde_json::{json, Value};
use sprout_sandbox::channel::Request;
use sprout_sandbox::Calls;

use crate::api::{failure_response, handler_error, Api, ApiError, ErrorCode};
use crate::registry::valid_name;

/// Answers the calls of a handler serving a request `depth` calls deep.
pub struct LambdaCalls {
    api: Api,
    depth: u32,
}

impl LambdaCalls {
    pub fn new(api: Api, depth: u32) -> LambdaCalls {
        LambdaCalls { api, depth }
    }
}

#[async_trait]
impl Calls for LambdaCalls {
    async fn call(&self, lambda: &str, event: Bytes, time_left: Duration) -> (Value, Bytes) {
        let (api, name, depth) = (self.api.clone(), lambda.to_string(), self.depth + 1);
        // A task of its own: the callee's sandbox is returned (or destroyed) properly even if
        // the caller's request is cut off meanwhile; it ends within `time_left` anyway.
        match tokio::spawn(run_call(api, name, event, time_left, depth)).await {
            Ok(reply) => reply,
            Err(e) => (ApiError::new(ErrorCode::Internal, e.to_string()).into_call_reply(), Bytes::new()),
        }
    }
}

fn refuse(code: ErrorCode, message: String) -> (Value, Bytes) {
    (ApiError::new(code, message).into_call_reply(), Bytes::new())
}

async fn run_call(api: Api, name: String, event: Bytes, time_left: Duration, depth: u32) -> (Value, Bytes) {
    let started = Instant::now();
    if depth > api.max_invoke_depth {
        let message = format!("calls nest at most {} deep (limits.max_invoke_depth)", api.max_invoke_depth);
        return refuse(ErrorCode::CallDepthExceeded, message);
    }
    if !valid_name(&name) {
        return refuse(ErrorCode::InvalidName, format!("{name:?} is not a lambda name"));
    }
    let Some(lambda) = api.registry.get(&name) else {
        return refuse(ErrorCode::LambdaNotFound, format!("no lambda named {name:?}"));
    };
    if event.len() > api.max_body {
        return refuse(ErrorCode::PayloadTooLarge, format!("the event exceeds the limit of {} bytes", api.max_body));
    }
    if time_left.is_zero() {
        return refuse(ErrorCode::Timeout, "the caller's time limit has passed".into());
    }
    let request = Request {
        method: "POST".into(),
        script_name: format!("/run/{name}"),
        path: "/".into(),
        query: String::new(),
        headers: vec![("Content-Type".into(), "application/json".into())],
        protocol: "HTTP/1.1".into(),
        remote_addr: String::new(),
        depth,
    };
    let calls = LambdaCalls::new(api.clone(), depth);
    match api.instances.invoke(&lambda, &request, &event, time_left, &calls).await {
        Err(failure) => (failure_response(failure).with("lambda", name).into_call_reply(), Bytes::new()),
        Ok(invocation) => {
            let reply = invocation.reply;
            let outcome = reply.error.clone().unwrap_or_else(|| "ok".into());
            api.metrics.invocation(&name, invocation.cold, &outcome, started.elapsed());
            match handler_error(&reply) {
                Some(e) => (e.with("lambda", name).into_call_reply(), Bytes::new()),
                None => (json!({"status": reply.status.unwrap_or(200)}), invocation.body),
            }
        }
    }
}
