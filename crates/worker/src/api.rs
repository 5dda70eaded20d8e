//! The HTTP edge: OpenLambda's worker API.
//!
//! | Route                          | Does                                                      |
//! |--------------------------------|-----------------------------------------------------------|
//! | `POST /run/<name>[/<path>]`    | runs the lambda: JSON to `f(event)`, or HTTP to a WSGI `app` |
//! | `POST /map/<name>[?chunk=N]`   | runs `f(event)` on each item of a JSON array, in chunks over its sandboxes ([`crate::map_routes`]) |
//! | `POST /leases/<name>`          | holds N sandboxes of the lambda for a client's object (201) ([`crate::lease_routes`]) |
//! | `POST /leases/<id>/<part>`     | runs `f(event)` on that part's sandbox, answering as `/run` |
//! | `POST /leases/<id>/keepalive`  | resets the lease's idle clock                             |
//! | `DELETE /leases/<id>`          | releases the lease (its sandboxes are destroyed)          |
//! | `GET /leases`                  | lists the leases                                          |
//! | `PUT`/`GET /leases/<id>/files/<file>` | writes or reads a file of the lease's directory    |
//! | `PUT`/`GET`/`DELETE /blobs/<name>` | a map's large item or result ([`crate::blobs`])        |
//! | `POST /registry/<name>`        | uploads a tar.gz of the lambda's directory (201)          |
//! | `GET /registry`                | lists lambda names                                        |
//! | `GET /registry/<name>`         | the lambda's metadata                                     |
//! | `DELETE /registry/<name>`      | removes it                                                |
//! | `GET /status`, `/pid`          | `ready`, the worker's pid                                 |
//! | `GET /stats`, `GET /metrics`   | JSON figures; Prometheus text                             |
//! | `GET /packages`                | the install cache's packages                              |
//!
//! Every route but `/run/...`, `/map/...` and `GET /status` needs the worker's token
//! ([`crate::auth`]).
//!
//! Every failure answers with JSON `{"error": <code>, "message": ...}` and a status that says
//! whose fault it was; the codes are [`ErrorCode`]'s and never change meaning. The app port
//! ([`crate::app`]) sends requests to its lambda through the same [`forward`] as `/run`.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{ConnectInfo, Path, RawQuery, Request, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use axum::{Extension, Router};
use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use serde_json::{json, Value};
use sprout_sandbox::channel::Request as SandboxRequest;

use crate::auth::{require_token, Guard};
pub use crate::errors::{ApiError, ErrorCode};
use crate::instances::Instances;
use crate::invoker::{Call, Invoker};
use crate::logs::{Logs, Trigger};
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
    /// The one path every invocation takes.
    pub invoker: Arc<Invoker>,
    /// The user leases: sandboxes held for clients' objects.
    pub leases: Arc<crate::lease_routes::LeaseBook>,
    /// Large items and results of maps, shared with the sandboxes.
    pub blobs: Arc<crate::blobs::Blobs>,
    /// The lambdas' logs.
    pub logs: Arc<Logs>,
    pub max_upload: usize,
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

/// The id of the request being answered, given by [`tag_request`].
#[derive(Clone)]
pub struct RequestId(pub Arc<str>);

/// Build the router: every route, and the fallbacks, behind the token check. Errors are
/// counted in `metrics` by code.
pub fn router(api: Api) -> Router {
    Router::new()
        .route("/run/{name}", any(run))
        .route("/run/{name}/", any(run))
        .route("/run/{name}/{*rest}", any(run))
        .route("/map/{name}", axum::routing::post(crate::map_routes::map))
        .route("/leases", get(crate::lease_routes::list))
        .route("/leases/{key}", axum::routing::post(crate::lease_routes::create).delete(crate::lease_routes::release))
        .route("/leases/{id}/{part}", axum::routing::post(crate::lease_routes::call))
        .route("/leases/{id}/files/{file}", get(crate::lease_routes::get_file).put(crate::lease_routes::put_file))
        .route("/blobs/{name}", get(crate::blobs::get).put(crate::blobs::put).delete(crate::blobs::delete))
        .route("/registry", get(list_lambdas))
        .route("/registry/{name}", get(show_lambda).post(upload).put(upload).delete(delete_lambda))
        .route("/status", get(|| async { "ready\n" }))
        .route("/pid", get(|| async { format!("{}\n", std::process::id()) }))
        .route("/stats", get(stats))
        .route("/stats/history", get(crate::log_routes::history))
        .route("/logs", get(crate::log_routes::find_request))
        .route("/logs/{name}", get(crate::log_routes::lambda_logs))
        .route("/metrics", get(metrics))
        .route("/packages", get(list_packages))
        .route("/sites", get(crate::site_routes::list))
        .route("/sites/{host}", axum::routing::put(crate::site_routes::put).delete(crate::site_routes::delete))
        .merge(crate::console::routes())
        .fallback(|| async { ApiError::new(ErrorCode::NotFound, "no such endpoint") })
        .method_not_allowed_fallback(|| async { ApiError::new(ErrorCode::MethodNotAllowed, "method not allowed here") })
        .layer(axum::middleware::from_fn_with_state(api.auth.clone(), require_token))
        .layer(axum::middleware::map_response_with_state(api.clone(), count_errors))
        .layer(axum::middleware::from_fn_with_state(api.invoker.clone(), tag_request))
        .with_state(api)
}

