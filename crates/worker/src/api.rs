//! The HTTP edge: OpenLambda's worker API.
//!
//! | Route                          | Does                                                      |
//! |--------------------------------|-----------------------------------------------------------|
//! | `POST /run/<name>[/<path>]`    | runs the lambda: JSON to `f(event)`, or HTTP to a WSGI `app` |
//! | `POST /registry/<name>`        | uploads a tar.gz of the lambda's directory (201)          |
//! | `GET /registry`                | lists lambda names                                        |
//! | `GET /registry/<name>`         | the lambda's metadata                                     |
//! | `DELETE /registry/<name>`      | removes it                                                |
//! | `GET /status`, `/pid`          | `ready`, the worker's pid                                 |
//! | `GET /stats`, `GET /metrics`   | JSON figures; Prometheus text                             |
//! | `GET /packages`                | the install cache's packages                              |
//!
//! Every route but `/run/...` and `GET /status` needs the worker's token ([`crate::auth`]).
//!
//! Every failure answers with JSON `{"error": <code>, "message": ...}` and a status that says
//! whose fault it was; the codes are [`ErrorCode`]'s and never change meaning. The app port
//! ([`crate::app`]) sends requests to its lambda through the same [`forward`] as `/run`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::{ConnectInfo, Path, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use axum::Router;
use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use serde_json::{json, Value};
use sprout_sandbox::channel::Request;

use crate::auth::{require_token, Guard};
use crate::calls::LambdaCalls;
pub use crate::errors::ErrorCode;
use crate::instances::{Failure, Instances};
use crate::metrics::Metrics;
use crate::networks::LambdaNetworks;
use crate::packages::Packages;
use crate::registry::{valid_name, Registry};

#[derive(Clone)]
pub struct Api {
    pub registry: Arc<Registry>,
    pub instances: Arc<Instances>,
    pub packages: Arc<Packages>,
    /// The lambdas' network namespaces (a deleted lambda's goes with its last sandbox).
    pub networks: Arc<LambdaNetworks>,
    pub metrics: Arc<Metrics>,
    /// Who may use the API, and the token lambdas must never see.
    pub auth: Arc<Guard>,
    pub max_body: usize,
    pub max_upload: usize,
    /// How deep handlers' calls to other lambdas may nest.
    pub max_invoke_depth: u32,
    /// The lambdas' Kafka consumers.
    pub kafka: Arc<crate::kafka::KafkaTriggers>,
    /// The app port's sites by host (None: no app port).
    pub sites: Option<Arc<crate::sites::Sites>>,
    /// The fleet's shared registry, when this worker belongs to one.
    pub shared: Option<Arc<crate::shared_registry::SharedRegistry>>,
    /// The fleet HAProxy's routes map, kept for the lambdas uploaded or deleted here.
    pub routes: Option<crate::fleet_routes::FleetRoutes>,
    /// This worker's name, sent with every invocation's reply (`x-sprout-worker`), so a
    /// client behind a load balancer can tell which worker served it.
    pub worker_name: HeaderValue,
}

pub(crate) struct ApiError {
    code: ErrorCode,
    body: Value,
}

impl ApiError {
    pub(crate) fn new(code: ErrorCode, message: impl Into<String>) -> ApiError {
        ApiError { code, body: json!({"error": code.as_str(), "message": message.into()}) }
    }

    pub(crate) fn with(mut self, key: &str, value: impl Into<Value>) -> ApiError {
        self.body[key] = value.into();
        self
    }

    /// The JSON body, with the status in it (how a handler's call learns of the error).
    pub(crate) fn into_call_reply(self) -> Value {
        let mut body = self.body;
        body["status"] = self.code.status().as_u16().into();
        body
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.code.status(), [(header::CONTENT_TYPE, "application/json")], self.body.to_string()).into_response();
        response.extensions_mut().insert(self.code);
        response
    }
}

/// Build the router: every route, and the fallbacks, behind the token check. Errors are
/// counted in `metrics` by code.
pub fn router(api: Api) -> Router {
    Router::new()
        .route("/run/{name}", any(run))
        .route("/run/{name}/", any(run))
        .route("/run/{name}/{*rest}", any(run))
        .route("/registry", get(list_lambdas))
        .route("/registry/{name}", get(show_lambda).post(upload).put(upload).delete(delete_lambda))
        .route("/status", get(|| async { "ready\n" }))
        .route("/pid", get(|| async { format!("{}\n", std::process::id()) }))
        .route("/stats", get(stats))
        .route("/metrics", get(metrics))
        .route("/packages", get(list_packages))
        .route("/sites", get(crate::site_routes::list))
        .route("/sites/{host}", axum::routing::put(crate::site_routes::put).delete(crate::site_routes::delete))
        .fallback(|| async { ApiError::new(ErrorCode::NotFound, "no such endpoint") })
        .method_not_allowed_fallback(|| async { ApiError::new(ErrorCode::MethodNotAllowed, "method not allowed here") })
        .layer(axum::middleware::from_fn_with_state(api.auth.clone(), require_token))
        .layer(axum::middleware::map_response_with_state(api.clone(), count_errors))
        .with_state(api)
}

