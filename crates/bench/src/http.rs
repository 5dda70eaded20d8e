//! The benchmarks' HTTP client for a worker: one keep-alive HTTP/1.1 connection, a POST and
//! what came back (status, the start the worker reported, latency, body).

use std::time::{Duration, Instant};

use anyhow::Result;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;

/// One request's outcome.
pub(crate) struct Answer {
    pub status: u16,
    /// `X-Sprout-Start` (`cold`, `warm`), empty when absent.
    pub start: String,
    pub elapsed: Duration,
    pub body: Bytes,
}

impl Answer {
    pub fn ok(&self) -> bool {
        (200..300).contains(&self.status)
    }
}

/// A keep-alive HTTP/1.1 connection to the worker.
pub(crate) struct Client(hyper::client::conn::http1::SendRequest<Full<Bytes>>);

impl Client {
    pub async fn connect(port: u16) -> Result<Client> {
        let stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        stream.set_nodelay(true)?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(conn);
        Ok(Client(sender))
    }

    /// POST the JSON `body` to `path` and read the whole reply.
    pub async fn post(&mut self, path: &str, body: &'static [u8]) -> Result<Answer> {
        let request = Request::post(path)
            .header("host", "bench")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(body)))?;
        let t0 = Instant::now();
        let response = self.0.send_request(request).await?;
        let status = response.status().as_u16();
        let start = response.headers().get("x-sprout-start").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
        let body = response.into_body().collect().await?.to_bytes();
        Ok(Answer { status, start, elapsed: t0.elapsed(), body })
    }
}