/// Give every request an id: in its extensions for the handlers, in `X-Sprout-Request-Id` on
/// its reply, and in the body of an error the worker answers with (an [`ApiError`]'s, never a
/// handler's own).
pub(crate) async fn tag_request(State(invoker): State<Arc<Invoker>>, mut request: Request, next: Next) -> Response {
    let id = invoker.new_id();
    request.extensions_mut().insert(RequestId(id.clone()));
    let mut response = next.run(request).await;
    if response.extensions().get::<crate::errors::WorkerError>().is_some() {
        response = with_request_id(response, &id).await;
    }
    if let Ok(value) = HeaderValue::from_str(&id) {
        response.headers_mut().insert(HeaderName::from_static("x-sprout-request-id"), value);
    }
    response
}

/// An error response of the worker's, with `request_id` in its JSON body.
async fn with_request_id(response: Response, id: &str) -> Response {
    let (mut parts, body) = response.into_parts();
    let Ok(bytes) = body.collect().await.map(|b| b.to_bytes()) else {
        return Response::from_parts(parts, Body::empty());
    };
    match serde_json::from_slice::<Value>(&bytes) {
        Ok(Value::Object(mut map)) => {
            map.insert("request_id".into(), Value::from(id));
            parts.headers.remove(header::CONTENT_LENGTH);
            Response::from_parts(parts, Body::from(Value::Object(map).to_string()))
        }
        _ => Response::from_parts(parts, Body::from(bytes)),
    }
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
    Extension(RequestId(id)): Extension<RequestId>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
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
        trigger: Trigger::Http,
    };
    match forward(&api, target, id, peer, method, &uri, headers, body).await {
        Ok(mut r) => {
            // In a browser, a lambda's page here runs in an origin of its own: it shares the
            // API's origin, where the console's session would let its scripts read the
            // worker's logs and figures. Sites belong on the app port, which has no session.
            r.headers_mut().append(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(RUN_SANDBOX));
            r
        }
        Err(e) => fail(e),
    }
}

/// The sandbox every `/run` reply is put in for browsers: scripts, forms and pop-ups run, but
/// in an opaque origin, without the worker's cookies or storage.
const RUN_SANDBOX: &str = "sandbox allow-scripts allow-forms allow-popups allow-modals allow-downloads";

/// Which lambda a request goes to, and where the WSGI app sees it: `SCRIPT_NAME` and
/// `PATH_INFO` (still percent-encoded; the helper decodes it).
pub(crate) struct Target {
    /// The lambda's name; empty when the request named no valid one.
    pub name: String,
    /// The name as the request gave it, for messages.
    pub shown: String,
    pub script_name: String,
    pub path: String,
    /// `/run` or the app port.
    pub trigger: Trigger,
}

/// Run `target`'s lambda on the request (through the invoker) and turn its reply into the
/// response: the path both `/run/<name>/...` and the app port take.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn forward(
    api: &Api,
    target: Target,
    request_id: Arc<str>,
    peer: SocketAddr,
    method: Method,
    uri: &Uri,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let Target { name, shown, script_name, path, trigger } = target;
    let Some(lambda) = api.registry.get(&name) else {
        return Err(ApiError::new(ErrorCode::LambdaNotFound, format!("no lambda named {shown:?}")));
    };
    if !lambda.config.allows(method.as_str()) {
        return Ok(method_not_allowed(&lambda.config, &method));
    }
    let body = read_body(body, api.invoker.limits().max_body).await?;
    let is_head = method == Method::HEAD;
    let request = SandboxRequest {
        method: method.to_string(),
        script_name,
        path,
        query: uri.query().unwrap_or("").to_string(),
        headers: api.auth.lambda_headers(&headers),
        protocol: "HTTP/1.1".into(),
        remote_addr: peer.ip().to_string(),
        depth: 0,
        request_id: String::new(), // the invoker's
        batch: false,
    };
    let call = Call { lambda, request, body: &body, request_id, trigger, limit: api.invoker.timeout(), depth: 0 };
    let invocation = api.invoker.invoke(call).await?;
    reply_of(api, invocation, &name, is_head)
}

