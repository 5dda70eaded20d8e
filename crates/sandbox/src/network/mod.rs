//! Each lambda's own network: a network namespace per lambda, made ahead in a pool and joined
//! by `setns` when a sandbox is forked, in which the sandbox has its own loopback and one
//! veth link to the host, through which only the services the operator allows are reachable.
//!
//! SOCK left sandboxes in the host's network namespace, because making one costs about a
//! millisecond (and far more under churn): so sandboxes could reach the worker's API and
//! every service on the host. Here the cost leaves the request's path, as the cgroup pool's
//! does: namespaces are made in the background ([`namespace`]), a lambda takes one on first
//! use and keeps it, and each sandbox of the lambda joins it in the fork protocol — a
//! `setns`, a few microseconds. The host side ([`host`], [`rules`]) is one nftables table and
//! two routes per worker: connections to a service's virtual address are rewritten to the
//! service, everything else from a sandbox link is refused at once. [`plan`] lays out the
//! addresses; [`pool`] decides what to make next.
//!
//! Services are named; a sandbox finds them as `$SPROUT_SERVICE_<NAME>` (`address:port`) and
//! by name in its `/etc/hosts` ([`service_env`], [`hosts_file`]).

pub mod host;
pub mod namespace;
pub mod plan;
pub mod pool;
pub mod rules;

use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde_json::{json, Value};
use tokio::sync::{mpsc, Notify};

pub use namespace::Namespace;
pub use plan::Block;
pub use rules::{Protocol, Service, ServiceSpec};

#[derive(Debug, Clone)]
pub struct NetworkConfig {
    /// Names the worker's table and interfaces (six hex digits).
    pub tag: String,
    /// The block to use; None: a free one in 10.224.0.0/11.
    pub subnet: Option<Block>,
    /// Where `auto` starts looking.
    pub seed: u32,
    pub services: Vec<ServiceSpec>,
    /// Namespaces kept ready.
    pub pool: usize,
    /// Most namespaces at once (ready and assigned).
    pub max_namespaces: usize,
    /// Connections one lambda's sandboxes may have open to services at once.
    pub max_connections: u32,
}

/// What leaves with a lambda's namespace: the namespace and its grant elements.
struct Retired {
    namespace: Namespace,
    grants: Vec<String>,
}

#[derive(Default)]
struct Counters {
    made: AtomicU64,
    destroyed: AtomicU64,
    failures: AtomicU64,
    made_inline: AtomicU64,
    make_us: AtomicU64,
}

struct PoolState {
    slots: pool::Slots,
    ready: Vec<Namespace>,
    making: usize,
    closed: bool,
}

/// A worker's sandbox network: its block, services, table and pool of namespaces.
pub struct Network {
    cfg: NetworkConfig,
    pub block: Block,
    services: Vec<Service>,
    worker_dir: PathBuf,
    owner: Option<OwnedFd>,
    remote: bool,
    state: Mutex<PoolState>,
    refill: Arc<Notify>,
    /// Signalled whenever a slot is free again or a namespace is ready.
    freed: Arc<Notify>,
    retire: mpsc::UnboundedSender<Retired>,
    counters: Counters,
}

/// A lambda's namespace, held by the lambda's entry and by each of its sandboxes; when the
/// last holder lets go, the namespace and its grants are removed in the background.
pub struct LambdaNetwork {
    namespace: Option<Namespace>,
    grants: Vec<String>,
    retire: mpsc::UnboundedSender<Retired>,
}

impl LambdaNetwork {
    /// The namespace's descriptor, for `setns`.
    pub fn fd(&self) -> std::os::fd::RawFd {
        self.namespace.as_ref().map(|n| n.fd()).unwrap_or(-1)
    }

    pub fn address(&self) -> Option<Ipv4Addr> {
        self.namespace.as_ref().map(|n| n.address)
    }

    pub fn interface(&self) -> &str {
        self.namespace.as_ref().map(|n| n.interface.as_str()).unwrap_or("")
    }

    /// Configure its inside again (after a gVisor sandbox took its address away).
    pub fn configure_again(&self) -> std::io::Result<()> {
        self.namespace.as_ref().map_or(Ok(()), Namespace::configure_again)
    }

    /// Lend its link to the namespace `to` (a gVisor pod created ahead); [`Namespace::lend_link`].
    pub fn lend_link(&self, to: std::os::fd::RawFd) -> std::io::Result<()> {
        self.namespace.as_ref().map_or(Ok(()), |n| n.lend_link(to))
    }

