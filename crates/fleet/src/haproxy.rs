//! HAProxy's configuration for a fleet: one entry point for the API (`/run/...` to the
//! lambda-routing backend, everything else to any worker) and for the sites' app port, with
//! the routing policy chosen (round-robin, least connections, consistent hashing on the
//! lambda with bounded loads, or the same on the lambda's package set), health checks that
//! take a dead or draining worker out, and retries of requests a dead worker never answered.
//! Pure: text from the members and the policy.

use std::fmt::Write;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

use crate::plan::{Member, API_PORT, APP_PORT};

/// How `/run/<lambda>` requests are spread over the workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    RoundRobin,
    LeastConn,
    /// Consistent hashing on the lambda's name, no worker above `BALANCE_FACTOR`% of the mean
    /// load (bounded loads).
    Consistent,
    /// The same, on the lambda's largest package set (PASch): lambdas sharing packages go to
    /// the workers holding their Zygote. Lambdas with no packages hash on their name.
    PackageAware,
}

impl Policy {
    pub const ALL: [Policy; 4] = [Policy::RoundRobin, Policy::LeastConn, Policy::Consistent, Policy::PackageAware];

    pub fn name(self) -> &'static str {
        match self {
            Policy::RoundRobin => "round-robin",
            Policy::LeastConn => "least-conn",
            Policy::Consistent => "consistent",
            Policy::PackageAware => "package-aware",
        }
    }

    pub fn parse(name: &str) -> Result<Policy> {
        match Policy::ALL.into_iter().find(|p| p.name() == name) {
            Some(p) => Ok(p),
            None => bail!("unknown routing policy {name:?} (round-robin, least-conn, consistent, package-aware)"),
        }
    }
}

/// The backends of the configuration, by the names the runtime API knows them by: `/run/...`
/// requests, every other API request, and the app port's sites.
pub const LAMBDAS: &str = "lambdas";
pub const WORKERS: &str = "workers";
pub const SITES: &str = "sites";

/// A hashed worker takes at most this share of the mean load (HAProxy's hash-balance-factor).
pub const BALANCE_FACTOR: u32 = 150;

/// Where HAProxy listens, and its files.
#[derive(Debug, Clone)]
pub struct Listen {
    pub api: SocketAddr,
    pub app: Option<SocketAddr>,
    /// The runtime API (drain, health, map updates).
    pub admin_socket: PathBuf,
    /// `<lambda> <package set>` per line, for [`Policy::PackageAware`].
    pub routes_map: PathBuf,
}

/// The header the package-aware policy hashes on.
const ROUTE_HEADER: &str = "X-Sprout-Route";

/// The configuration text.
pub fn config(members: &[Member], policy: Policy, listen: &Listen) -> String {
    let mut c = String::new();
    let _ = write!(
        c,
        "# Written by `sprout fleet`; rewritten when the fleet changes.\n\
         global\n    master-worker\n    maxconn 8192\n    stats socket {} mode 600 level admin expose-fd listeners\n\n\
         defaults\n    mode http\n    timeout connect 2s\n    timeout client 120s\n    timeout server 120s\n    timeout queue 30s\n\
         \x20   timeout http-keep-alive 10s\n    option http-keep-alive\n    # A request no worker answered (refused, reset, or a worker that died before\n\
         \x20   # replying) is sent to another; HAProxy retries only idempotent methods.\n\
         \x20   retries 2\n    retry-on conn-failure empty-response 503\n    option redispatch 1\n\n",
        listen.admin_socket.display()
    );
    let _ = write!(
        c,
        "frontend api\n    bind {}\n    use_backend {LAMBDAS} if {{ path_beg /run/ }}\n    default_backend {WORKERS}\n\n",
        listen.api
    );
    let _ = writeln!(c, "backend {LAMBDAS}");
    match policy {
        Policy::RoundRobin => c.push_str("    balance roundrobin\n"),
        Policy::LeastConn => c.push_str("    balance leastconn\n"),
        Policy::Consistent => {
            // /run/<lambda>: the first two directories of the path.
            let _ = write!(c, "    balance uri depth 2\n    hash-type consistent\n    hash-balance-factor {BALANCE_FACTOR}\n");
        }
        Policy::PackageAware => {
            let map = listen.routes_map.display();
            let _ = write!(
                c,
                "    http-request set-header {ROUTE_HEADER} %[path,field(3,/)]\n\
                 \x20   http-request set-header {ROUTE_HEADER} %[req.hdr({ROUTE_HEADER}),map({map})] if {{ req.hdr({ROUTE_HEADER}),map({map}) -m found }}\n\
                 \x20   balance hdr({ROUTE_HEADER})\n    hash-type consistent\n    hash-balance-factor {BALANCE_FACTOR}\n"
            );
        }
    }
    servers(&mut c, members, API_PORT);
    let _ = write!(c, "\nbackend {WORKERS}\n    balance roundrobin\n");
    servers(&mut c, members, API_PORT);
    if let Some(app) = listen.app {
        let _ = write!(
            c,
            "\nfrontend app\n    bind {app}\n    default_backend {SITES}\n\nbackend {SITES}\n    balance hdr(host)\n    hash-type consistent\n    hash-balance-factor {BALANCE_FACTOR}\n"
        );
        servers(&mut c, members, APP_PORT);
    }
    c
}

