//! User leases (`/leases`): N sandboxes of one function lambda held for the life of a
//! client-side object, each call run on the part it names, whose module globals survive
//! between calls. Behind the worker's token (they hold resources, [`crate::auth`]).
//!
//! | Route                           | Does                                                    |
//! |---------------------------------|---------------------------------------------------------|
//! | `POST /leases/<name>`           | `{"parts": N, "idle_timeout_s": T}`: holds N sandboxes (201) |
//! | `POST /leases/<id>/<part>`      | runs `f(event)` on that part's sandbox, answering as `/run` |
//! | `POST /leases/<id>/keepalive`   | resets the lease's idle clock                           |
//! | `DELETE /leases/<id>`           | releases it: its sandboxes are destroyed                |
//! | `GET /leases`                   | every lease: id, lambda, parts, idle seconds            |
//! | `PUT /leases/<id>/files/<file>` | writes the body as a file of the lease's directory      |
//! | `GET /leases/<id>/files/<file>` | reads a file of the lease's directory                   |
//!
//! A lease's directory ([`crate::lease_files`]) is `/leases/<id>` in every sandbox (`dir` in
//! the lease's JSON): its parts share files there, and a client reads and writes them
//! without a sandbox in the way (bodies up to `limits.max_upload_mb`, streamed to disk).
//!
//! The parts are made as any request's sandbox is (an idle one, or a cold start through
//! admission: they count against `max_total`, `max_per_lambda` and the memory budget), and
//! stay busy to the pools until released: never paused, reaped or evicted. A lease idle past
//! its timeout, or whose lambda is deleted or replaced, is released by the worker. A part
//! whose sandbox died answers 502 `lease_part_lost` and is never replaced. The bookkeeping
//! is [`crate::leases`]'.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{ConnectInfo, Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use serde_json::{json, Value};
use sprout_sandbox::channel::Request as SandboxRequest;

use crate::api::{fail, read_body, reply_of, Api, RequestId};
use crate::errors::{failure_error, ApiError, ErrorCode};
use crate::instances::Held;
use crate::invoker::Call;
use crate::lease_files::{LeaseDir, LeaseFiles};
use crate::leases::{Leases, Refused, DEFAULT_IDLE_TIMEOUT_S};
use crate::logs::Trigger;
use crate::registry::Lambda;
use crate::shared_files;

/// Largest body of a lease's creation.
const MAX_SPEC: usize = 64 << 10;
/// How often leases idle past their timeout are looked for.
const EXPIRY_TICK: Duration = Duration::from_millis(500);

/// One part of a lease: its held sandbox, one call at a time, and the lease's directory
/// (which goes with the last part).
pub struct Part {
    lambda: Arc<Lambda>,
    held: tokio::sync::Mutex<Held>,
    dir: Arc<LeaseDir>,
}

/// The worker's leases: the table, their directories, and a task that releases those idle
/// past their timeout.
pub struct LeaseBook {
    table: Mutex<Leases<Arc<Part>>>,
    files: Arc<LeaseFiles>,
}

impl LeaseBook {
    pub fn new(files: Arc<LeaseFiles>) -> Arc<LeaseBook> {
        let book = Arc::new(LeaseBook { table: Mutex::new(Leases::default()), files });
        tokio::spawn(Self::expire(Arc::downgrade(&book)));
        book
    }

    async fn expire(weak: Weak<LeaseBook>) {
        let mut tick = tokio::time::interval(EXPIRY_TICK);
        loop {
            tick.tick().await;
            let Some(book) = weak.upgrade() else { return };
            let expired = book.table.lock().unwrap().expired(Instant::now());
            for lease in &expired {
                tracing::info!(lease = %lease.id, lambda = %lease.lambda, "lease idle past its timeout of {:?}: released", lease.idle_timeout);
            }
            drop(expired); // its sandboxes go (a part under a call goes when the call ends)
        }
    }