/// Count every error response by its code (each carries its [`ErrorCode`]).
pub(crate) async fn count_errors(State(api): State<Api>, response: Response) -> Response {
    if let Some(code) = response.extensions().get::<ErrorCode>() {
        api.metrics.error(*code);
    }
    response
}

/// An error as the response it is.
pub(crate) fn fail(e: ApiError) -> Response {
    e.into_response()
}

pub(crate) async fn read_body(body: Body, limit: usize) -> Result<Bytes, ApiError> {
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() => {
            Err(ApiError::new(ErrorCode::PayloadTooLarge, format!("the request body exceeds the limit of {} bytes", limit)))
        }
        Err(e) => Err(ApiError::new(ErrorCode::InvalidRequest, format!("reading the body: {e}"))),
    }
}

const HOP_BY_HOP: [&str; 8] =
    ["connection", "keep-alive", "transfer-encoding", "content-length", "upgrade", "te", "trailer", "proxy-connection"];

async fn run(
    State(api): State<Api>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    match run_lambda(&api, peer, method, uri, headers, body).await {
        Ok(r) => r,
        Err(e) => fail(e),
    }
}

async fn run_lambda(api: &Api, peer: SocketAddr, method: Method, uri: Uri, headers: HeaderMap, body: Body) -> Result<Response, ApiError> {
    let after = uri.path().strip_prefix("/run/").unwrap_or("");
    let (raw_name, rest) = after.split_at(after.find('/').unwrap_or(after.len()));
    let target = Target {
        name: percent_encoding::percent_decode_str(raw_name)
            .decode_utf8()
            .ok()
            .filter(|n| valid_name(n))
            .map(String::from)
            .unwrap_or_default(),
        shown: raw_name.to_string(),
        script_name: format!("/run/{raw_name}"),
        path: if rest.is_empty() { "/".to_string() } else { rest.to_string() },
    };
    forward(api, target, peer, method, &uri, headers, body).await
}

/// Which lambda a request goes to, and where the WSGI app sees it: `SCRIPT_NAME` and
/// `PATH_INFO` (still percent-encoded; the helper decodes it).
pub(crate) struct Target {
    /// The lambda's name; empty when the request named no valid one.
    pub name: String,
    /// The name as the request gave it, for messages.
    pub shown: String,
    pub script_name: String,
    pub path: String,
}

/// Run `target`'s lambda on the request and turn its reply into the response: the path both
/// `/run/<name>/...` and the app port take.
pub(crate) async fn forward(
    api: &Api,
    target: Target,
    peer: SocketAddr,
    method: Method,
    uri: &Uri,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let started = Instant::now();
    let Target { name, shown, script_name, path } = target;
    let Some(lambda) = api.registry.get(&name) else {
        return Err(ApiError::new(ErrorCode::LambdaNotFound, format!("no lambda named {shown:?}")));
    };
    if !lambda.config.allows(method.as_str()) {
        return Ok(method_not_allowed(&lambda.config, &method));
    }
    let body = read_body(body, api.max_body).await?;
    let is_head = method == Method::HEAD;
    let request = Request {
        method: method.to_string(),
        script_name,
        path,
        query: uri.query().unwrap_or("").to_string(),
        headers: headers
            .iter()
            .filter(|(k, v)| !api.auth.is_worker_credential(k.as_str(), v))
            .filter_map(|(k, v)| v.to_str().ok().map(|v| (k.as_str().to_string(), v.to_string())))
            .collect(),
        protocol: "HTTP/1.1".into(),
        remote_addr: peer.ip().to_string(),
        depth: 0,
    };
    let calls = LambdaCalls::new(api.clone(), 0);
    let outcome = api.instances.invoke(&lambda, &request, &body, api.instances.timeout(), &calls).await;
    let invocation = match outcome {
        Ok(i) => i,
        Err(failure) => return Err(failure_response(failure).with("lambda", name)),
    };
    let start = if invocation.cold { "cold" } else { "warm" };
    let reply = invocation.reply;
    let outcome_code = reply.error.as_deref().unwrap_or("ok").to_string();
    api.metrics.invocation(&name, invocation.cold, &outcome_code, started.elapsed());
    let mut response = if let Some(e) = handler_error(&reply) {
        fail(e.with("lambda", name))
    } else {
        let status = reply.status.and_then(|s| StatusCode::from_u16(s).ok()).unwrap_or(StatusCode::OK);
        let mut out = Response::builder().status(status);
        for (k, v) in &reply.headers {
            let lower = k.to_ascii_lowercase();
            // A reply to HEAD has no body but says how long the GET's would be.
            if HOP_BY_HOP.contains(&lower.as_str()) && !(is_head && lower == "content-length") {
                continue;
            }
            match (HeaderName::from_bytes(k.as_bytes()), HeaderValue::from_str(v)) {
                (Ok(k), Ok(v)) => out = out.header(k, v),
                _ => {
                    return Err(
                        ApiError::new(ErrorCode::InvalidResult, format!("the handler sent an invalid header {k:?}")).with("lambda", name)
                    )
                }
            }
        }
        out.body(Body::from(invocation.body)).unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
    };
    let h = response.headers_mut();
    h.insert("x-sprout-start", HeaderValue::from_static(start));
    h.insert("x-sprout-sandbox", HeaderValue::from(invocation.sandbox));
    h.insert("x-sprout-worker", api.worker_name.clone());
    Ok(response)
}

