//! The import cache (SOCK sections 4.2-4.3): a tree of Zygotes, each an interpreter that has
//! imported some packages, forked from its parent so that they all share memory copy-on-write.
//!
//! * **Selection.** A handler is forked from the Zygote whose packages are the largest subset
//!   of what its lambda needs — never one holding a package the lambda did not ask for (ties
//!   broken at random). When that Zygote is not an exact match, a child that imports the rest
//!   is made first (requests for the same set wait for it), and the handler is forked from
//!   the child. The root Zygote imports nothing and serves lambdas without packages.
//! * **What a Zygote imports.** For each package it adds: the top-level modules of packages
//!   the lambda named, the modules of them its code imports (read at upload, [`ImportCache::hint`]),
//!   and those lambdas were seen to load (their hellos report them). When lambdas turn out to
//!   load more than an exact Zygote holds, a fuller one replaces it, up to [`MAX_REFRESHES`]
//!   times: built in the background on CPU time no request wants, while handlers keep being
//!   forked from the old one, and switched in when ready. Only the first cold start of a
//!   package set (and any arriving while its Zygote is built) waits for a Zygote.
//! * **Eviction.** When the Zygotes' PSS passes the limit, the one with the highest benefit/cost
//!   goes first: benefit = on-disk size of the packages it adds over its parent, cost = its
//!   uses (forks) within the recent window. Zygotes with live children (Zygotes or handlers)
//!   and those of a static tree are never evicted.
//! * **Faults.** A Zygote that dies takes its subtree with it (they live in its PID
//!   namespace); the next request for its packages makes a new one, and until then is served
//!   by the nearest live ancestor. A dead root Zygote is restarted.
//!
//! * **Code Zygotes.** A lambda whose ol.yaml asks to `preload` its own modules is forked from
//!   a child of its package Zygote that has imported them (and run its `call`) from the
//!   lambda's code without its settings files: one such Zygote serves every lambda with the
//!   same code and packages (many sites of one application), made in the background at the
//!   first cold start that finds none ([`code`]).
//!
//! Package Zygotes are confined more tightly than handlers need: see `userns` and
//! `mounts::clone_tree`. Starting and stopping Zygotes is in [`spawn`], eviction in [`evict`],
//! spares in [`spares`] (one spare and its pool in [`spare`]); the data they all share is in
//! [`state`].

mod code;
mod evict;
mod spare;
mod spares;
mod spawn;
mod state;

pub use evict::choose_victim;
pub use spare::SparePlan;
pub use spawn::accept_and_place;
pub use state::{DetachedTree, ImportCache, ImportCacheConfig, Node, NodeUse};

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::cgroup::{Cgroup, Layout};
use crate::error::Doing;
use crate::mounts;
use crate::process::PidFd;
use crate::spec::{CreateError, Package, SharedCode};
use crate::stage::Stage;
use crate::zygote::{ForkRequest, FLAG_MOUNT_PROC, FLAG_NETNS};
use state::{drop_tree, Counters, FAILURE_BACKOFF};

/// Times an exact Zygote may be replaced by a fuller one as lambdas reveal what they import.
pub const MAX_REFRESHES: u32 = 3;
/// Most modules learned per package.
const MAX_LEARNED: usize = 300;

/// One node of a static tree (OpenLambda's `{"packages": [...], "children": [...]}`) with its
/// packages resolved: everything the node holds, its ancestors' packages included.
#[derive(Debug, Clone)]
pub struct StaticNode {
    pub packages: Vec<Package>,
    pub children: Vec<StaticNode>,
}

/// A Zygote chosen for a handler.
pub struct Source {
    pub node: Arc<Node>,
    /// How the choice went: "hit", "created" or "fallback" (for lambdas with packages).
    pub outcome: &'static str,
}