/// The response to an invocation of lambda `name`: the handler's reply (its status, headers
/// and body) or the error it reports, with the worker's headers.
pub(crate) fn reply_of(api: &Api, invocation: crate::instances::Invocation, name: &str, is_head: bool) -> Result<Response, ApiError> {
    let start = if invocation.cold { "cold" } else { "warm" };
    let mut response = if let Some(e) = crate::invoker::handler_failure(&invocation, name) {
        fail(e)
    } else {
        let reply = &invocation.reply;
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

/// The operator's isolation class in an upload's query (`?isolation=gvisor`), if any; any
/// other parameter, or a class this worker does not run, is refused.
fn upload_isolation(api: &Api, query: Option<&str>) -> Result<Option<crate::config::BackendKind>, ApiError> {
    let mut chosen = None;
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("isolation", class)) => {
                let kind = api.registry.isolation().parse(class).map_err(|e| ApiError::new(ErrorCode::InvalidRequest, e.to_string()))?;
                chosen = Some(kind);
            }
            _ => return Err(ApiError::new(ErrorCode::InvalidRequest, format!("unknown upload parameter {pair:?} (known: isolation)"))),
        }
    }
    Ok(chosen)
}

async fn upload(State(api): State<Api>, Path(name): Path<String>, RawQuery(query): RawQuery, body: Body) -> Response {
    let chosen = match upload_isolation(&api, query.as_deref()) {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    let data = match read_body(body, api.max_upload).await {
        Ok(d) => d,
        Err(e) => return fail(e),
    };
    let registry = api.registry.clone();
    let archive = data.clone(); // Bytes: shared, not copied; for the shared registry
    let result = tokio::task::spawn_blocking(move || registry.upload(&name, &data, chosen)).await;
    match result {
        Ok(Ok(lambda)) => {
            tracing::info!(lambda = %lambda.name, version = lambda.version, files = lambda.files, "lambda uploaded");
            uploaded(&api, &lambda, true);
            api.networks.prepare(&lambda.name).await;
            if let Some(shared) = &api.shared {
                if let Err(e) = shared.publish(&lambda.name, &lambda.sha256, &archive, lambda.isolation.map(|k| k.name())).await {
                    let message = format!("the lambda is stored on this worker but not in the fleet's shared registry, so the other workers do not have it; upload it again: {e:#}");
                    return fail(ApiError::new(ErrorCode::SharedRegistryUnavailable, message).with("lambda", lambda.name.clone()));
                }
            }
            (StatusCode::CREATED, axum::Json(lambda_json(&api, &lambda))).into_response()
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

/// A lambda's metadata, with the back-end that runs it (its isolation class, by the worker's
/// policy as it is now; null when that class is not run here).
fn lambda_json(api: &Api, lambda: &crate::registry::Lambda) -> Value {
    let mut body = json!(*lambda);
    body["backend"] = api.registry.class_of(lambda).map(|k| json!(k.name())).unwrap_or(Value::Null);
    body
}

async fn list_lambdas(State(api): State<Api>) -> Response {
    let names: Vec<String> = api.registry.list().iter().map(|l| l.name.clone()).collect();
    axum::Json(names).into_response()
}

async fn show_lambda(State(api): State<Api>, Path(name): Path<String>) -> Response {
    match api.registry.get(&name) {
        Some(l) => axum::Json(lambda_json(&api, &l)).into_response(),
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
    api.leases.release_lambda(&lambda.name); // the replaced version's
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
    api.instances.forget(name);
    api.leases.release_lambda(name);
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
    out["leases"] = api.leases.stats();
    // Each lambda's invocations since the worker started (its sandboxes may all be gone).
    out["lambda_invocations"] = api
        .metrics
        .lambda_counts()
        .into_iter()
        .map(|(name, invocations, cold, errors)| (name, json!({"invocations": invocations, "cold_starts": cold, "errors": errors})))
        .collect::<serde_json::Map<String, Value>>()
        .into();
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