    /// Release the leases of lambda `name` (deleted or replaced).
    pub fn release_lambda(&self, name: &str) {
        let gone = self.table.lock().unwrap().of_lambda(name);
        if !gone.is_empty() {
            tracing::info!(lambda = %name, leases = gone.len(), "the lambda's leases released");
        }
    }

    /// Release every lease (the worker is stopping).
    pub fn release_all(&self) {
        let gone = self.table.lock().unwrap().all();
        drop(gone);
    }

    /// `{"count": leases, "parts": their parts}`, for `/stats`.
    pub fn stats(&self) -> Value {
        let (count, parts) = self.table.lock().unwrap().figures();
        json!({"count": count, "parts": parts})
    }
}

/// A new lease's id: 32 random hex digits.
fn new_id() -> String {
    let mut bytes = [0u8; 16];
    let read = std::fs::File::open("/dev/urandom").and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes));
    if read.is_err() {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        bytes = (nanos ^ u128::from(std::process::id()) << 64).to_le_bytes();
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn not_found(id: &str) -> ApiError {
    ApiError::new(ErrorCode::LeaseNotFound, format!("no lease {id:?} (released, expired, or its lambda deleted or replaced)"))
}

fn part_lost(id: &str, part: usize) -> ApiError {
    ApiError::new(ErrorCode::LeasePartLost, format!("part {part} of lease {id:?} lost its sandbox, and the state it held"))
        .with("lease", id)
        .with("part", part)
}

/// What a lease's creation asks for: its parts and idle timeout, checked.
fn spec(body: &[u8], max_parts: usize) -> Result<(usize, Duration), ApiError> {
    let invalid = |m: String| ApiError::new(ErrorCode::InvalidRequest, m);
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| invalid(format!("a lease's body must be JSON {{\"parts\": N, \"idle_timeout_s\": T}}: {e}")))?;
    let Value::Object(map) = value else {
        return Err(invalid("a lease's body must be a JSON object {\"parts\": N, \"idle_timeout_s\": T}".into()));
    };
    if let Some(key) = map.keys().find(|k| !["parts", "idle_timeout_s"].contains(&k.as_str())) {
        return Err(invalid(format!("unknown lease field {key:?} (known: parts, idle_timeout_s)")));
    }
    let number = |key: &str, default: Option<u64>| match map.get(key) {
        None => default.ok_or_else(|| invalid(format!("a lease needs {key:?}"))),
        Some(v) => v.as_u64().ok_or_else(|| invalid(format!("{key} must be a positive integer, not {v}"))),
    };
    let (parts, idle) = (number("parts", None)?, number("idle_timeout_s", Some(DEFAULT_IDLE_TIMEOUT_S))?);
    Leases::<()>::check(parts, idle, max_parts).map_err(invalid)
}

/// `POST /leases/<name>`: hold N sandboxes of lambda `name`.
pub async fn create(State(api): State<Api>, Path(name): Path<String>, body: Body) -> Response {
    match make(&api, &name, body).await {
        Ok(made) => (StatusCode::CREATED, axum::Json(made)).into_response(),
        Err(e) => fail(e),
    }
}

