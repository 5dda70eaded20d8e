//! User leases: N sandboxes of one function lambda held for the life of a client-side
//! object, each call run on the part it names, whose module globals survive between calls.
//! The HTTP edge serves them under `/leases` (behind the worker's token: they hold
//! resources).
//!
//! A lease's directory ([`crate::lease_files`]) is `/leases/<id>` in every sandbox (`dir` in
//! the lease's JSON): its parts share files there, and a client reads and writes them
//! without a sandbox in the way.
//!
//! The parts are made as any request's sandbox is (an idle one, or a cold start through
//! admission: they count against `max_total`, `max_per_lambda` and the memory budget), and
//! stay busy to the pools until released: never paused, reaped or evicted. A lease idle past
//! its timeout, or whose lambda is deleted or replaced (the book is a [`LambdaWatcher`]), is
//! released by the worker. A part whose sandbox died answers 502 `lease_part_lost` and is
//! never replaced. The bookkeeping is [`crate::leases`]'.

use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde_json::{json, Value};
use sprout_engine::Trigger;
use sprout_engine::{Call, Engine, Error, ErrorCode, Lambda, LambdaWatcher, Origin};
use sprout_engine::{Held, Invocation};
use sprout_sandbox::channel::Request as SandboxRequest;

use crate::lease_files::{LeaseDir, LeaseFiles};
use crate::leases::{Leases, Refused, DEFAULT_IDLE_TIMEOUT_S};

/// Largest body of a lease's creation.
pub const MAX_SPEC: usize = 64 << 10;
/// How often leases idle past their timeout are looked for.
const EXPIRY_TICK: Duration = Duration::from_millis(500);

/// One part of a lease: its held sandbox, one call at a time, and the lease's directory
/// (which goes with the last part).
pub struct Part {
    lambda: Arc<Lambda>,
    held: tokio::sync::Mutex<Held>,
    dir: Arc<LeaseDir>,
}

/// Who calls a lease's part: what its handler sees of the request.
pub struct Caller {
    /// The request's headers a lambda may see.
    pub headers: Vec<(String, String)>,
    pub remote_addr: String,
}

