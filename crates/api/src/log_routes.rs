//! The logs' routes: `GET /logs/<name>` (a lambda's entries, or following them as a stream),
//! `GET /logs?request=<id>` (one request's, whatever its lambda) and `GET /stats/history` (each
//! lambda's last hour, for the console's charts).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::body::{Body, Bytes};
use axum::extract::{Extension, Path, RawQuery, State};
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use tokio::sync::broadcast::error::RecvError;

use sprout_engine::valid_name;
use sprout_engine::ErrorCode;
use sprout_engine::{LogEntry as Entry, LogQuery as Query};

use crate::auth::Principal;
use crate::http::{fail, ApiError};
use crate::state::Api;

/// How often a follow stream sends an empty line, so both ends see a dead connection.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

pub async fn lambda_logs(
    State(api): State<Api>,
    Extension(principal): Extension<Principal>,
    Path(name): Path<String>,
    RawQuery(query): RawQuery,
) -> Response {
    let query = match Query::parse(query.as_deref().unwrap_or(""), SystemTime::now()) {
        Ok(q) => q,
        Err(message) => return fail(ApiError::new(ErrorCode::InvalidRequest, message)),
    };
    // A tenant reads its own lambdas' logs only; a lambda deleted since is no tenant's any more,
    // and its logs are the operator's.
    if !valid_name(&name)
        || (api.engine.registry.get(&name).is_none() && !api.engine.logs.has(&name))
        || !principal.sees_lambda(&api.auth.tenants, &name)
    {
        return fail(ApiError::new(ErrorCode::LambdaNotFound, format!("no lambda named {name:?}, and no logs of one")));
    }
    // Subscribed before the backlog is read, so nothing falls between the two.
    let follower = query.follow.then(|| api.engine.logs.follow(&name));
    let (logs, lambda, q) = (api.engine.logs.clone(), name.clone(), query.clone());
    let backlog = match tokio::task::spawn_blocking(move || logs.query(&lambda, &q)).await {
        Ok(entries) => entries,
        Err(e) => return fail(ApiError::new(ErrorCode::Internal, format!("reading the logs: {e}"))),
    };
    let Some(mut follower) = follower else {
        let (lines, bytes) = api.engine.logs.dropped_of(&name);
        let body = json!({"lambda": name, "entries": backlog, "dropped": {"lines": lines, "bytes": bytes}});
        return axum::Json(body).into_response();
    };
    let last_seq = backlog.last().map(|e| e.seq);
    let stream = async_stream(move |tx| async move {
        for entry in backlog {
            if tx.send(ndjson(&entry)).await.is_err() {
                return;
            }
        }
        let mut keep_alive = tokio::time::interval(KEEP_ALIVE);
        keep_alive.tick().await;
        loop {
            let line = tokio::select! {
                got = follower.recv() => match got {
                    Ok(entry) if last_seq.is_some_and(|s| entry.seq <= s) || !query.matches(&entry) => continue,
                    Ok(entry) => ndjson(&entry),
                    Err(RecvError::Lagged(n)) => Bytes::from(format!("{}\n", json!({"type": "skipped", "entries": n, "message": format!("[sprout] {n} entries skipped: this follower fell behind")}))),
                    Err(RecvError::Closed) => return,
                },
                _ = keep_alive.tick() => Bytes::from_static(b"\n"),
            };
            if tx.send(line).await.is_err() {
                return; // the client hung up
            }
        }
    });
    let mut response = Response::new(stream);
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/x-ndjson"));
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

pub async fn find_request(State(api): State<Api>, Extension(principal): Extension<Principal>, RawQuery(query): RawQuery) -> Response {
    let query = match Query::parse(query.as_deref().unwrap_or(""), SystemTime::now()) {
        Ok(q) => q,
        Err(message) => return fail(ApiError::new(ErrorCode::InvalidRequest, message)),
    };
    let Some(id) = query.request else {
        return fail(ApiError::new(
            ErrorCode::InvalidRequest,
            "give the request id: /logs?request=<id> (or /logs/<lambda> for a lambda's)",
        ));
    };
    let logs = api.engine.logs.clone();
    match tokio::task::spawn_blocking(move || logs.find_request(&id)).await {
        Ok(mut entries) => {
            entries.retain(|entry| principal.sees_lambda(&api.auth.tenants, &entry.lambda));
            axum::Json(json!({"entries": entries})).into_response()
        }
        Err(e) => fail(ApiError::new(ErrorCode::Internal, format!("reading the logs: {e}"))),
    }
}

pub async fn history(State(api): State<Api>, Extension(principal): Extension<Principal>) -> Response {
    let mut history = api.engine.metrics.history();
    if let Some(lambdas) = history.get_mut("lambdas").and_then(|l| l.as_object_mut()) {
        lambdas.retain(|name, _| principal.sees_lambda(&api.auth.tenants, name));
    }
    axum::Json(history).into_response()
}

fn ndjson(entry: &Arc<Entry>) -> Bytes {
    let mut line = serde_json::to_vec(&**entry).unwrap_or_default();
    line.push(b'\n');
    Bytes::from(line)
}

/// A streaming body fed by `produce` through a small channel (it stops when the client goes).
fn async_stream<F, Fut>(produce: F) -> Body
where
    F: FnOnce(tokio::sync::mpsc::Sender<Bytes>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Bytes>(64);
    tokio::spawn(produce(tx));
    let stream = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx).map(|o| o.map(Ok::<_, Infallible>)));
    Body::from_stream(stream)
}
