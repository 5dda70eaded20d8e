//! `/run/<name>[/<path>]`: a request to a lambda, JSON to `f(event)` or HTTP to a WSGI or
//! ASGI `app`, through the engine's invoker, and its reply as the response. The app port
//! sends its sites' requests through the same [`forward`].

use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{ConnectInfo, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use sprout_engine::valid_name;
use sprout_engine::Invocation;
use sprout_engine::LambdaConfig;
use sprout_engine::Trigger;
use sprout_engine::{Call, ErrorCode};
use sprout_sandbox::channel::Request as SandboxRequest;

use crate::http::{fail, read_body, ApiError, RequestId};
use crate::state::Api;

const HOP_BY_HOP: [&str; 8] =
    ["connection", "keep-alive", "transfer-encoding", "content-length", "upgrade", "te", "trailer", "proxy-connection"];

pub(crate) async fn run(
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
    let Some(lambda) = api.engine.registry.get(&name) else {
        return Err(ApiError::new(ErrorCode::LambdaNotFound, format!("no lambda named {shown:?}")));
    };
    if !lambda.config.auth.is_open() {
        if let Err(verdict) = api.auth.may_invoke(&headers, &name, api.auth.tenants.owner(&name).as_deref()) {
            return Ok(api.auth.refuse_invocation(verdict));
        }
    }
    if !lambda.config.allows(method.as_str()) {
        return Ok(method_not_allowed(&lambda.config, &method));
    }
    let body = read_body(body, api.engine.invoker.limits().max_body).await?;
    // After the body is read, so a refused client's connection stays open for its next request.
    let _in_flight = admit(api, &name)?;
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
    let call = Call { lambda, request, body: &body, request_id, trigger, limit: api.engine.invoker.timeout(), depth: 0 };
    let invocation = api.engine.invoker.invoke(call).await?;
    reply_of(api, invocation, &name, is_head)
}

/// Admit an invocation of lambda `name` from outside under its tenant's quotas: counted in
/// flight until the guard is dropped (None: the operator's lambda), or the 429 to answer.
pub(crate) fn admit<'a>(api: &'a Api, name: &str) -> Result<Option<crate::quotas::InFlight<'a>>, ApiError> {
    let Some((tenant, quotas)) = api.auth.tenants.owner_quotas(name) else { return Ok(None) };
    match api.usage.admit(&tenant, &quotas) {
        Ok(in_flight) => Ok(Some(in_flight)),
        Err(refused) => Err(refused.error(ErrorCode::QuotaExceeded, &tenant)),
    }
}

/// The response to an invocation of lambda `name`: the handler's reply (its status, headers
/// and body) or the error it reports, with the worker's headers.
pub(crate) fn reply_of(api: &Api, invocation: Invocation, name: &str, is_head: bool) -> Result<Response, ApiError> {
    let start = if invocation.cold { "cold" } else { "warm" };
    let mut response = if let Some(e) = sprout_engine::handler_failure(&invocation, name) {
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
fn method_not_allowed(config: &LambdaConfig, method: &Method) -> Response {
    let allow = config.http_methods.as_deref().unwrap_or_default().join(", ");
    let mut response = (StatusCode::METHOD_NOT_ALLOWED, config.not_allowed_body(method.as_str())).into_response();
    let h = response.headers_mut();
    h.insert(axum::http::header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    if let Ok(allow) = HeaderValue::from_str(&allow) {
        h.insert(axum::http::header::ALLOW, allow);
    }
    response
}
