//! Starting, forking and stopping the import cache's Zygotes: the root Zygote, child Zygotes
//! that import packages, and forgetting a subtree when its Zygote dies or is evicted.

use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::state::{code_key, code_label, drop_tree, ImportCache, Node, NodeInfo};
use crate::cgroup::Cgroup;
use crate::channel::{CodeOrder, Endpoint, Hello, ZygoteOrder};
use crate::error::{Doing, PlatformError};
use crate::mounts;
use crate::output::log_pipe;
use crate::process::{spawn, PidFd, SpawnSpec};
use crate::spec::{sandbox_env, CreateError, Package, SharedCode};
use crate::stage::HELPER_IN_SANDBOX;
use crate::zygote::{ForkError, ForkRequest, ZygoteProcess, FLAG_USERNS, FLAG_ZYGOTE};

impl ImportCache {
    pub(super) async fn start_root(&self) -> Result<Node, CreateError> {
        let dir = self.stage.zygote_dir(0);
        let root = dir.join("root");
        std::fs::create_dir_all(&root).at("creating the root Zygote's root", &root)?;
        let _ = mounts::detach(&root);
        self.stage.stitch(&root, None, 16, 0, 0).at("stitching the root Zygote's root", &root)?;
        let result = async {
            let endpoint = Endpoint::listen_in(&root.join("host"))?;
            let name = format!("{}/zygote-0", self.cgroup_parent);
            let mut cgroup = Cgroup::create(self.layout.clone(), &name).doing(format!("creating the cgroup {name}"))?;
            cgroup.set_limits(&self.cfg.zygote_limits).doing("limiting the root Zygote's cgroup")?;
            let log = log_pipe("<zygote 0>", 0).doing("making the root Zygote's log pipe")?;
            let argv = [self.cfg.python.clone(), "-I".into(), "-S".into(), HELPER_IN_SANDBOX.into(), "zygote".into()];
            let started = Instant::now();
            let process = spawn(&SpawnSpec {
                root: &root,
                cgroup_procs: cgroup.procs_fds(),
                new_namespaces: true,
                new_network: self.cfg.isolate_network,
                netns: None,
                seccomp: self.cfg.seccomp,
                mount_proc: false,
                hostname: Some("zygote"),
                user: None,
                argv: &argv,
                env: &sandbox_env(&[]),
                output: Some(log.as_raw_fd()),
                workdir: None,
            })
            .doing(format!("running {}", self.cfg.python))?;
            drop(log);
            let (mut channel, _) = match endpoint.accept(self.cfg.start_timeout, 1 << 20).await {
                Ok(c) => c,
                Err(e) => {
                    process.kill();
                    process.reap();
                    return Err(e.into());
                }
            };
            let hello: Hello = channel.recv().await.map(|(h, _)| h).doing("the root Zygote died while starting")?;
            if hello.role.as_deref() != Some("zygote") {
                process.kill();
                return Err(PlatformError::protocol("the root Zygote", hello).into());
            }
            tracing::info!(pid = process.pid(), "root Zygote ready");
            let zygote = ZygoteProcess { channel, process, cgroup, root: root.clone() };
            Ok(Node {
                id: 0,
                parent: None,
                depth: 0,
                packages: BTreeSet::new(),
                added: Vec::new(),
                benefit: 0,
                modules: BTreeSet::new(),
                failed: BTreeMap::new(),
                pinned: true,
                refreshes: 0,
                code: None,
                created: Instant::now(),
                start_ms: started.elapsed().as_secs_f64() * 1000.0,
                process: tokio::sync::Mutex::new(Some(zygote)),
                info: Mutex::new(NodeInfo { alive: true, ..Default::default() }),
                spares: Mutex::default(),
            })
        }
        .await;
        if result.is_err() {
            let _ = mounts::detach(&root);
        }
        result
    }

    /// Notice when `node`'s process exits, and forget it (and its subtree) then.
    pub(super) async fn watch(self: &Arc<Self>, node: &Arc<Node>) {
        let pidfd = match node.process.lock().await.as_ref().map(|z| z.process.try_clone()) {
            Some(Ok(p)) => p,
            _ => return,
        };
        let weak = Arc::downgrade(self);
        let id = node.id;
        tokio::spawn(async move {
            while !pidfd.exited(Duration::from_secs(3600)).await {}
            if let Some(cache) = weak.upgrade() {
                cache.forget(id, true).await;
            }
        });
    }