async fn make(api: &Api, name: &str, body: Body) -> Result<Value, ApiError> {
    let lambda = api.invoker.lambda(name)?;
    crate::map_run::check_function(&lambda)?;
    if !lambda.config.reuse_sandbox {
        let message = format!("lambda {name:?} says reuse-sandbox: false in its ol.yaml, so its sandboxes cannot be leased");
        return Err(ApiError::new(ErrorCode::InvalidRequest, message).with("lambda", name));
    }
    let body = read_body(body, MAX_SPEC).await?;
    let (parts, idle_timeout) = spec(&body, api.invoker.max_per_lambda())?;
    let wait = api.invoker.timeout();
    let id = new_id();
    let dir = api
        .leases
        .files
        .make(&id)
        .map_err(|e| ApiError::new(ErrorCode::Internal, format!("making the lease's directory: {e}")).with("lambda", name))?;
    let dir = Arc::new(dir);
    let held = futures_util::future::join_all((0..parts).map(|_| api.instances.hold(&lambda, wait))).await;
    let mut made = Vec::with_capacity(parts);
    let mut failure = None;
    for h in held {
        match h {
            Ok(h) => made.push(Arc::new(Part { lambda: lambda.clone(), held: tokio::sync::Mutex::new(h), dir: dir.clone() })),
            Err(f) => failure = failure.or(Some(f)),
        }
    }
    if let Some(failure) = failure {
        drop(made); // the sandboxes made so far go, and the directory with them
        return Err(failure_error(failure).with("lambda", name));
    }
    let in_sandbox = dir.in_sandbox().to_string();
    drop(dir);
    api.leases.table.lock().unwrap().insert(id.clone(), name.to_string(), idle_timeout, made, Instant::now());
    if !lambda.is_current() {
        // Replaced or deleted while its parts were made: its leases were released before
        // this one was kept.
        api.leases.table.lock().unwrap().remove(&id);
        let message = format!("lambda {name:?} was replaced or deleted while the lease was made");
        return Err(ApiError::new(ErrorCode::LambdaNotFound, message).with("lambda", name));
    }
    tracing::info!(lease = %id, lambda = %name, parts, "lease made");
    Ok(json!({"lease": id, "lambda": name, "parts": parts, "idle_timeout_s": idle_timeout.as_secs(), "dir": in_sandbox}))
}

