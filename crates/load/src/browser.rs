//! One simulated user's browser: a keep-alive HTTP/1.1 connection to the site (reopened when
//! the server closes it), a cookie jar, and a cache of static assets answered with
//! If-Modified-Since. Time is measured from a request's issue to its body's last byte.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::header::{HeaderValue, CONTENT_TYPE, COOKIE, HOST, IF_MODIFIED_SINCE, LAST_MODIFIED, LOCATION, SET_COOKIE};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;

/// Why a request failed; its `kind` is what error counts are keyed by.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    pub kind: String,
    pub detail: String,
}

impl Failure {
    pub fn new(kind: impl Into<String>, detail: impl Into<String>) -> Failure {
        Failure { kind: kind.into(), detail: detail.into() }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.kind, self.detail)
    }
}

pub type Outcome<T> = Result<T, Failure>;

#[derive(Debug)]
pub struct Response {
    pub status: StatusCode,
    pub location: Option<String>,
    pub body: Bytes,
}

impl Response {
    pub fn text(&self) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(&self.body)
    }
}

pub struct Browser {
    addr: SocketAddr,
    host: String,
    conn: Option<SendRequest<Full<Bytes>>>,
    cookies: HashMap<String, String>,
    /// path -> Last-Modified of assets this browser holds.
    cache: HashMap<String, String>,
    /// A warm browser already holds every asset (as of `warm_since`) before its first visit.
    warm_since: Option<String>,
    timeout: Duration,
    /// Requests sent, and those answered 304.
    requests: u64,
    not_modified: u64,
}

impl Browser {
    /// `warm_since`: None for an empty cache; else the Last-Modified date a warm browser
    /// claims for assets it has never fetched in this run.
    pub fn new(addr: SocketAddr, host: String, warm_since: Option<String>, timeout: Duration) -> Browser {
        Browser {
            addr,
            host,
            conn: None,
            cookies: HashMap::new(),
            cache: HashMap::new(),
            warm_since,
            timeout,
            requests: 0,
            not_modified: 0,
        }
    }

    /// Requests sent and 304s received so far, to count an operation's share with
    /// [`Browser::count_since`].
    pub fn sent(&self) -> (u64, u64) {
        (self.requests, self.not_modified)
    }

    /// Add the requests and 304s since `before` to an operation's counters ("http_requests",
    /// "http_not_modified"): what the site served per operation, pages and assets.
    pub fn count_since(&self, before: (u64, u64), counters: &mut std::collections::BTreeMap<String, u64>) {
        *counters.entry("http_requests".into()).or_default() += self.requests - before.0;
        *counters.entry("http_not_modified".into()).or_default() += self.not_modified - before.1;
    }

    pub fn logged_in(&self, cookie: &str) -> bool {
        self.cookies.contains_key(cookie)
    }

    pub fn forget_cookies(&mut self) {
        self.cookies.clear();
    }

    pub async fn get(&mut self, path: &str) -> Outcome<Response> {
        self.send(Method::GET, path, None, None).await
    }

    pub async fn head(&mut self, path: &str) -> Outcome<Response> {
        self.send(Method::HEAD, path, None, None).await
    }

    pub async fn post_form(&mut self, path: &str, fields: &[(&str, &str)]) -> Outcome<Response> {
        let body = form_urlencoded::Serializer::new(String::new()).extend_pairs(fields).finish();
        self.send(Method::POST, path, Some("application/x-www-form-urlencoded".into()), Some(Bytes::from(body))).await
    }

    pub async fn post_multipart(&mut self, path: &str, form: Multipart) -> Outcome<Response> {
        let (content_type, body) = form.finish();
        self.send(Method::POST, path, Some(content_type), Some(body)).await
    }

    /// A static asset, through the browser cache: a cached one is revalidated with
    /// If-Modified-Since (the server should answer 304 with no body).
    pub async fn asset(&mut self, path: &str) -> Outcome<()> {
        let since = self.cache.get(path).cloned().or_else(|| self.warm_since.clone());
        let resp = self.request(Method::GET, path, None, None, since).await?;
        match resp.0.status {
            StatusCode::OK => {
                if let Some(lm) = resp.1 {
                    self.cache.insert(path.to_string(), lm);
                }
                Ok(())
            }
            StatusCode::NOT_MODIFIED => {
                self.not_modified += 1;
                Ok(())
            }
            s => Err(Failure::new(format!("http {}", s.as_u16()), format!("GET {path}"))),
        }
    }

    async fn send(&mut self, method: Method, path: &str, content_type: Option<String>, body: Option<Bytes>) -> Outcome<Response> {
        Ok(self.request(method, path, content_type, body, None).await?.0)
    }

    async fn request(
        &mut self,
        method: Method,
        path: &str,
        content_type: Option<String>,
        body: Option<Bytes>,
        since: Option<String>,
    ) -> Outcome<(Response, Option<String>)> {
        let what = format!("{method} {path}");
        match tokio::time::timeout(self.timeout, self.exchange(method, path, content_type, body, since)).await {
            Ok(r) => r.map_err(|e| Failure { detail: format!("{what}: {}", e.detail), ..e }),
            Err(_) => {
                self.conn = None; // the connection may still carry the late answer
                Err(Failure::new("timeout", format!("{what}: no complete answer in {:?}", self.timeout)))
            }
        }
    }