    /// Take its link back from the namespace `from`.
    pub fn take_link_back(&self, from: std::os::fd::RawFd) -> std::io::Result<()> {
        self.namespace.as_ref().map_or(Ok(()), |n| n.take_link_back(from))
    }
}

impl Drop for LambdaNetwork {
    fn drop(&mut self) {
        if let Some(namespace) = self.namespace.take() {
            let retired = Retired { namespace, grants: std::mem::take(&mut self.grants) };
            if let Err(mpsc::error::SendError(retired)) = self.retire.send(retired) {
                // The network is gone (shutdown): remove the link here.
                namespace::destroy(retired.namespace);
            }
        }
    }
}

impl Network {
    /// Claim the block and make the table (blocking: run it off the async threads), then
    /// start filling the pool. `owner`: the user namespace namespaces must belong to.
    pub fn start(worker_dir: &Path, cfg: NetworkConfig, owner: Option<OwnedFd>) -> std::io::Result<Arc<Network>> {
        let (block, services) = host::claim(worker_dir, &cfg.tag, cfg.subnet, cfg.seed, &cfg.services, cfg.max_connections)?;
        let remote = services.iter().any(|s| !is_host_address(*s.target.ip()));
        if remote && std::fs::read_to_string("/proc/sys/net/ipv4/conf/all/forwarding").map(|v| v.trim() == "0").unwrap_or(true) {
            tracing::warn!(
                "services on other hosts are configured, but IPv4 forwarding is off: their replies are dropped unless \
                 forwarding is on for the interface they arrive on (net.ipv4.conf.<interface>.forwarding = 1)"
            );
        }
        let (retire, retired) = mpsc::unbounded_channel();
        let network = Arc::new(Network {
            block,
            services,
            worker_dir: worker_dir.to_path_buf(),
            owner,
            remote,
            state: Mutex::new(PoolState { slots: pool::Slots::new(block.slots()), ready: Vec::new(), making: 0, closed: false }),
            refill: Arc::new(Notify::new()),
            freed: Arc::new(Notify::new()),
            retire,
            counters: Counters::default(),
            cfg,
        });
        tokio::spawn(maintain(Arc::downgrade(&network), network.refill.clone(), retired));
        network.refill.notify_one();
        Ok(network)
    }

    pub fn services(&self) -> &[Service] {
        &self.services
    }

    /// Make namespaces until the pool holds its target, and return when they are made. The
    /// worker calls it as a lambda is uploaded (after taking the lambda's namespace), so that
    /// making them does not compete for the CPU with the lambda's cold starts.
    pub async fn top_up(self: &Arc<Self>) {
        let want = {
            let mut st = self.state.lock().unwrap();
            let n = if st.closed {
                0
            } else {
                pool::shortfall(self.cfg.pool, st.ready.len(), st.making, st.slots.in_use() as usize, self.cfg.max_namespaces)
            };
            st.making += n;
            n
        };
        for _ in 0..want {
            let me = self.clone();
            let _ = tokio::task::spawn_blocking(move || {
                let made = me.make_one();
                let mut st = me.state.lock().unwrap();
                st.making -= 1;
                match made {
                    Ok(ns) if !st.closed => {
                        st.ready.push(ns);
                        me.freed.notify_waiters();
                    }
                    Ok(ns) => {
                        drop(st);
                        namespace::destroy(ns);
                    }
                    Err(_) => {}
                }
            })
            .await;
        }
    }

    /// A namespace for `lambda`: a ready one (made now when none is), with its grants.
    pub async fn take(self: &Arc<Self>, lambda: &str) -> std::io::Result<LambdaNetwork> {
        let ready = self.state.lock().unwrap().ready.pop();
        self.refill.notify_one();
        let namespace = match ready {
            Some(n) => n,
            None => self.make_now().await?,
        };
        let grants = rules::grants(&namespace.interface, lambda, &self.services);
        let mut held = LambdaNetwork { namespace: Some(namespace), grants: Vec::new(), retire: self.retire.clone() };
        if !grants.is_empty() {
            let tag = self.cfg.tag.clone();
            let to_add = grants.clone();
            tokio::task::spawn_blocking(move || host::update_grants(&tag, "add", &to_add)).await.map_err(std::io::Error::other)??;
            held.grants = grants;
        }
        Ok(held)
    }