/// A method the lambda's `ol.yaml` does not accept: 405 with OpenLambda's own body, and the
/// methods it does accept in `Allow`.
fn method_not_allowed(config: &crate::lambda_config::LambdaConfig, method: &Method) -> Response {
    let allow = config.http_methods.as_deref().unwrap_or_default().join(", ");
    let mut response = (StatusCode::METHOD_NOT_ALLOWED, config.not_allowed_body(method.as_str())).into_response();
    let h = response.headers_mut();
    h.insert(axum::http::header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    if let Ok(allow) = HeaderValue::from_str(&allow) {
        h.insert(axum::http::header::ALLOW, allow);
    }
    response
}

/// The error a handler's reply reports, if it reports one.
pub(crate) fn handler_error(reply: &sprout_sandbox::channel::Reply) -> Option<ApiError> {
    let code = ErrorCode::from_handler(reply.error.as_deref()?);
    let mut e = ApiError::new(code, reply.message.clone().unwrap_or_default());
    if let Some(tb) = &reply.traceback {
        e = e.with("traceback", tb.clone());
    }
    Some(e)
}

pub(crate) fn failure_response(failure: Failure) -> ApiError {
    let message = failure.to_string();
    match failure {
        Failure::QueueFull(_) => ApiError::new(ErrorCode::QueueFull, message),
        Failure::QueueTimeout(_) => ApiError::new(ErrorCode::QueueTimeout, message),
        Failure::NoMemory(_) => ApiError::new(ErrorCode::MemoryBudget, message),
        Failure::ShuttingDown => ApiError::new(ErrorCode::ShuttingDown, message),
        Failure::Load { traceback, .. } => {
            let e = ApiError::new(ErrorCode::LoadError, message);
            match traceback {
                Some(tb) => e.with("traceback", tb),
                None => e,
            }
        }
        Failure::Platform(_) => ApiError::new(ErrorCode::SandboxStartFailed, message),
        Failure::Install(e) => {
            let mut err = ApiError::new(ErrorCode::InstallFailed, message).with("pip_output", e.output);
            if let Some(package) = e.package {
                err = err.with("package", package);
            }
            err
        }
        Failure::Sandbox(e) => match e {
            sprout_sandbox::InvokeError::Timeout(_) => ApiError::new(ErrorCode::Timeout, message),
            sprout_sandbox::InvokeError::OutOfMemory { .. } => ApiError::new(ErrorCode::OutOfMemory, message),
            sprout_sandbox::InvokeError::Crashed { .. } => ApiError::new(ErrorCode::SandboxCrashed, message),
        },
    }
}

async fn upload(State(api): State<Api>, Path(name): Path<String>, body: Body) -> Response {
    let data = match read_body(body, api.max_upload).await {
        Ok(d) => d,
        Err(e) => return fail(e),
    };
    let registry = api.registry.clone();
    let archive = data.clone(); // Bytes: shared, not copied; for the shared registry
    let result = tokio::task::spawn_blocking(move || registry.upload(&name, &data)).await;
    match result {
        Ok(Ok(lambda)) => {
            tracing::info!(lambda = %lambda.name, version = lambda.version, files = lambda.files, "lambda uploaded");
            uploaded(&api, &lambda, true);
            if let Some(shared) = &api.shared {
                if let Err(e) = shared.publish(&lambda.name, &lambda.sha256, &archive).await {
                    let message = format!("the lambda is stored on this worker but not in the fleet's shared registry, so the other workers do not have it; upload it again: {e:#}");
                    return fail(ApiError::new(ErrorCode::SharedRegistryUnavailable, message).with("lambda", lambda.name.clone()));
                }
            }
            (StatusCode::CREATED, axum::Json(json!(*lambda))).into_response()
        }
        Ok(Err(e)) => {
            let mut err = ApiError::new(e.code(), e.to_string());
            match &e {
                crate::registry::UploadError::Syntax(s) => err = err.with("line", s.line).with("offset", s.offset),
                crate::registry::UploadError::Config(c) => err = err.with("line", c.line),
                _ => {}
            }
            fail(err)
        }
        Err(e) => fail(ApiError::new(ErrorCode::Internal, e.to_string())),
    }
}

async fn list_lambdas(State(api): State<Api>) -> Response {
    let names: Vec<String> = api.registry.list().iter().map(|l| l.name.clone()).collect();
    axum::Json(names).into_response()
}

async fn show_lambda(State(api): State<Api>, Path(name): Path<String>) -> Response {
    match api.registry.get(&name) {
        Some(l) => axum::Json(json!(*l)).into_response(),
        None => fail(ApiError::new(ErrorCode::LambdaNotFound, format!("no lambda named {name:?}"))),
    }
}

async fn delete_lambda(State(api): State<Api>, Path(name): Path<String>) -> Response {
    if !deleted(&api, &name).await {
        return fail(ApiError::new(ErrorCode::LambdaNotFound, format!("no lambda named {name:?}")));
    }
    if let Some(routes) = api.routes.clone() {
        let lambda = name.clone();
        if let Ok(Err(e)) = tokio::task::spawn_blocking(move || routes.set(&lambda, None)).await {
            tracing::warn!(lambda = %name, "removing the lambda's route from the fleet's HAProxy: {e}");
        }
    }
    if let Some(shared) = &api.shared {
        if let Err(e) = shared.delete(&name).await {
            let message = format!("the lambda is deleted on this worker but not in the fleet's shared registry; delete it again: {e:#}");
            return fail(ApiError::new(ErrorCode::SharedRegistryUnavailable, message).with("lambda", name));
        }
    }
    axum::Json(json!({"deleted": name})).into_response()
}

/// What follows a lambda's (new version's) arrival, from an upload or the shared registry:
/// its packages installed ahead of its first request, and its Kafka consumers (the replaced
/// version's stop after their message under way). `took_upload`: this worker took it, so it
/// also keeps the lambda's route in the fleet's HAProxy (`fleet_routes`), once the packages
/// are installed.
pub(crate) fn uploaded(api: &Api, lambda: &Arc<crate::registry::Lambda>, took_upload: bool) {
    let routes = api.routes.clone().filter(|_| took_upload);
    if !lambda.parsed_requirements.is_empty() || routes.is_some() {
        let (packages, reqs, name) = (api.packages.clone(), lambda.parsed_requirements.clone(), lambda.name.clone());
        tokio::spawn(async move {
            if let Err(e) = packages.prefetch(&reqs).await {
                // Reported to requests; the route falls back to the package set.
                tracing::warn!(lambda = %name, "installing the lambda's packages failed: {e}");
            }
            let Some(routes) = routes else { return };
            let done = tokio::task::spawn_blocking(move || {
                let key = crate::fleet_routes::route_key(&reqs, &packages.cache().list());
                routes.set(&name, key.as_deref()).map_err(|e| (name, e))
            })
            .await;
            if let Ok(Err((name, e))) = done {
                tracing::warn!(lambda = %name, "keeping the lambda's route in the fleet's HAProxy: {e}");
            }
        });
    }
    let (kafka_api, name) = (api.clone(), lambda.name.clone());
    tokio::spawn(async move { kafka_api.kafka.sync(&kafka_api, &name).await });
}

/// Delete a lambda here, with its network namespace and Kafka consumers; false when there
/// was none.
pub(crate) async fn deleted(api: &Api, name: &str) -> bool {
    if !api.registry.delete(name) {
        return false;
    }
    api.networks.forget(name).await;
    api.kafka.stop(name).await;
    tracing::info!(lambda = %name, "lambda deleted");
    true
}

async fn stats(State(api): State<Api>) -> Response {
    let mut lambdas = api.instances.stats();
    let handler_cache = lambdas.as_object_mut().and_then(|o| o.remove("handler_cache")).unwrap_or(Value::Null);
    let mut out = api.metrics.stats(lambdas);
    out["handler_cache"] = handler_cache;
    out["install_cache"] = api.packages.stats();
    out["import_cache"] = api.metrics.import_cache_stats();
    out["network"] = api.networks.stats();
    out["kafka"] = api.kafka.stats();
    axum::Json(out).into_response()
}

async fn list_packages(State(api): State<Api>) -> Response {
    let packages = api.packages.clone();
    let list = tokio::task::spawn_blocking(move || packages.cache().list()).await.unwrap_or_default();
    axum::Json(list).into_response()
}

async fn metrics(State(api): State<Api>) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], api.metrics.prometheus()).into_response()
}