    /// Remove node `id` and its descendants from the tree and stop their processes. `died`:
    /// it exited by itself (rather than being evicted or shut down).
    pub(super) async fn forget(self: &Arc<Self>, id: u64, died: bool) {
        let mut doomed = Vec::new();
        {
            let mut nodes = self.nodes.lock().unwrap();
            let mut stack = vec![id];
            while let Some(n) = stack.pop() {
                if let Some(node) = nodes.remove(&n) {
                    let mut info = node.info.lock().unwrap();
                    info.alive = false;
                    stack.extend(info.children.iter().copied());
                    drop(info);
                    if let Some(parent) = &node.parent {
                        parent.info.lock().unwrap().children.remove(&n);
                    }
                    doomed.push(node);
                }
            }
        }
        if doomed.is_empty() {
            return;
        }
        if died {
            self.counters.deaths.fetch_add(doomed.len() as u64, Ordering::Relaxed);
            tracing::warn!(zygote = id, lost = doomed.len(), "a Zygote died; it is replaced when next needed");
        }
        // Children first: a parent's death would kill them anyway, but their mounts and
        // cgroups are ours to remove. Spares die with their Zygotes; dropping them says so.
        for node in doomed.into_iter().rev() {
            let spares = std::mem::take(&mut *node.spares.lock().unwrap());
            drop(spares);
            if let Some(z) = node.process.lock().await.take() {
                z.stop().await;
            }
        }
    }

    /// Whether `node`'s Zygote has died or is dying (its end of the channel is closed, as
    /// happens before its children in its PID namespace are killed). If so it is forgotten
    /// now, rather than when its exit is noticed, so the next choice does not fall on it.
    pub async fn lost(self: &Arc<Self>, node: &Arc<Node>) -> bool {
        let gone = match node.process.lock().await.as_ref() {
            Some(zygote) => zygote.process.has_exited() || zygote.channel.peer_closed(),
            None => true,
        };
        // Only this very node: a restarted root has the same id.
        let current = self.nodes.lock().unwrap().get(&node.id).is_some_and(|n| Arc::ptr_eq(n, node));
        if gone && current {
            self.forget(node.id, true).await;
        }
        gone
    }

    pub(super) async fn create_child(self: &Arc<Self>, parent: &Arc<Node>, packages: &[Package], pinned: bool) -> Option<Arc<Node>> {
        self.create_child_with(parent, packages, pinned, 0, None).await
    }

    /// Fork a child Zygote of `parent` holding `packages` (and `code`, for a code Zygote) and
    /// wait until it has imported them.
    pub(super) async fn create_child_with(
        self: &Arc<Self>,
        parent: &Arc<Node>,
        packages: &[Package],
        pinned: bool,
        refreshes: u32,
        code: Option<&SharedCode>,
    ) -> Option<Arc<Node>> {
        let want: BTreeSet<String> = packages.iter().map(|p| p.key.clone()).collect();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let started = Instant::now();
        // Replacements and code Zygotes are made while requests are served by what exists:
        // they import on CPU time no request wants.
        let background = refreshes > 0 || code.is_some();
        match self.spawn_child(id, parent, packages, code, background).await {
            Ok((zygote, hello)) => {
                let code_key = code.map(|c| code_key(&want, c));
                let mut added: Vec<String> = packages.iter().filter(|p| !parent.packages.contains(&p.key)).map(|p| p.key.clone()).collect();
                let mut benefit = packages.iter().filter(|p| added.contains(&p.key)).map(|p| p.size_bytes).sum();
                if let Some(code) = code {
                    added.push(code_label(code));
                    benefit += code.size_bytes;
                }
                let mut modules = parent.modules.clone();
                modules.extend(hello.imported.unwrap_or_default());
                let mut failed = hello.failed.unwrap_or_default();
                if !failed.is_empty() {
                    tracing::info!(zygote = id, ?failed, "some modules could not be imported ahead; handlers import them");
                }
                // Not tried again by a fuller Zygote either.
                failed.extend(hello.absent.unwrap_or_default().into_iter().map(|name| (name, "not a module".to_string())));
                let node = Arc::new(Node {
                    id,
                    parent: Some(parent.clone()),
                    depth: parent.depth + 1,
                    packages: want,
                    added,
                    benefit,
                    modules,
                    failed,
                    pinned,
                    refreshes,
                    code: code_key,
                    created: Instant::now(),
                    start_ms: started.elapsed().as_secs_f64() * 1000.0,
                    process: tokio::sync::Mutex::new(Some(zygote)),
                    info: Mutex::new(NodeInfo { alive: true, ..Default::default() }),
                    spares: Mutex::default(),
                });
                {
                    let mut nodes = self.nodes.lock().unwrap();
                    let mut parent_info = parent.info.lock().unwrap();
                    if !parent_info.alive {
                        // The parent died meanwhile, and this child with it.
                        drop(parent_info);
                        drop(nodes);
                        self.counters.creation_failures.fetch_add(1, Ordering::Relaxed);
                        let node2 = node.clone();
                        let cache = self.clone();
                        tokio::spawn(async move {
                            if let Some(z) = node2.process.lock().await.take() {
                                z.stop().await;
                            }
                            drop(cache);
                        });
                        return None;
                    }
                    parent_info.children.insert(id);
                    nodes.insert(id, node.clone());
                }
                self.watch(&node).await;
                self.counters.created.fetch_add(1, Ordering::Relaxed);
                tracing::info!(
                    zygote = id,
                    parent = parent.id,
                    packages = ?node.added,
                    modules = node.modules.len() - parent.modules.len(),
                    ms = format!("{:.1}", node.start_ms),
                    "child Zygote ready"
                );
                Some(node)
            }
            Err(e) => {
                self.counters.creation_failures.fetch_add(1, Ordering::Relaxed);
                let failed = match code {
                    Some(code) => BTreeSet::from([code_key(&want, code)]),
                    None => want,
                };
                self.failed_sets.lock().unwrap().insert(failed, Instant::now());
                match code {
                    Some(code) => tracing::warn!(parent = parent.id, code = %code_label(code), "a code Zygote failed to start \
                        (its lambdas' sandboxes load their code themselves meanwhile): {e}"),
                    None => tracing::warn!(parent = parent.id, "a child Zygote failed to start: {e}"),
                }
                None
            }
        }
    }