    /// Make a namespace on the request's path (the pool ran dry). At the limit, namespaces
    /// just given back are still being removed: wait a little for their slots.
    async fn make_now(self: &Arc<Self>) -> std::io::Result<Namespace> {
        self.counters.made_inline.fetch_add(1, Ordering::Relaxed);
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            let freed = self.freed.notified();
            if let Some(ready) = self.state.lock().unwrap().ready.pop() {
                return Ok(ready);
            }
            let me = self.clone();
            match tokio::task::spawn_blocking(move || me.make_one()).await.map_err(std::io::Error::other)? {
                Err(e) if e.kind() == std::io::ErrorKind::QuotaExceeded && tokio::time::Instant::now() < deadline => {
                    let _ = tokio::time::timeout_at(deadline, freed).await;
                }
                made => return made,
            }
        }
    }

    /// Make one namespace in a free slot (blocking).
    fn make_one(&self) -> std::io::Result<Namespace> {
        let slot = {
            let mut st = self.state.lock().unwrap();
            let in_use = st.slots.in_use() as usize;
            if in_use >= self.cfg.max_namespaces {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::QuotaExceeded,
                    format!("all {} network namespaces (network.max_namespaces) are in use", self.cfg.max_namespaces),
                ));
            }
            st.slots.take().ok_or_else(|| std::io::Error::other(format!("every address of {} is in use", self.block)))?
        };
        let started = Instant::now();
        let made = namespace::create(&self.cfg.tag, &self.block, slot, self.owner.as_ref().map(|f| f.as_raw_fd())).and_then(|ns| {
            if self.remote {
                host::allow_forwarding(&ns.interface)?;
            }
            Ok(ns)
        });
        match &made {
            Ok(_) => {
                self.counters.made.fetch_add(1, Ordering::Relaxed);
                self.counters.make_us.fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
            }
            Err(e) => {
                self.counters.failures.fetch_add(1, Ordering::Relaxed);
                tracing::warn!("making a network namespace: {e}");
                self.state.lock().unwrap().slots.give_back(slot);
            }
        }
        made
    }

    /// Stop making namespaces, remove the ready ones and everything of the worker's on the
    /// host (blocking). Namespaces still held by sandboxes go with the host links.
    pub fn shutdown(&self) -> Vec<String> {
        let ready = {
            let mut st = self.state.lock().unwrap();
            st.closed = true;
            std::mem::take(&mut st.ready)
        };
        for namespace in ready {
            namespace::destroy(namespace);
        }
        host::release(&self.worker_dir, &self.cfg.tag)
    }

    /// (name, help, value) of the pool's counters, for /metrics, and the namespaces in use
    /// and ready.
    pub fn figures(&self) -> ([(&'static str, &'static str, u64); 4], u64, u64) {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let st = self.state.lock().unwrap();
        (
            [
                ("sprout_network_namespaces_made", "Network namespaces made for lambdas", get(&c.made)),
                (
                    "sprout_network_namespaces_made_on_request",
                    "Network namespaces made on a request's path (the pool was empty)",
                    get(&c.made_inline),
                ),
                ("sprout_network_namespaces_destroyed", "Network namespaces removed", get(&c.destroyed)),
                ("sprout_network_namespace_failures", "Network namespaces that could not be made", get(&c.failures)),
            ],
            st.slots.in_use() as u64,
            st.ready.len() as u64,
        )
    }

    /// Figures for /stats.
    pub fn stats(&self) -> Value {
        let st = self.state.lock().unwrap();
        let c = &self.counters;
        let made = c.made.load(Ordering::Relaxed);
        json!({
            "block": self.block.to_string(),
            "services": self.services.iter().map(|s| json!({
                "name": s.name, "address": s.virtual_endpoint().to_string(), "protocol": s.protocol.name(),
                "target": s.target.to_string(), "lambdas": s.lambdas,
            })).collect::<Vec<_>>(),
            "namespaces_in_use": st.slots.in_use(),
            "namespaces_ready": st.ready.len(),
            "namespaces_made": made,
            "namespaces_made_on_request": c.made_inline.load(Ordering::Relaxed),
            "namespaces_destroyed": c.destroyed.load(Ordering::Relaxed),
            "namespace_failures": c.failures.load(Ordering::Relaxed),
            "namespace_make_ms_mean": if made > 0 { c.make_us.load(Ordering::Relaxed) as f64 / made as f64 / 1000.0 } else { 0.0 },
        })
    }
}

