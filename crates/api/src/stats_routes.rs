//! What the worker reports: `GET /stats` (JSON figures of every part), `GET /metrics`
//! (Prometheus text) and `GET /packages` (the install cache's packages).

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use crate::state::Api;

pub(crate) async fn stats(State(api): State<Api>) -> Response {
    let mut lambdas = api.engine.instances.stats();
    let handler_cache = lambdas.as_object_mut().and_then(|o| o.remove("handler_cache")).unwrap_or(Value::Null);
    let mut out = api.engine.metrics.stats(lambdas);
    out["handler_cache"] = handler_cache;
    out["install_cache"] = api.engine.packages.stats();
    out["import_cache"] = api.engine.metrics.import_cache_stats();
    out["network"] = api.engine.networks.stats();
    out["kafka"] = api.kafka.stats();
    out["leases"] = api.leases.stats();
    // Each lambda's invocations since the worker started (its sandboxes may all be gone).
    out["lambda_invocations"] = api
        .engine
        .metrics
        .lambda_counts()
        .into_iter()
        .map(|(name, invocations, cold, errors)| (name, json!({"invocations": invocations, "cold_starts": cold, "errors": errors})))
        .collect::<serde_json::Map<String, Value>>()
        .into();
    axum::Json(out).into_response()
}

pub(crate) async fn list_packages(State(api): State<Api>) -> Response {
    let packages = api.engine.packages.clone();
    let list = tokio::task::spawn_blocking(move || packages.cache().list()).await.unwrap_or_default();
    axum::Json(list).into_response()
}

pub(crate) async fn metrics(State(api): State<Api>) -> Response {
    let text = api.engine.metrics.prometheus() + &api.usage.prometheus(&api.engine.logs.group_dropped());
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response()
}