    /// Modules to import for `packages` beyond what `parent` holds.
    pub(super) fn imports_for(&self, parent: &Node, packages: &[Package]) -> Vec<String> {
        let learned = self.learned.lock().unwrap();
        let mut out: Vec<String> = Vec::new();
        for p in packages.iter().filter(|p| !parent.packages.contains(&p.key)) {
            let mut names: Vec<String> = p.modules.clone();
            if let Some(seen) = learned.get(&p.key) {
                names.extend(seen.iter().cloned());
            }
            for n in names {
                if !out.contains(&n) && !parent.modules.contains(&n) {
                    out.push(n);
                }
            }
        }
        out
    }

    pub(super) async fn spawn_child(
        self: &Arc<Self>,
        id: u64,
        parent: &Arc<Node>,
        packages: &[Package],
        code: Option<&SharedCode>,
        background: bool,
    ) -> Result<(ZygoteProcess, Hello), CreateError> {
        let dir = self.stage.zygote_dir(id);
        let root = dir.join("root");
        std::fs::create_dir_all(&root).at("creating a Zygote's root", &root)?;
        // A code Zygote's /handler is the shared code, which holds no lambda's settings.
        let handler = code.map(|c| c.dir.as_path());
        self.stage.stitch(&root, handler, 16, self.cfg.uid, self.cfg.gid).at("stitching a Zygote's root", &root)?;
        let name = format!("{}/zygote-{id}", self.cgroup_parent);
        let mut cgroup = match Cgroup::create(self.layout.clone(), &name) {
            Ok(c) => c,
            Err(e) => {
                let _ = mounts::detach(&root);
                return Err(PlatformError::io(format!("creating the cgroup {name}"), e).into());
            }
        };
        let result = async {
            cgroup.set_limits(&self.cfg.zygote_limits).doing("limiting a Zygote's cgroup")?;
            if background {
                cgroup.set_idle(true).doing("idling a Zygote's cgroup")?;
            }
            let endpoint = Endpoint::listen_in(&root.join("host"))?;
            let log = log_pipe(&format!("<zygote {id}>"), id).doing("making a Zygote's log pipe")?;
            let tree = mounts::clone_tree(&root)?;
            let mut fds: Vec<RawFd> = vec![tree.as_raw_fd(), log.as_raw_fd()];
            let mut flags = FLAG_ZYGOTE;
            if parent.is_root() {
                let Some(userns) = self.userns.as_ref() else {
                    let error = std::io::Error::new(std::io::ErrorKind::Unsupported, "no user namespace to confine it in");
                    return Err(PlatformError::io("starting a package Zygote", error).into());
                };
                fds.push(userns.as_raw_fd());
                flags |= FLAG_USERNS;
            }
            let request = ForkRequest { uid: 0, gid: 0, flags };
            // A spare of the parent becomes the child as a fork would, without the fork's
            // new namespaces and page-table copy on this cold start's path (1.4-2 ms).
            if self.bind_spare(parent, request, &fds, &cgroup).await.is_none() {
                self.fork_from(parent, request, &fds).await?;
            }
            drop(log);
            // Held until the child has connected: the last holder of a detached tree waits for
            // an RCU grace period as it goes, and that must not be the new Zygote.
            let accepted = accept_and_place(endpoint, &cgroup, self.cfg.start_timeout, 1 << 20).await;
            drop_tree(tree);
            let (mut channel, process) = accepted?;
            let imports = self.imports_for(parent, packages);
            let paths: Vec<String> = packages.iter().map(|p| p.path.clone()).collect();
            let code_order = code.map(|c| CodeOrder { modules: &c.modules, call: c.call.as_deref() });
            let order = ZygoteOrder { op: "zygote", paths: &paths, imports: &imports, code: code_order };
            channel.send(&order, &[]).await.doing("sending a child Zygote its imports")?;
            let hello = tokio::time::timeout(self.cfg.import_timeout, channel.recv::<Hello>()).await;
            let hello = match hello {
                Ok(Ok((h, _))) if code.is_some() && h.error.is_some() => {
                    let said = format!("{}{}", h.message.unwrap_or_default(), h.traceback.map(|t| format!("\n{t}")).unwrap_or_default());
                    return Err(PlatformError::exited("the code Zygote", format!("loading the shared code: {said}")).into());
                }
                Ok(Ok((h, _))) if h.role.as_deref() == Some("zygote") => h,
                Ok(Ok((h, _))) => return Err(PlatformError::protocol("the child Zygote", h).into()),
                Ok(Err(_)) if cgroup.oom_kills() > 0 => {
                    return Err(PlatformError::exited("the child Zygote", "out of memory while importing").into())
                }
                Ok(Err(e)) => return Err(PlatformError::io("the child Zygote died while importing", e).into()),
                Err(_) => return Err(PlatformError::timed_out("the child Zygote", "import", self.cfg.import_timeout).into()),
            };
            if background {
                cgroup.set_idle(false).doing("un-idling a Zygote's cgroup")?;
            }
            Ok((channel, process, hello))
        }
        .await;
        match result {
            Ok((channel, process, hello)) => Ok((ZygoteProcess { channel, process, cgroup, root }, hello)),
            Err(e) => {
                cgroup.kill_all();
                cgroup.wait_empty(Duration::from_secs(5)).await;
                let _ = mounts::detach(&root);
                let _ = std::fs::remove_dir_all(&dir);
                let _ = cgroup.remove();
                Err(e)
            }
        }
    }