impl ImportCache {
    pub fn new(cfg: ImportCacheConfig, stage: Arc<Stage>, layout: Arc<Layout>, cgroup_parent: &str) -> Arc<ImportCache> {
        // Package Zygotes need both a user namespace and detached mount trees (Linux 5.2) to
        // be confined; without them the cache stays off rather than run them less confined.
        let userns = if cfg.enabled {
            let confinable = mounts::clone_tree(&stage.base)
                .map_err(std::io::Error::from)
                .and_then(|_| crate::userns::create(cfg.zygote_uid, cfg.zygote_gid, cfg.uid, cfg.gid));
            match confinable {
                Ok(fd) => Some(fd),
                Err(e) => {
                    tracing::warn!("package Zygotes cannot be confined here ({e}): the import cache is off");
                    None
                }
            }
        } else {
            None
        };
        let cache = Arc::new(ImportCache {
            cfg,
            stage,
            layout,
            cgroup_parent: cgroup_parent.to_string(),
            nodes: Mutex::new(BTreeMap::new()),
            root: tokio::sync::Mutex::new(None),
            pending: Mutex::new(HashMap::new()),
            code_pending: Mutex::default(),
            failed_sets: Mutex::new(HashMap::new()),
            learned: Mutex::new(HashMap::new()),
            userns,
            next_id: AtomicU64::new(1),
            counters: Counters::default(),
            spare_group: std::sync::OnceLock::new(),
        });
        let weak = Arc::downgrade(&cache);
        tokio::spawn(async move { evict::maintain(weak).await });
        cache
    }

    /// The user namespace package Zygotes live in (a new descriptor), when they exist: the
    /// lambdas' network namespaces must belong to it for their handlers to join them.
    pub fn package_userns(&self) -> Option<OwnedFd> {
        self.userns.as_ref().filter(|_| self.cfg.enabled).and_then(|fd| fd.try_clone().ok())
    }

    fn enabled(&self) -> bool {
        self.cfg.enabled && self.userns.is_some()
    }

    /// The live root Zygote, started (or restarted) as needed.
    pub async fn root(self: &Arc<Self>) -> Result<Arc<Node>, CreateError> {
        let mut guard = self.root.lock().await;
        if let Some(root) = guard.as_ref() {
            if root.alive() {
                return Ok(root.clone());
            }
            self.counters.root_restarts.fetch_add(1, Ordering::Relaxed);
        }
        let root = Arc::new(self.start_root().await?);
        self.nodes.lock().unwrap().insert(0, root.clone());
        self.watch(&root).await;
        *guard = Some(root.clone());
        Ok(root)
    }

    /// The Zygote to fork a handler of a lambda needing `packages` from; makes a child
    /// Zygote first when no exact one exists. With `code`, the code Zygote of that code over
    /// it when one is ready (else one is made in the background: [`code`]).
    pub async fn source_for(self: &Arc<Self>, packages: &[Package], code: Option<&SharedCode>) -> Result<Source, CreateError> {
        let source = self.package_source(packages).await?;
        let Some(code) = code.filter(|_| self.enabled()) else {
            return Ok(source);
        };
        if !matches!(source.outcome, "none" | "hit" | "created") {
            return Ok(source); // no Zygote holds exactly its packages to build on
        }
        match self.code_source(&source.node, packages, code) {
            Some(node) => {
                self.counters.code_hits.fetch_add(1, Ordering::Relaxed);
                Ok(Source { node, outcome: "code" })
            }
            None => Ok(source),
        }
    }

    /// The package Zygote to fork a handler of a lambda needing `packages` from.
    async fn package_source(self: &Arc<Self>, packages: &[Package]) -> Result<Source, CreateError> {
        let root = self.root().await?;
        if packages.is_empty() {
            return Ok(Source { node: root, outcome: "none" });
        }
        if !self.enabled() {
            self.counters.fallbacks.fetch_add(1, Ordering::Relaxed);
            return Ok(Source { node: root, outcome: "fallback" });
        }
        let want: BTreeSet<String> = packages.iter().map(|p| p.key.clone()).collect();
        let best = self.best_subset(&want).unwrap_or(root);
        if best.packages == want {
            self.counters.hits.fetch_add(1, Ordering::Relaxed);
            self.maybe_refresh(&best, packages);
            return Ok(Source { node: best, outcome: "hit" });
        }
        let recently_failed = self.failed_sets.lock().unwrap().get(&want).map(|t| t.elapsed() < FAILURE_BACKOFF).unwrap_or(false);
        if best.depth >= self.cfg.max_depth || recently_failed {
            self.counters.fallbacks.fetch_add(1, Ordering::Relaxed);
            return Ok(Source { node: best, outcome: "fallback" });
        }
        let cell = self.pending.lock().unwrap().entry(want.clone()).or_default().clone();
        let made = cell
            .get_or_init(|| async {
                let made = self.create_child(&best, packages, false).await;
                self.pending.lock().unwrap().remove(&want);
                made
            })
            .await
            .clone();
        match made {
            Some(node) if node.alive() => {
                self.counters.created_for_miss.fetch_add(1, Ordering::Relaxed);
                Ok(Source { node, outcome: "created" })
            }
            _ => {
                self.counters.fallbacks.fetch_add(1, Ordering::Relaxed);
                Ok(Source { node: if best.alive() { best } else { self.root().await? }, outcome: "fallback" })
            }
        }
    }