/// One server line per member, health-checked on the worker's `GET /status`.
fn servers(c: &mut String, members: &[Member], port: u16) {
    c.push_str("    option httpchk GET /status\n    http-check expect status 200\n");
    for m in members {
        let _ = writeln!(c, "    server {} {}:{port} check port {API_PORT} inter 500ms fall 2 rise 2", m.name, m.addr);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Plan;
    use std::path::Path;

    fn listen(app: bool) -> Listen {
        Listen {
            api: "127.0.0.1:7000".parse().unwrap(),
            app: app.then(|| "127.0.0.1:7080".parse().unwrap()),
            admin_socket: PathBuf::from("/f/haproxy.sock"),
            routes_map: PathBuf::from("/f/routes.map"),
        }
    }

    fn members(n: usize) -> Vec<Member> {
        Plan::for_dir(Path::new("/f")).members(n, &[0, 1], 256).unwrap()
    }

    #[test]
    fn every_policy_routes_run_requests_to_every_worker() {
        for policy in Policy::ALL {
            let text = config(&members(3), policy, &listen(false));
            let lambdas = &text[text.find("\nbackend lambdas").unwrap()..text.find("\nbackend workers").unwrap()];
            assert_eq!(lambdas.matches("\n    server w").count(), 3, "{policy:?}");
            assert!(text.contains("use_backend lambdas if { path_beg /run/ }"));
            assert!(!text.contains("frontend app"));
        }
    }

    #[test]
    fn hashing_policies_bound_the_load_and_hash_what_they_say() {
        let consistent = config(&members(2), Policy::Consistent, &listen(false));
        assert!(consistent.contains("balance uri depth 2\n    hash-type consistent\n    hash-balance-factor 150"));
        let packages = config(&members(2), Policy::PackageAware, &listen(false));
        assert!(packages.contains("map(/f/routes.map)") && packages.contains("balance hdr(X-Sprout-Route)"));
        assert!(config(&members(2), Policy::LeastConn, &listen(false)).contains("balance leastconn"));
    }

    #[test]
    fn the_app_port_hashes_sites_by_host_and_checks_the_api_port() {
        let text = config(&members(2), Policy::RoundRobin, &listen(true));
        let sites = &text[text.find("\nbackend sites").unwrap()..];
        assert!(sites.contains("balance hdr(host)"));
        assert!(sites.contains(":8080 check port 5000"));
    }

    #[test]
    fn policies_parse_from_their_names() {
        for p in Policy::ALL {
            assert_eq!(Policy::parse(p.name()).unwrap(), p);
        }
        assert!(Policy::parse("random").is_err());
    }
}