/// A call's reply from a lease's part.
pub struct PartReply {
    pub invocation: Invocation,
    /// The lambda's name.
    pub lambda: String,
    pub part: usize,
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

fn not_found(id: &str) -> Error {
    Error::new(ErrorCode::LeaseNotFound, format!("no lease {id:?} (released, expired, or its lambda deleted or replaced)"))
}

fn part_lost(id: &str, part: usize) -> Error {
    Error::new(ErrorCode::LeasePartLost, format!("part {part} of lease {id:?} lost its sandbox, and the state it held"))
        .with("lease", id)
        .with("part", part)
}

/// What a lease's creation asks for: its parts and idle timeout, checked.
fn spec(body: &[u8], max_parts: usize) -> Result<(usize, Duration), Error> {
    let invalid = |m: String| Error::new(ErrorCode::InvalidRequest, m);
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

impl LeaseBook {
    /// Lambda `name`, if its sandboxes can be leased: a function lambda that reuses them.
    pub fn leasable(&self, engine: &Engine, name: &str) -> Result<Arc<Lambda>, Error> {
        let lambda = engine.invoker.lambda(name)?;
        crate::map_run::check_function(&lambda)?;
        if !lambda.config.reuse_sandbox {
            let message = format!("lambda {name:?} says reuse-sandbox: false in its ol.yaml, so its sandboxes cannot be leased");
            return Err(Error::new(ErrorCode::InvalidRequest, message).with("lambda", name));
        }
        Ok(lambda)
    }

    /// Hold the sandboxes `spec` (`{"parts": N, "idle_timeout_s": T}`) asks for, of `lambda`
    /// ([`LeaseBook::leasable`]): the new lease's JSON.
    pub async fn create(&self, engine: &Engine, lambda: Arc<Lambda>, spec_body: &[u8]) -> Result<Value, Error> {
        let name = lambda.name.as_str();
        let (parts, idle_timeout) = spec(spec_body, engine.invoker.max_per_lambda())?;
        let wait = engine.invoker.timeout();
        let id = new_id();
        let dir = self
            .files
            .make(&id)
            .map_err(|e| Error::new(ErrorCode::Internal, format!("making the lease's directory: {e}")).with("lambda", name))?;
        let dir = Arc::new(dir);
        let held = futures_util::future::join_all((0..parts).map(|_| engine.instances.hold(&lambda, wait))).await;
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
            return Err(Error::from(failure).with("lambda", name));
        }
        let in_sandbox = dir.in_sandbox().to_string();
        drop(dir);
        self.table.lock().unwrap().insert(id.clone(), name.to_string(), idle_timeout, made, Instant::now());
        if !lambda.is_current() {
            // Replaced or deleted while its parts were made: its leases were released before
            // this one was kept.
            self.table.lock().unwrap().remove(&id);
            let message = format!("lambda {name:?} was replaced or deleted while the lease was made");
            return Err(Error::new(ErrorCode::LambdaNotFound, message).with("lambda", name));
        }
        tracing::info!(lease = %id, lambda = %name, parts, "lease made");
        Ok(json!({"lease": id, "lambda": name, "parts": parts, "idle_timeout_s": idle_timeout.as_secs(), "dir": in_sandbox}))
    }

    /// Reset lease `id`'s idle clock.
    pub fn keepalive(&self, id: &str) -> Result<Value, Error> {
        match self.table.lock().unwrap().keepalive(id, Instant::now()) {
            true => Ok(json!({"lease": id})),
            false => Err(not_found(id)),
        }
    }

    /// A part's number from its path segment.
    pub fn part_number(part: &str) -> Result<usize, Error> {
        part.parse::<usize>()
            .map_err(|_| Error::new(ErrorCode::InvalidRequest, format!("a lease's part is a number or keepalive, not {part:?}")))
    }

    /// Run `f(event)` with `body` on part `part` of lease `id`, as `POST /run/<name>` from
    /// `caller` runs (through the invoker, one call at a time per part), never retried.
    pub async fn call(
        &self,
        engine: &Engine,
        id: &str,
        part: usize,
        caller: Caller,
        body: &[u8],
        request_id: Arc<str>,
    ) -> Result<PartReply, Error> {
        let slot = self.table.lock().unwrap().begin_call(id, part).map_err(|refused| refused_error(refused, id, part))?;
        let name = slot.lambda.name.clone();
        let request = SandboxRequest {
            method: "POST".into(),
            script_name: format!("/run/{name}"),
            path: "/".into(),
            query: String::new(),
            headers: caller.headers,
            protocol: "HTTP/1.1".into(),
            remote_addr: caller.remote_addr,
            depth: 0,
            request_id: String::new(), // the invoker's
            batch: false,
        };
        let call = Call {
            lambda: slot.lambda.clone(),
            request,
            body,
            request_id,
            trigger: Trigger::Http,
            limit: engine.invoker.timeout(),
            depth: 0,
        };
        let (result, lost) = {
            let mut held = slot.held.lock().await;
            if held.is_lost() {
                (Err(part_lost(id, part)), true)
            } else {
                let result = engine.invoker.invoke_held(call, &mut held).await;
                (result, held.is_lost())
            }
        };
        self.table.lock().unwrap().end_call(id, part, lost, Instant::now());
        drop(slot); // released here if the lease went meanwhile
        match result {
            Ok(invocation) => Ok(PartReply { invocation, lambda: name, part }),
            Err(e) if lost && e.code != ErrorCode::LeasePartLost => {
                // Counted already under its own code (the invoker's): what became of the part.
                let cause = e.code.as_str();
                let message = format!("{}: {}", e.message(), "the part's sandbox is gone, with the state it held");
                Err(Error::new(ErrorCode::LeasePartLost, message)
                    .with("lease", id)
                    .with("part", part)
                    .with("cause", cause)
                    .with("lambda", name)
                    .counted())
            }
            Err(e) => Err(e),
        }
    }

    /// The lambda lease `id` holds sandboxes of, if there is such a lease.
    pub fn lambda_of(&self, id: &str) -> Option<String> {
        self.table.lock().unwrap().lambda_of(id).map(String::from)
    }

    /// Lease `id`'s directory (a use of the lease: its idle clock starts again).
    pub fn dir(&self, id: &str) -> Result<Arc<LeaseDir>, Error> {
        let part = self.table.lock().unwrap().touch(id, Instant::now());
        part.map(|p| p.dir.clone()).ok_or_else(|| not_found(id))
    }

    /// The directories of the leases whose lambda `keep` accepts (not a use: no idle clock
    /// starts again).
    pub fn dirs(&self, keep: impl Fn(&str) -> bool) -> Vec<Arc<LeaseDir>> {
        self.table.lock().unwrap().first_parts(keep).into_iter().map(|p| p.dir.clone()).collect()
    }

    /// Release lease `id`: its sandboxes are destroyed.
    pub fn release(&self, id: &str) -> Result<Value, Error> {
        let Some(lease) = self.table.lock().unwrap().remove(id) else {
            return Err(not_found(id));
        };
        let parts = lease.parts.len();
        drop(lease);
        tracing::info!(lease = %id, "lease released");
        Ok(json!({"released": id, "parts": parts}))
    }

    /// Every lease, by id.
    pub fn list(&self) -> Value {
        json!(self.table.lock().unwrap().list(Instant::now()))
    }
}

/// A lambda's leases go when it is deleted or replaced.
#[async_trait]
impl LambdaWatcher for LeaseBook {
    fn arrived(self: Arc<Self>, _engine: &Arc<Engine>, lambda: &Arc<Lambda>, _origin: Origin) {
        self.release_lambda(&lambda.name); // the replaced version's
    }

    async fn removed(&self, _engine: &Arc<Engine>, name: &str, _origin: Origin) {
        self.release_lambda(name);
    }
}

fn refused_error(refused: Refused, id: &str, part: usize) -> Error {
    match refused {
        Refused::NotFound => not_found(id),
        Refused::NoSuchPart { parts } => {
            Error::new(ErrorCode::InvalidRequest, format!("lease {id:?} has parts 0 to {}, not {part}", parts - 1))
        }
        Refused::PartLost => part_lost(id, part),
    }
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