    /// Send a fork request to `node`. A root that stopped answering is restarted by the next
    /// caller of [`ImportCache::root`]; a child that did is forgotten.
    pub(super) async fn fork_from(&self, node: &Arc<Node>, request: ForkRequest, fds: &[RawFd]) -> Result<PidFd, CreateError> {
        let mut guard = node.process.lock().await;
        let Some(zygote) = guard.as_mut() else {
            return Err(PlatformError::ZygoteLost { id: node.id, why: "is gone".into() }.into());
        };
        match zygote.fork(request, fds, self.cfg.start_timeout).await {
            Ok(pidfd) => Ok(pidfd),
            Err(ForkError::Refused(error)) => Err(PlatformError::ForkRefused { id: node.id, error }.into()),
            Err(ForkError::Broken(why)) => {
                node.info.lock().unwrap().alive = false;
                if let Some(z) = guard.take() {
                    z.process.kill();
                }
                Err(PlatformError::ZygoteLost { id: node.id, why: format!("stopped answering: {why}") }.into())
            }
        }
    }

    /// Stop every Zygote (at shutdown).
    pub async fn shutdown(self: &Arc<Self>) {
        let root = self.root.lock().await.take();
        let ids: Vec<u64> = self.nodes.lock().unwrap().keys().copied().filter(|id| *id != 0).collect();
        for id in ids.into_iter().rev() {
            self.forget(id, false).await;
        }
        if let Some(root) = root {
            self.forget(root.id, false).await;
        }
        if let Some(Some(group)) = self.spare_group.get() {
            group.kill_all(); // spares died with their Zygotes; this is the fallback
            group.wait_empty(Duration::from_secs(5)).await;
            for dir in group.dirs() {
                let _ = std::fs::remove_dir(dir);
            }
        }
    }
}

/// Wait for the process forked into a sandbox to connect, take its identity from the
/// connection (the kernel's word, not the Zygote's) and move it into `cgroup`.
pub async fn accept_and_place(
    endpoint: Endpoint,
    cgroup: &Cgroup,
    timeout: Duration,
    max_body: u32,
) -> Result<(crate::channel::Channel, PidFd), CreateError> {
    let (channel, peer) = endpoint.accept(timeout, max_body).await?;
    let peer = peer.ok_or_else(|| PlatformError::exited("the process that connected", "before it could be identified"))?;
    crate::cgroup::move_pid(cgroup.procs_fds(), peer.pid()).await.doing("moving the new process into its cgroup")?;
    if peer.has_exited() {
        return Err(PlatformError::exited("the new process", "during setup").into());
    }
    Ok((channel, peer))
}
