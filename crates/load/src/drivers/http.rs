//! The generic driver: each operation is a fixed sequence of requests written in the workload
//! file ("GET /path"), each of which must answer below 400 — enough to drive any site whose
//! operations need no data from earlier pages, and to cross-check latencies with other tools.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{bail, Result};
use hyper::Method;
use rand::rngs::SmallRng;

use crate::browser::{Browser, Failure};
use crate::engine::Driver;
use crate::workload::Workload;

pub struct Http {
    addr: SocketAddr,
    timeout: Duration,
    /// Per operation: (method, path) in order.
    ops: Vec<Vec<(Method, String)>>,
}

impl Http {
    pub fn new(workload: &Workload, addr: SocketAddr, timeout: Duration) -> Result<Http> {
        let mut ops = Vec::new();
        for op in &workload.operations {
            if op.requests.is_empty() {
                bail!("operation {}: the http driver needs `requests = [\"GET /path\", ...]`", op.name);
            }
            let mut reqs = Vec::new();
            for r in &op.requests {
                let (m, p) = r.split_once(' ').unwrap_or(("", r));
                let method = match m {
                    "GET" => Method::GET,
                    "HEAD" => Method::HEAD,
                    _ => bail!("operation {}: {r:?}: only GET and HEAD requests can be written in a workload file", op.name),
                };
                if !p.starts_with('/') {
                    bail!("operation {}: {r:?}: the path must start with /", op.name);
                }
                reqs.push((method, p.to_string()));
            }
            ops.push(reqs);
        }
        Ok(Http { addr, timeout, ops })
    }
}

impl Driver for Http {
    type User = Browser;

    fn new_user(&self, _id: u64, _cold: bool, _rng: &mut SmallRng) -> Browser {
        Browser::new(self.addr, self.addr.to_string(), None, self.timeout)
    }

    async fn run(
        &self,
        browser: &mut Browser,
        op: usize,
        _rng: &mut SmallRng,
        counters: &mut BTreeMap<String, u64>,
    ) -> Result<(), Failure> {
        let before = browser.sent();
        let outcome = self.requests(browser, op).await;
        browser.count_since(before, counters);
        outcome
    }
}

impl Http {
    async fn requests(&self, browser: &mut Browser, op: usize) -> Result<(), Failure> {
        for (method, path) in &self.ops[op] {
            let resp = if *method == Method::HEAD { browser.head(path).await? } else { browser.get(path).await? };
            if resp.status.as_u16() >= 400 {
                return Err(Failure::new(format!("http {}", resp.status.as_u16()), format!("{method} {path}")));
            }
        }
        Ok(())
    }
}