/// How long after a namespace is taken its replacement is made (when others are ready).
const REFILL_DELAY: std::time::Duration = std::time::Duration::from_millis(30);

/// The pool's background work: make namespaces up to the target, remove retired ones. It
/// ends once the network and every lambda's namespace are gone.
async fn maintain(weak: std::sync::Weak<Network>, refill: Arc<Notify>, mut retired: mpsc::UnboundedReceiver<Retired>) {
    loop {
        if let Some(network) = weak.upgrade() {
            network.top_up().await;
        }
        tokio::select! {
            _ = refill.notified() => {
                // A namespace was just taken by a cold start: making its replacement (several
                // milliseconds of kernel work on the same CPU) waits until that start is over,
                // unless the pool ran dry.
                let dry = weak.upgrade().map(|n| n.state.lock().unwrap().ready.is_empty()).unwrap_or(true);
                if !dry {
                    tokio::time::sleep(REFILL_DELAY).await;
                }
            }
            gone = retired.recv() => {
                let Some(gone) = gone else { return };
                let network = weak.upgrade();
                let _ = tokio::task::spawn_blocking(move || {
                    let slot = gone.namespace.slot;
                    if let Some(me) = &network {
                        if let Err(e) = host::update_grants(&me.cfg.tag, "delete", &gone.grants) {
                            tracing::warn!("removing a lambda's network grants: {e}");
                        }
                    }
                    namespace::destroy(gone.namespace);
                    if let Some(me) = &network {
                        me.counters.destroyed.fetch_add(1, Ordering::Relaxed);
                        me.state.lock().unwrap().slots.give_back(slot);
                        me.freed.notify_waiters();
                        me.refill.notify_one();
                    }
                })
                .await;
            }
        }
    }
}

/// Whether `addr` is one of this host's own addresses (a service there is reached without
/// forwarding).
pub fn is_host_address(addr: Ipv4Addr) -> bool {
    addr.is_loopback() || std::net::UdpSocket::bind((addr, 0)).is_ok()
}

/// The environment that tells a sandbox of `lambda` where its services are:
/// `SPROUT_SERVICE_<NAME>=address:port` (the name upper-cased, `-` as `_`).
pub fn service_env(services: &[Service], lambda: &str) -> Vec<(String, String)> {
    services
        .iter()
        .filter(|s| s.allows(lambda))
        .map(|s| (format!("SPROUT_SERVICE_{}", s.name.to_ascii_uppercase().replace('-', "_")), s.virtual_endpoint().to_string()))
        .collect()
}

/// `/etc/hosts` for every sandbox: localhost, and each service by name.
pub fn hosts_file(services: &[Service]) -> String {
    let mut out = String::from("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n");
    for s in services {
        out.push_str(&format!("{}\t{}\n", s.address, s.name));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str, target: &str, lambdas: Option<&[&str]>) -> ServiceSpec {
        ServiceSpec {
            name: name.into(),
            protocol: Protocol::Tcp,
            target: target.parse().unwrap(),
            lambdas: lambdas.map(|l| l.iter().map(|s| s.to_string()).collect()),
        }
    }

    #[test]
    fn sandboxes_learn_the_services_they_may_reach() {
        let services = [
            spec("olio-db", "127.0.0.1:5432", None).at(Ipv4Addr::new(10, 224, 0, 1)),
            spec("cache", "127.0.0.1:11211", Some(&["visits"])).at(Ipv4Addr::new(10, 224, 0, 2)),
        ];
        assert_eq!(service_env(&services, "olio"), [("SPROUT_SERVICE_OLIO_DB".to_string(), "10.224.0.1:5432".to_string())]);
        assert_eq!(service_env(&services, "visits").len(), 2);
        let hosts = hosts_file(&services);
        assert!(
            hosts.contains("10.224.0.1\tolio-db\n") && hosts.contains("10.224.0.2\tcache\n") && hosts.starts_with("127.0.0.1\tlocalhost")
        );
    }

    #[test]
    fn loopback_and_own_addresses_are_local() {
        assert!(is_host_address(Ipv4Addr::LOCALHOST));
        assert!(!is_host_address(Ipv4Addr::new(192, 0, 2, 1)));
    }
}