    /// The live, current Zygote whose packages are the largest subset of `want`.
    fn best_subset(&self, want: &BTreeSet<String>) -> Option<Arc<Node>> {
        let nodes = self.nodes.lock().unwrap();
        let fitting: Vec<&Arc<Node>> = nodes
            .values()
            .filter(|n| n.packages.is_subset(want) && n.code.is_none())
            .filter(|n| {
                let info = n.info.lock().unwrap();
                info.alive && !info.retired
            })
            .collect();
        let most = fitting.iter().map(|n| n.packages.len()).max()?;
        let ties: Vec<&&Arc<Node>> = fitting.iter().filter(|n| n.packages.len() == most).collect();
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
        let pick = (nanos as usize / 64) % ties.len();
        Some((*ties[pick]).clone())
    }

    /// After a handler forked from `node` reported the package modules its lambda loaded
    /// ([`ImportCache::learn`]): when `node` holds exactly the lambda's `packages` and lacks
    /// some of those modules, start its fuller replacement now, rather than at the next
    /// cold start (which would then pay the imports again, competing with the build).
    pub fn refresh_after_learning(self: &Arc<Self>, node: &Arc<Node>, packages: &[Package]) {
        if packages.len() == node.packages.len() && packages.iter().all(|p| node.packages.contains(&p.key)) {
            self.maybe_refresh(node, packages);
        }
    }

    /// When lambdas load modules of an exact Zygote's packages that it has not imported,
    /// make a fuller replacement in the background (on idle CPU time) and retire this one
    /// when it is ready; until then handlers keep being forked from this one.
    fn maybe_refresh(self: &Arc<Self>, node: &Arc<Node>, packages: &[Package]) {
        if node.is_root() || node.pinned || node.code.is_some() || node.refreshes >= MAX_REFRESHES || !self.cfg.learn || !node.alive() {
            return;
        }
        let Some(parent) = node.parent.clone() else {
            return;
        };
        let missing = self.imports_for(&parent, packages).into_iter().any(|m| !node.modules.contains(&m) && !node.failed.contains_key(&m));
        if !missing {
            return;
        }
        {
            let mut info = node.info.lock().unwrap();
            if info.refreshing {
                return;
            }
            info.refreshing = true;
        }
        let (cache, old, packages) = (self.clone(), node.clone(), packages.to_vec());
        tokio::spawn(async move {
            let made = cache.create_child_with(&parent, &packages, false, old.refreshes + 1, None).await;
            if made.is_some() {
                cache.counters.refreshes.fetch_add(1, Ordering::Relaxed);
                old.info.lock().unwrap().retired = true;
            }
            old.info.lock().unwrap().refreshing = false;
        });
    }