    async fn exchange(
        &mut self,
        method: Method,
        path: &str,
        content_type: Option<String>,
        body: Option<Bytes>,
        since: Option<String>,
    ) -> Outcome<(Response, Option<String>)> {
        let mut req = Request::builder().method(method).uri(path).header(HOST, &self.host);
        if let Some(ct) = content_type {
            req = req.header(CONTENT_TYPE, ct);
        }
        if let Some(since) = since {
            req = req.header(IF_MODIFIED_SINCE, since);
        }
        if !self.cookies.is_empty() {
            let jar = self.cookies.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join("; ");
            req = req.header(COOKIE, jar);
        }
        let req = req.body(Full::new(body.unwrap_or_default())).map_err(|e| Failure::new("request", e.to_string()))?;
        // A kept-alive connection the server has closed fails at once; retry once on a new one
        // (as browsers do) only when the request cannot have been processed.
        let mut sender = self.connection().await?;
        let resp = match sender.send_request(req.clone()).await {
            Ok(r) => r,
            Err(e) if e.is_canceled() || e.is_closed() => {
                self.conn = None;
                sender = self.connection().await?;
                sender.send_request(req).await.map_err(|e| Failure::new("connection", e.to_string()))?
            }
            Err(e) => {
                self.conn = None;
                return Err(Failure::new("connection", e.to_string()));
            }
        };
        self.requests += 1;
        let (parts, body) = resp.into_parts();
        let (status, headers) = (parts.status, parts.headers);
        let body = body.collect().await.map_err(|e| {
            self.conn = None;
            Failure::new("connection", format!("reading the body: {e}"))
        })?;
        self.conn = Some(sender);
        for value in headers.get_all(SET_COOKIE) {
            self.set_cookie(value);
        }
        let location = headers.get(LOCATION).and_then(|v| v.to_str().ok()).map(str::to_string);
        let last_modified = headers.get(LAST_MODIFIED).and_then(|v| v.to_str().ok()).map(str::to_string);
        if status.is_server_error() {
            return Err(Failure::new(
                format!("http {}", status.as_u16()),
                String::from_utf8_lossy(&body.to_bytes()).chars().take(200).collect::<String>(),
            ));
        }
        Ok((Response { status, location, body: body.to_bytes() }, last_modified))
    }

    async fn connection(&mut self) -> Outcome<SendRequest<Full<Bytes>>> {
        if let Some(c) = self.conn.take() {
            if !c.is_closed() {
                return Ok(c);
            }
        }
        let stream = tokio::net::TcpStream::connect(self.addr).await.map_err(|e| Failure::new("connect", format!("{}: {e}", self.addr)))?;
        let _ = stream.set_nodelay(true);
        let (sender, conn) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(|e| Failure::new("connect", e.to_string()))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(sender)
    }

    fn set_cookie(&mut self, value: &HeaderValue) {
        let Ok(text) = value.to_str() else { return };
        let mut parts = text.split(';');
        let Some((name, val)) = parts.next().and_then(|nv| nv.split_once('=')) else { return };
        let (name, val) = (name.trim().to_string(), val.trim().to_string());
        let expired = parts.any(|a| {
            let a = a.trim().to_ascii_lowercase();
            a == "max-age=0" || a.starts_with("max-age=-") || a.starts_with("expires=thu, 01 jan 1970")
        });
        if expired || val.is_empty() {
            self.cookies.remove(&name);
        } else {
            self.cookies.insert(name, val);
        }
    }
}

/// A multipart/form-data body.
pub struct Multipart {
    boundary: String,
    body: Vec<u8>,
}

impl Multipart {
    pub fn new(seed: u64) -> Multipart {
        Multipart { boundary: format!("----sprout-load-{seed:016x}"), body: Vec::new() }
    }

    pub fn text(mut self, name: &str, value: &str) -> Multipart {
        self.body.extend_from_slice(
            format!("--{}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n", self.boundary).as_bytes(),
        );
        self
    }

    pub fn file(mut self, name: &str, filename: &str, content_type: &str, data: &[u8]) -> Multipart {
        self.body.extend_from_slice(
            format!(
                "--{}\r\nContent-Disposition: form-data; name=\"{name}\"; filename=\"{filename}\"\r\nContent-Type: {content_type}\r\n\r\n",
                self.boundary
            )
            .as_bytes(),
        );
        self.body.extend_from_slice(data);
        self.body.extend_from_slice(b"\r\n");
        self
    }

    fn finish(mut self) -> (String, Bytes) {
        self.body.extend_from_slice(format!("--{}--\r\n", self.boundary).as_bytes());
        (format!("multipart/form-data; boundary={}", self.boundary), Bytes::from(self.body))
    }
}
