//! `POST /map/<name>`: a lambda's `f(event)` over each item of the JSON array in the body,
//! spread over its sandboxes ([`sprout_offload::run_map`]); the reply is the array of outcomes, in the
//! items' order. Open without a token, like `/run` ([`crate::auth`]).
//!
//! The query may fix the chunk size (`chunk=N`, 1-1024 items an invocation); by default the
//! worker sizes chunks itself ([`sprout_offload::Sizing`]). Refused before any sandbox runs: an unknown
//! lambda (404), a WSGI or ASGI app (400 `not_a_function`), a body that is not a JSON array
//! (400 `invalid_json`), one over `limits.max_body_mb` or of more than 100,000 items (413).

use std::net::SocketAddr;

use axum::body::Body;
use axum::extract::{ConnectInfo, Path, RawQuery, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;

use sprout_engine::ErrorCode;
use sprout_engine::Trigger;
use sprout_offload::{check_function, parse_items, MapJob, Sizing, MAX_CHUNK};

use crate::http::{fail, read_body, ApiError, RequestId};
use crate::state::Api;

pub async fn map(
    State(api): State<Api>,
    Extension(RequestId(id)): Extension<RequestId>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(name): Path<String>,
    RawQuery(query): RawQuery,
    headers: axum::http::HeaderMap,
    body: Body,
) -> Response {
    let wants_key = api.engine.registry.get(&name).is_some_and(|l| !l.config.auth.is_open());
    if wants_key {
        if let Err(verdict) = api.auth.may_invoke(&headers, &name, api.auth.tenants.owner(&name).as_deref()) {
            return api.auth.refuse_invocation(verdict);
        }
    }
    let mapped = async {
        let sizing = sizing(query.as_deref())?;
        let lambda = api.engine.invoker.lambda(&name)?;
        check_function(&lambda)?;
        let body = read_body(body, api.engine.invoker.limits().max_body).await?;
        let _in_flight = crate::run::admit(&api, &name)?;
        let items = parse_items(&body)?;
        let job = MapJob {
            lambda,
            items,
            sizing,
            request_id: id,
            trigger: Trigger::Http,
            deadline: None,
            depth: 0,
            remote_addr: peer.ip().to_string(),
        };
        Ok::<_, ApiError>(sprout_offload::run_map(&api.engine.invoker, job).await?)
    };
    let mapped = match mapped.await {
        Ok(m) => m,
        Err(e) => return fail(e),
    };
    let mut response = (StatusCode::OK, [(header::CONTENT_TYPE, "application/json")], mapped.body()).into_response();
    let h = response.headers_mut();
    h.insert("x-sprout-worker", api.worker_name.clone());
    h.insert("x-sprout-map-chunks", HeaderValue::from(mapped.chunks));
    h.insert("x-sprout-map-retries", HeaderValue::from(mapped.retries));
    response
}

/// How the query says to size chunks: `chunk=N` (1-1024), or the worker's choice.
fn sizing(query: Option<&str>) -> Result<Sizing, ApiError> {
    let mut sizing = Sizing::Adaptive;
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("chunk", n)) => match n.parse::<usize>() {
                Ok(n) if (1..=MAX_CHUNK).contains(&n) => sizing = Sizing::Fixed(n),
                _ => return Err(ApiError::new(ErrorCode::InvalidRequest, format!("chunk must be 1 to {MAX_CHUNK} items, not {n:?}"))),
            },
            _ => return Err(ApiError::new(ErrorCode::InvalidRequest, format!("unknown map parameter {pair:?} (known: chunk)"))),
        }
    }
    Ok(sizing)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_query_fixes_the_chunk_size_or_leaves_it_to_the_worker() {
        assert_eq!(sizing(None).unwrap(), Sizing::Adaptive);
        assert_eq!(sizing(Some("")).unwrap(), Sizing::Adaptive);
        assert_eq!(sizing(Some("chunk=1")).unwrap(), Sizing::Fixed(1));
        assert_eq!(sizing(Some("chunk=1024")).unwrap(), Sizing::Fixed(1024));
        for bad in ["chunk=0", "chunk=1025", "chunk=x", "chunk", "size=3", "chunk=2&x=1"] {
            assert_eq!(sizing(Some(bad)).unwrap_err().code, ErrorCode::InvalidRequest, "{bad}");
        }
    }
}