    /// Fork a handler from `source` into the sandbox stitched at `root`. From the root
    /// Zygote the child joins `cgroup` itself and the pidfd is returned; from a package
    /// Zygote (untrusted) the root is a detached copy, and the caller must take the handler's
    /// identity from its connection and move it into the cgroup ([`accept_and_place`]), and
    /// only then let go of the copy's descriptor (returned in the [`Forked`]).
    pub async fn fork_handler(
        self: &Arc<Self>,
        source: &Arc<Node>,
        root: &Path,
        log: &OwnedFd,
        cgroup: &Cgroup,
        mount_proc: bool,
        netns: Option<RawFd>,
    ) -> Result<Forked, CreateError> {
        {
            let mut info = source.info.lock().unwrap();
            info.uses.push_back(Instant::now());
            info.total_uses += 1;
            info.handlers += 1;
        }
        let hold = NodeUse(source.clone());
        if source.is_root() {
            let root_dir = std::fs::File::open(root).at("opening the sandbox's root", root)?;
            let mut fds = vec![root_dir.as_raw_fd(), log.as_raw_fd()];
            fds.extend(netns);
            fds.extend(cgroup.procs_fds().iter().map(|f| f.as_raw_fd()));
            let flags = if mount_proc { FLAG_MOUNT_PROC } else { 0 } | if netns.is_some() { FLAG_NETNS } else { 0 };
            let request = ForkRequest { uid: self.cfg.uid, gid: self.cfg.gid, flags };
            let pidfd = match self.bind_spare(source, request, &fds, cgroup).await {
                Some(pidfd) => pidfd,
                None => self.fork_from(source, request, &fds).await?,
            };
            return Ok(Forked { process: Some(pidfd), hold, tree: None });
        }
        let t0 = Instant::now();
        let tree = mounts::clone_tree(root)?;
        let cloned = t0.elapsed();
        let mut fds = vec![tree.as_raw_fd(), log.as_raw_fd()];
        fds.extend(netns);
        let flags = if netns.is_some() { FLAG_NETNS } else { 0 };
        let request = ForkRequest { uid: self.cfg.uid, gid: self.cfg.gid, flags };
        // A package Zygote's word (the pidfd) is not trusted either way: the caller takes the
        // handler's identity from its connection.
        let result = match self.bind_spare(source, request, &fds, cgroup).await {
            Some(pidfd) => Ok(pidfd),
            None => self.fork_from(source, request, &fds).await,
        };
        tracing::debug!(
            zygote = source.id,
            clone_us = cloned.as_micros() as u64,
            fork_us = (t0.elapsed() - cloned).as_micros() as u64,
            "forked"
        );
        match result {
            Ok(_) => Ok(Forked { process: None, hold, tree: Some(DetachedTree(Some(tree))) }),
            Err(e) => {
                drop_tree(tree);
                Err(e)
            }
        }
    }

    /// Record the package modules a handler's lambda loaded (its hello's report).
    pub fn learn(&self, report: &BTreeMap<String, Vec<String>>) {
        if !self.cfg.learn {
            return;
        }
        let mut learned = self.learned.lock().unwrap();
        for (path, modules) in report {
            let Some(key) = path.strip_prefix("/packages/").filter(|k| k.contains("==")) else {
                continue;
            };
            let set = learned.entry(key.to_string()).or_default();
            for m in modules {
                if set.len() >= MAX_LEARNED {
                    break;
                }
                set.insert(m.clone());
            }
        }
    }

    /// Record the modules a lambda's code imports (found at upload) that belong to packages
    /// it asked for, as if a handler had reported loading them: the Zygote made for the
    /// lambda's first cold start then imports them ahead, rather than its first handlers each
    /// importing them and a fuller Zygote replacing it afterwards.
    pub fn hint(&self, packages: &[Package], imports: &[String]) {
        if !self.cfg.learn || imports.is_empty() || packages.is_empty() {
            return;
        }
        let mut learned = self.learned.lock().unwrap();
        for name in imports {
            let top = name.split('.').next().unwrap_or(name);
            let Some(package) = packages.iter().find(|p| p.modules.iter().any(|m| m == top)) else {
                continue;
            };
            let set = learned.entry(package.key.clone()).or_default();
            if set.len() < MAX_LEARNED && !set.contains(name) {
                set.insert(name.clone());
            }
        }
    }

    /// Make the Zygotes of a static tree (pinned: never evicted, remade when they die).
    pub async fn preload(self: &Arc<Self>, tree: &[StaticNode]) {
        let Ok(root) = self.root().await else { return };
        let mut stack: Vec<(Arc<Node>, &StaticNode)> = tree.iter().map(|n| (root.clone(), n)).collect();
        while let Some((parent, spec)) = stack.pop() {
            let Some(node) = self.create_child(&parent, &spec.packages, true).await else {
                continue;
            };
            stack.extend(spec.children.iter().map(|c| (node.clone(), c)));
        }
    }