/// `POST /leases/<id>/<part>` (a call) and `POST /leases/<id>/keepalive`.
pub async fn call(
    State(api): State<Api>,
    Extension(RequestId(request_id)): Extension<RequestId>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path((id, part)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    if part == "keepalive" {
        return match api.leases.table.lock().unwrap().keepalive(&id, Instant::now()) {
            true => axum::Json(json!({"lease": id})).into_response(),
            false => fail(not_found(&id)),
        };
    }
    match run(&api, request_id, peer, &id, &part, headers, body).await {
        Ok(r) => r,
        Err(e) => fail(e),
    }
}

async fn run(
    api: &Api,
    request_id: Arc<str>,
    peer: SocketAddr,
    id: &str,
    part: &str,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let Ok(part) = part.parse::<usize>() else {
        return Err(ApiError::new(ErrorCode::InvalidRequest, format!("a lease's part is a number or keepalive, not {part:?}")));
    };
    let body = read_body(body, api.invoker.limits().max_body).await?;
    let slot = api.leases.table.lock().unwrap().begin_call(id, part).map_err(|refused| match refused {
        Refused::NotFound => not_found(id),
        Refused::NoSuchPart { parts } => {
            ApiError::new(ErrorCode::InvalidRequest, format!("lease {id:?} has parts 0 to {}, not {part}", parts - 1))
        }
        Refused::PartLost => part_lost(id, part),
    })?;
    let name = slot.lambda.name.clone();
    let request = SandboxRequest {
        method: "POST".into(),
        script_name: format!("/run/{name}"),
        path: "/".into(),
        query: String::new(),
        headers: api.auth.lambda_headers(&headers),
        protocol: "HTTP/1.1".into(),
        remote_addr: peer.ip().to_string(),
        depth: 0,
        request_id: String::new(), // the invoker's
        batch: false,
    };
    let call = Call {
        lambda: slot.lambda.clone(),
        request,
        body: &body,
        request_id,
        trigger: Trigger::Http,
        limit: api.invoker.timeout(),
        depth: 0,
    };
    let (result, lost) = {
        let mut held = slot.held.lock().await;
        if held.is_lost() {
            (Err(part_lost(id, part)), true)
        } else {
            let result = api.invoker.invoke_held(call, &mut held).await;
            (result, held.is_lost())
        }
    };
    api.leases.table.lock().unwrap().end_call(id, part, lost, Instant::now());
    drop(slot); // released here if the lease went meanwhile
    match result {
        Ok(invocation) => {
            let mut response = reply_of(api, invocation, &name, false)?;
            response.headers_mut().insert("x-sprout-lease-part", HeaderValue::from(part));
            Ok(response)
        }
        Err(e) if lost && e.code != ErrorCode::LeasePartLost => {
            // Counted already under its own code (the invoker's): what became of the part.
            let cause = e.code.as_str();
            let message = format!("{}: {}", e.message(), "the part's sandbox is gone, with the state it held");
            Err(ApiError::new(ErrorCode::LeasePartLost, message)
                .with("lease", id)
                .with("part", part)
                .with("cause", cause)
                .with("lambda", name)
                .counted())
        }
        Err(e) => Err(e),
    }
}

/// `PUT /leases/<id>/files/<file>`: the body becomes the file (replacing one there),
/// streamed to disk as it arrives; a body past `limits.max_upload_mb` leaves nothing.
pub async fn put_file(State(api): State<Api>, Path((id, file)): Path<(String, String)>, body: Body) -> Response {
    let written = match lease_dir(&api, &id) {
        Ok(dir) => shared_files::receive(&dir.files, &file, body, api.max_upload).await,
        Err(e) => Err(e),
    };
    match written {
        Ok(size) => axum::Json(json!({"lease": id, "file": file, "bytes": size})).into_response(),
        Err(e) => fail(e.with("lease", id.as_str())),
    }
}

/// `GET /leases/<id>/files/<file>`: the file's bytes, streamed.
pub async fn get_file(State(api): State<Api>, Path((id, file)): Path<(String, String)>) -> Response {
    lease_dir(&api, &id).and_then(|dir| shared_files::send(&dir.files, &file)).unwrap_or_else(|e| fail(e.with("lease", id.as_str())))
}

/// Lease `id`'s directory (a use of the lease: its idle clock starts again).
fn lease_dir(api: &Api, id: &str) -> Result<Arc<LeaseDir>, ApiError> {
    let part = api.leases.table.lock().unwrap().touch(id, Instant::now());
    part.map(|p| p.dir.clone()).ok_or_else(|| not_found(id))
}

/// `DELETE /leases/<id>`: release a lease; its sandboxes are destroyed.
pub async fn release(State(api): State<Api>, Path(id): Path<String>) -> Response {
    let Some(lease) = api.leases.table.lock().unwrap().remove(&id) else {
        return fail(not_found(&id));
    };
    let parts = lease.parts.len();
    drop(lease);
    tracing::info!(lease = %id, "lease released");
    axum::Json(json!({"released": id, "parts": parts})).into_response()
}

/// `GET /leases`: every lease, by id.
pub async fn list(State(api): State<Api>) -> Response {
    let listed = api.leases.table.lock().unwrap().list(Instant::now());
    axum::Json(listed).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_asks_for_parts_within_the_lambdas_bound_and_a_timeout() {
        assert_eq!(spec(br#"{"parts": 2}"#, 4).unwrap(), (2, Duration::from_secs(60)));
        assert_eq!(spec(br#"{"parts": 4, "idle_timeout_s": 5}"#, 4).unwrap(), (4, Duration::from_secs(5)));
        for bad in [
            &br#"{"parts": 5}"#[..],
            br#"{"parts": 0}"#,
            br#"{}"#,
            br#"[1]"#,
            b"nope",
            br#"{"parts": 1, "x": 1}"#,
            br#"{"parts": -1}"#,
            br#"{"parts": 1.5}"#,
            br#"{"parts": 1, "idle_timeout_s": 0}"#,
            br#"{"parts": 1, "idle_timeout_s": 3601}"#,
        ] {
            assert_eq!(spec(bad, 4).unwrap_err().code, ErrorCode::InvalidRequest, "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn lease_ids_are_32_random_hex_digits() {
        let (a, b) = (new_id(), new_id());
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}
