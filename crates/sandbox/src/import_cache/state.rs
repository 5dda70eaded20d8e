//! The import cache's data, which every part of it shares: its configuration, the tree's
//! nodes (one per Zygote) and the holds handlers keep on them, the cache's own fields and
//! counters, and the keys code Zygotes are known by.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::os::fd::OwnedFd;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::OnceCell;

use super::spare::{SparePlan, SparePool};
use crate::cgroup::{Cgroup, Layout, Limits};
use crate::spec::SharedCode;
use crate::stage::Stage;
use crate::zygote::ZygoteProcess;

/// How long a package set whose Zygote failed to start is served without trying again.
pub(super) const FAILURE_BACKOFF: Duration = Duration::from_secs(30);

#[derive(Debug, Clone)]
pub struct ImportCacheConfig {
    /// Make child Zygotes with packages (false: every handler forks from the root Zygote).
    pub enabled: bool,
    /// PSS of all package Zygotes above which the cache evicts.
    pub memory_limit: u64,
    /// Uses within this window are an entry's cost of eviction.
    pub window: Duration,
    /// Deepest chain of Zygotes below the root.
    pub max_depth: usize,
    /// Learn modules to pre-import from what lambdas load.
    pub learn: bool,
    /// Host user and group package Zygotes run as (root inside their user namespace).
    pub zygote_uid: u32,
    pub zygote_gid: u32,
    /// Handlers' user and group.
    pub uid: u32,
    pub gid: u32,
    pub python: String,
    pub start_timeout: Duration,
    /// How long a child Zygote may take to import its packages.
    pub import_timeout: Duration,
    /// Limits of each Zygote's own cgroup.
    pub zygote_limits: Limits,
    /// How many spares (children forked ahead of demand) each Zygote keeps.
    pub spares: SparePlan,
    /// Start the root Zygote (and so every Zygote) in an empty network namespace of its own.
    pub isolate_network: bool,
    /// Start the root Zygote under the sandboxes' seccomp filter, which every Zygote and
    /// handler inherits.
    pub seccomp: bool,
}

#[derive(Default)]
pub(super) struct NodeInfo {
    pub(super) alive: bool,
    pub(super) retired: bool,
    pub(super) uses: VecDeque<Instant>,
    pub(super) total_uses: u64,
    pub(super) handlers: usize,
    pub(super) children: BTreeSet<u64>,
    pub(super) pss: u64,
    pub(super) refreshing: bool,
}

/// A Zygote in the tree.
pub struct Node {
    pub id: u64,
    pub(super) parent: Option<Arc<Node>>,
    pub(super) depth: usize,
    /// Keys of every package it holds.
    pub(super) packages: BTreeSet<String>,
    /// Packages it holds beyond its parent's, and their on-disk size.
    pub(super) added: Vec<String>,
    pub(super) benefit: u64,
    pub(super) modules: BTreeSet<String>,
    pub(super) failed: BTreeMap<String, String>,
    pub(super) pinned: bool,
    pub(super) refreshes: u32,
    /// A code Zygote's key ([`code_key`]): it holds lambda code, so it serves only
    /// lambdas with that code and these packages.
    pub(super) code: Option<String>,
    pub(super) created: Instant,
    pub(super) start_ms: f64,
    pub(super) process: tokio::sync::Mutex<Option<ZygoteProcess>>,
    pub(super) info: Mutex<NodeInfo>,
    pub(super) spares: Mutex<SparePool>,
}

impl Node {
    pub fn is_root(&self) -> bool {
        self.parent.is_none()
    }

    pub(super) fn alive(&self) -> bool {
        self.info.lock().unwrap().alive
    }

    pub(super) fn uses_within(&self, window: Duration) -> usize {
        let mut info = self.info.lock().unwrap();
        while info.uses.front().map(|t| t.elapsed() > window).unwrap_or(false) {
            info.uses.pop_front();
        }
        info.uses.len()
    }
}

/// A handler's hold on the Zygote it was forked from: while any exist, the Zygote is not
/// evicted (it would take the handlers with it).
pub struct NodeUse(pub(super) Arc<Node>);

impl NodeUse {
    /// The Zygote held.
    pub fn node(&self) -> &Arc<Node> {
        &self.0
    }
}

impl Drop for NodeUse {
    fn drop(&mut self) {
        let mut info = self.0.info.lock().unwrap();
        info.handlers = info.handlers.saturating_sub(1);
    }
}

#[derive(Default)]
pub(super) struct Counters {
    pub(super) hits: AtomicU64,
    pub(super) created_for_miss: AtomicU64,
    pub(super) fallbacks: AtomicU64,
    pub(super) created: AtomicU64,
    pub(super) creation_failures: AtomicU64,
    pub(super) evictions: AtomicU64,
    pub(super) deaths: AtomicU64,
    pub(super) refreshes: AtomicU64,
    pub(super) root_restarts: AtomicU64,
    pub(super) spares_forked: AtomicU64,
    pub(super) spares_bound: AtomicU64,
    pub(super) spares_missed: AtomicU64,
    pub(super) spares_lost: AtomicU64,
    pub(super) spares_released: AtomicU64,
    pub(super) code_hits: AtomicU64,
}

/// Child Zygotes being made, by package set: later requests for the set wait for them.
pub(super) type Pending = Mutex<HashMap<BTreeSet<String>, Arc<OnceCell<Option<Arc<Node>>>>>>;

pub struct ImportCache {
    pub(super) cfg: ImportCacheConfig,
    pub(super) stage: Arc<Stage>,
    pub(super) layout: Arc<Layout>,
    pub(super) cgroup_parent: String,
    pub(super) nodes: Mutex<BTreeMap<u64, Arc<Node>>>,
    pub(super) root: tokio::sync::Mutex<Option<Arc<Node>>>,
    pub(super) pending: Pending,
    /// Code Zygotes being made, by key (no request waits for them).
    pub(super) code_pending: Mutex<std::collections::HashSet<String>>,
    pub(super) failed_sets: Mutex<HashMap<BTreeSet<String>, Instant>>,
    pub(super) learned: Mutex<HashMap<String, BTreeSet<String>>>,
    pub(super) userns: Option<OwnedFd>,
    pub(super) next_id: AtomicU64,
    pub(super) counters: Counters,
    /// The cgroup spares warm up in, made on first use.
    pub(super) spare_group: std::sync::OnceLock<Option<Cgroup>>,
}

/// Close a detached tree's descriptor off the async threads: the kernel dissolves the copy
/// (waiting for an RCU grace period) when the last holder lets go.
pub(super) fn drop_tree(tree: OwnedFd) {
    tokio::task::spawn_blocking(move || drop(tree));
}

/// A detached tree's descriptor, closed off the async threads when dropped.
pub struct DetachedTree(pub(super) Option<OwnedFd>);

impl Drop for DetachedTree {
    fn drop(&mut self) {
        if let Some(fd) = self.0.take() {
            drop_tree(fd);
        }
    }
}

/// The key of the code Zygote holding `code` over the packages `want`.
pub(super) fn code_key(want: &BTreeSet<String>, code: &SharedCode) -> String {
    let packages: Vec<&str> = want.iter().map(String::as_str).collect();
    format!("{}|{}", code.digest, packages.join(","))
}

/// How a code Zygote is named in logs and /stats.
pub(super) fn code_label(code: &SharedCode) -> String {
    format!("code:{}", &code.digest[..code.digest.len().min(12)])
}