    pub fn counters(&self) -> [(&'static str, &'static str, u64); 15] {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        [
            ("sprout_import_cache_hits", "Handlers forked from a Zygote holding all their packages", get(&c.hits)),
            ("sprout_import_cache_misses", "Handlers for which a child Zygote was made first", get(&c.created_for_miss)),
            ("sprout_import_cache_fallbacks", "Handlers forked from a Zygote lacking some of their packages", get(&c.fallbacks)),
            ("sprout_zygotes_created", "Child Zygotes made", get(&c.created)),
            ("sprout_zygote_creation_failures", "Child Zygotes that failed to start", get(&c.creation_failures)),
            ("sprout_zygote_evictions", "Zygotes evicted from the import cache", get(&c.evictions)),
            ("sprout_zygote_deaths", "Zygotes that died by themselves", get(&c.deaths)),
            ("sprout_zygote_restarts", "Times the root Zygote was restarted", get(&c.root_restarts)),
            ("sprout_zygote_refreshes", "Zygotes replaced by fuller ones as lambdas revealed their imports", get(&c.refreshes)),
            ("sprout_spares_forked", "Children forked from Zygotes ahead of demand (spares)", get(&c.spares_forked)),
            ("sprout_spares_bound", "Cold starts served by binding a spare", get(&c.spares_bound)),
            ("sprout_spares_missed", "Cold starts that found no spare ready and forked", get(&c.spares_missed)),
            ("sprout_spares_lost", "Spares found dead or unbindable when taken", get(&c.spares_lost)),
            ("sprout_spares_released", "Spares let go as their Zygote went idle", get(&c.spares_released)),
            ("sprout_code_zygote_hits", "Handlers forked from a code Zygote holding their lambda's code", get(&c.code_hits)),
        ]
    }

    /// The tree and the cache's figures, for /stats and `sprout zygotes`.
    pub fn stats(&self) -> Value {
        let nodes = self.nodes.lock().unwrap();
        fn describe(node: &Node, nodes: &BTreeMap<u64, Arc<Node>>, window: Duration) -> Value {
            let recent = node.uses_within(window);
            let info = node.info.lock().unwrap();
            let children: Vec<Value> = info.children.iter().filter_map(|c| nodes.get(c)).map(|c| describe(c, nodes, window)).collect();
            json!({
                "id": node.id,
                "adds": node.added,
                "packages": node.packages.len(),
                "modules": node.modules.len(),
                "failed_imports": node.failed.len(),
                "uses": info.total_uses,
                "recent_uses": recent,
                "handlers": info.handlers,
                "pss_mb": info.pss as f64 / (1 << 20) as f64,
                "benefit_mb": node.benefit as f64 / (1 << 20) as f64,
                "start_ms": node.start_ms,
                "age_s": node.created.elapsed().as_secs(),
                "pinned": node.pinned && node.parent.is_some(),
                "code": node.code.is_some(),
                "retired": info.retired,
                "replacing": info.refreshing,
                "spares": node.spares.lock().unwrap().ready(),
                "children": children,
            })
        }
        let tree = nodes.get(&0).map(|root| describe(root, &nodes, self.cfg.window));
        let package_pss: u64 = nodes.values().filter(|n| !n.is_root()).map(|n| n.info.lock().unwrap().pss).sum();
        let mut out = serde_json::Map::new();
        out.insert("enabled".into(), json!(self.enabled()));
        out.insert("zygotes".into(), json!(nodes.len()));
        out.insert("package_zygotes_pss_mb".into(), json!(package_pss as f64 / (1 << 20) as f64));
        out.insert("memory_limit_mb".into(), json!(self.cfg.memory_limit >> 20));
        out.insert("spares_ready".into(), json!(nodes.values().map(|n| n.spares.lock().unwrap().ready()).sum::<usize>()));
        out.insert("spares_max".into(), json!(self.cfg.spares.max));
        out.insert("spares_memory_mb".into(), json!(self.spares_memory() as f64 / (1 << 20) as f64));
        for (name, _, value) in self.counters() {
            out.insert(name.trim_start_matches("sprout_").to_string(), json!(value));
        }
        out.insert("tree".into(), tree.unwrap_or(Value::Null));
        Value::Object(out)
    }
}

/// A handler just forked: its process (when the Zygote is trusted to say), its hold on the
/// Zygote, and the descriptor of its detached root, to be dropped once it has connected.
pub struct Forked {
    pub process: Option<PidFd>,
    pub hold: NodeUse,
    pub tree: Option<DetachedTree>,
}
