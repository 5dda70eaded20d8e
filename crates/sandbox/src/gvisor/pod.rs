//! One lambda's gVisor sandbox (a pod): a runsc container whose first process is the helper
//! as that lambda's Zygote (`helper.py pod`), holding the lambda's packages imported, which
//! forks the lambda's handlers inside gVisor's kernel. Every helper in the pod connects to
//! one socket the worker listens on in the pod's scratch directory: the Zygote first (its
//! control channel), then each spare it forks, which says its pid and waits to be bound.
//! Spares are forked ahead, so a cold start inside a running pod only binds one. A pod is
//! started afresh (`runsc run`, the Zygote then imports the packages) or restored from its
//! package set's template ([`super::template`]), its Zygote and spares already made.
//!
//! An idle pod can be parked ([`Pod::park`]): its handlers and its Zygote let go of their
//! channels, `runsc checkpoint` writes it to disk and its processes end; restored from that
//! image ([`Pod::restore`]), each process reaches the new pod's socket on its own, the
//! handlers saying who they are ([`Resumed`]), their globals as they were.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::{mpsc, Mutex, Notify};

use super::ahead::{remove_bundle, Created};
use super::bundle::{pods_pids, Bundle, Contents};
use super::runsc::Runsc;
use super::settings::PodSettings;
use super::zygote::{import_packages, recv_hello};
use crate::channel::{Channel, Endpoint, SOCKET_NAME};
use crate::error::{Doing, PlatformError};
use crate::network::LambdaNetwork;
use crate::output::{OutputPipe, OutputSink};
use crate::spec::{CreateError, SandboxSpec};
use crate::stage::Stage;

/// A spare that has connected: its channel and its pid inside the pod.
pub(crate) struct Spare {
    pub channel: Channel,
    pub pid: i32,
}

/// Handlers of a restored pod that have reached it again, by pid, until their sandboxes
/// take them back ([`Pod::resumed`]).
#[derive(Default)]
struct Resumed {
    channels: std::sync::Mutex<HashMap<i32, Channel>>,
    arrived: Notify,
}

impl Resumed {
    fn add(&self, pid: i32, channel: Channel) {
        self.channels.lock().expect("resumed lock").insert(pid, channel);
        self.arrived.notify_waiters();
    }
}

/// A pod written to disk: its image and what it held.
pub(crate) struct Parked {
    pub image: PathBuf,
    /// The image's bytes on disk.
    pub bytes: u64,
    /// How long parking took, from the first handler told to the container gone.
    pub took: Duration,
    /// The handlers in it.
    pub pids: Vec<i32>,
}

/// A running pod.
pub(crate) struct Pod {
    pub id: u64,
    pub container: String,
    pub bundle: PathBuf,
    pub scratch: PathBuf,
    pub cgroup: String,
    control: Mutex<Channel>,
    spares: Mutex<mpsc::Receiver<Spare>>,
    /// Spares asked for and not yet taken.
    pending: AtomicUsize,
    /// Cold starts so far: the spares' trim after a quiet moment checks none came since.
    cold_starts: AtomicU64,
    accepting: tokio::task::JoinHandle<()>,
    /// The lambda's namespace, held while the pod runs in it (idle, it may outlive the
    /// lambda's sandboxes, which hold it too).
    network: Option<Arc<LambdaNetwork>>,
    /// The namespace of a pod created ahead while its lambda's link is lent to it.
    lent: std::sync::Mutex<Option<OwnedFd>>,
    /// Its own output (the Zygote's, and gVisor's), kept while it runs.
    _output: OutputPipe,
    next_fifo: AtomicU64,
    resumed: Arc<Resumed>,
    max_body: u32,
}

#[derive(Deserialize)]
struct Forked {
    #[serde(default)]
    pids: Vec<i32>,
    #[serde(default)]
    error: Option<String>,
}

impl Pod {
    /// Start a pod for `spec`'s lambda: write its bundle, run it, wait for the Zygote's hello,
    /// have it import the lambda's packages, and ask for the first spares.
    pub async fn start(
        id: u64,
        runsc: &Runsc,
        settings: &PodSettings,
        stage: &Stage,
        spec: &SandboxSpec,
        sink: Arc<dyn OutputSink>,
    ) -> Result<Pod, CreateError> {
        let network = spec.network.clone().filter(|n| n.fd() >= 0);
        let code = stage.code_view(&spec.code_dir);
        let contents = Contents { handler: Some(&code), env: &spec.env, network: network.as_ref().map(|n| n.fd()), pids: pods_pids(spec) };
        let bundle = Bundle::write(settings, stage, &format!("pod-{id}"), contents).await?;
        let (output, log) = OutputPipe::new(id, sink).doing("making the pod's log pipe")?;
        if let Some(network) = &network {
            // A pod before this one in the lambda's namespace took its address away.
            network.configure_again().doing("configuring the lambda's network namespace")?;
        }
        runsc.run(&bundle.container, &bundle.dir, network.is_some(), log).await?;
        runsc.join_worker_cpuset(&bundle.cgroup);
        let timeout = settings.cfg.start_timeout;
        let (mut control, _) = bundle.endpoint.accept_next(timeout, settings.cfg.max_response).await?;
        let hello = recv_hello(&mut control, timeout, "start").await?;
        if hello.role.as_deref() != Some("pod") {
            return Err(PlatformError::Engine {
                engine: "gvisor",
                doing: "start the pod".into(),
                message: format!("a hello as {:?}", hello.role),
            }
            .into());
        }
        let imports: Vec<String> = spec.packages.iter().flat_map(|p| p.modules.iter().cloned()).collect();
        import_packages(&mut control, &spec.paths, &imports, spec.shared_code.as_ref(), timeout).await?;
        let pod = Pod::assemble(id, bundle, control, network, output, 0, settings);
        pod.fork_spares(settings, settings.cfg.spares.max(1)).await?;
        Ok(pod)
    }

    /// A pod for `spec`'s lambda restored from `image` (its package set's template, or its own
    /// parked pod), into `created` (a container created ahead: the lambda's code is bound onto
    /// its /handler and the lambda's link lent to its namespace) or, without one, into a
    /// container created now with the lambda's code and namespace. The restored Zygote
    /// reaches the new pod's socket on its own, with its spares (a template's) or its
    /// handlers (a parked pod's) behind it.
    #[allow(clippy::too_many_arguments)]
    pub async fn restore(
        id: u64,
        runsc: &Runsc,
        settings: &PodSettings,
        stage: &Stage,
        spec: &SandboxSpec,
        image: &Path,
        created: Option<Created>,
        sink: Arc<dyn OutputSink>,
    ) -> Result<Pod, CreateError> {
        let network = spec.network.clone().filter(|n| n.fd() >= 0);
        let code = stage.code_view(&spec.code_dir);
        let started = std::time::Instant::now();
        let (bundle, lent) = match created {
            Some(created) => {
                if let Err(e) = lend(&created.netns, &code, &created.bundle, network.as_ref()).await {
                    stop(runsc, &created.bundle.container, &created.bundle.dir, Some(&created.netns), network.as_deref()).await;
                    return Err(e.into());
                }
                (created.bundle, Some(created.netns))
            }
            None => {
                let contents =
                    Contents { handler: Some(&code), env: &[], network: network.as_ref().map(|n| n.fd()), pids: pods_pids(spec) };
                let bundle = Bundle::write(settings, stage, &format!("pod-{id}"), contents).await?;
                if let Some(network) = &network {
                    network.configure_again().doing("configuring the lambda's network namespace")?;
                }
                runsc.create(&bundle.container, &bundle.dir, network.is_some(), None).await?;
                runsc.join_worker_cpuset(&bundle.cgroup);
                (bundle, None)
            }
        };
        let create = started.elapsed();
        let restored = restored(runsc, settings, &bundle, image, network.is_some(), sink).await;
        let (control, hello, output, early) = match restored {
            Ok(restored) => restored,
            Err(e) => {
                stop(runsc, &bundle.container, &bundle.dir, lent.as_ref(), network.as_deref()).await;
                return Err(e.into());
            }
        };
        let spares = hello["spares"].as_array().map_or(0, Vec::len);
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let restore = ms(started.elapsed() - create);
        tracing::debug!(pod = id, create_ms = ms(create), restore_ms = restore, "a pod restored (the restore until the Zygote's hello)");
        let mut pod = Pod::assemble(id, bundle, control, network, output, spares, settings);
        pod.lent = std::sync::Mutex::new(lent);
        for (pid, channel) in early {
            pod.resumed.add(pid, channel);
        }
        Ok(pod)
    }

    fn assemble(
        id: u64,
        bundle: Bundle,
        control: Channel,
        network: Option<Arc<LambdaNetwork>>,
        output: OutputPipe,
        spares: usize,
        settings: &PodSettings,
    ) -> Pod {
        let (sender, receiver) = mpsc::channel(64);
        let resumed = Arc::new(Resumed::default());
        let accepting = tokio::spawn(accept_helpers(bundle.endpoint, sender, resumed.clone(), settings.cfg.max_response));
        Pod {
            id,
            container: bundle.container,
            bundle: bundle.dir,
            scratch: bundle.scratch,
            cgroup: bundle.cgroup,
            control: Mutex::new(control),
            spares: Mutex::new(receiver),
            pending: AtomicUsize::new(spares),
            cold_starts: AtomicU64::new(0),
            accepting,
            network,
            lent: std::sync::Mutex::new(None),
            _output: output,
            next_fifo: AtomicU64::new(1),
            resumed,
            max_body: settings.cfg.max_response,
        }
    }

    /// Park the pod into `image`: stop taking connections, let its spares go, tell each of
    /// its handlers (`handlers`: descriptors of their channels; every one idle) and then its
    /// Zygote to let go of its channel, checkpoint it and stop it. Its lambda's link, if
    /// lent to it, goes back to the lambda's namespace. On an error the pod is half parked:
    /// the caller stops it.
    pub async fn park(&self, runsc: &Runsc, handlers: Vec<(i32, OwnedFd)>, image: &Path) -> Result<Parked, PlatformError> {
        let started = Instant::now();
        self.accepting.abort();
        let socket = self.scratch.join(SOCKET_NAME);
        std::fs::remove_file(&socket).at("removing", &socket)?;
        self.let_spares_go(self.cold_starts.load(Ordering::Relaxed)).await;
        let timeout = Duration::from_secs(10);
        let pids = handlers.iter().map(|(pid, _)| *pid).collect();
        for (_, fd) in handlers {
            let stream = std::os::unix::net::UnixStream::from(fd);
            stream.set_nonblocking(true).doing("parking a handler")?;
            let mut channel = Channel::new(tokio::net::UnixStream::from_std(stream).doing("parking a handler")?, self.max_body);
            channel.send(&json!({"op": "park"}), &[]).await.doing("telling a handler to park")?;
            match tokio::time::timeout(timeout, channel.recv::<Value>()).await {
                Ok(Ok((said, _))) if said["op"] == "parked" => {}
                Ok(Ok((said, _))) => return Err(PlatformError::Protocol { process: "a parked handler".into(), said: said.to_string() }),
                Ok(Err(e)) => return Err(e).doing("a handler being parked"),
                Err(_) => return Err(PlatformError::timed_out("a handler", "park", timeout)),
            }
        }
        {
            let mut control = self.control.lock().await;
            control.send(&json!({"op": "park"}), &[]).await.doing("telling the pod's Zygote to park")?;
            let answered = tokio::time::timeout(timeout, control.recv::<Value>()).await;
            let hung_up = tokio::time::timeout(timeout, control.recv::<Value>()).await;
            if !matches!(answered, Ok(Ok(_))) || !matches!(hung_up, Ok(Err(_))) {
                return Err(PlatformError::Protocol { process: "the pod's Zygote".into(), said: "no answer and hang-up to park".into() });
            }
        }
        tokio::fs::create_dir_all(image).await.at("making", image)?;
        runsc.checkpoint(&self.container, &self.bundle, image, self.network.is_some(), "park the pod").await?;
        self.stop(runsc).await;
        Ok(Parked { image: image.to_path_buf(), bytes: super::template::du(image), took: started.elapsed(), pids })
    }

    /// The channel of the handler `pid` once it has reached this (restored) pod again, within
    /// `timeout`.
    pub async fn resumed(&self, pid: i32, timeout: Duration) -> Result<Channel, PlatformError> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let arrived = self.resumed.arrived.notified();
            if let Some(channel) = self.resumed.channels.lock().expect("resumed lock").remove(&pid) {
                return Ok(channel);
            }
            if tokio::time::timeout_at(deadline, arrived).await.is_err() {
                return Err(PlatformError::timed_out("a restored handler", "reach its pod again", timeout));
            }
        }
    }

    /// Forget the handler `pid` if it has reached the pod again (its sandbox went while the
    /// pod was parked).
    pub fn forget_resumed(&self, pid: i32) {
        self.resumed.channels.lock().expect("resumed lock").remove(&pid);
    }

    /// Ask the Zygote for `count` more spares.
    pub async fn fork_spares(&self, settings: &PodSettings, count: usize) -> Result<(), PlatformError> {
        // Counted before asking: a spare can connect, and be taken, before the reply comes.
        self.pending.fetch_add(count, Ordering::Relaxed);
        let order = json!({"op": "spares", "count": count, "uid": settings.cfg.uid, "gid": settings.cfg.gid, "seccomp": settings.seccomp});
        let forked = match self.control(order).await {
            Ok(reply) => serde_json::from_value::<Forked>(reply).doing("reading the pod's fork reply"),
            Err(e) => Err(e),
        };
        let made = forked.as_ref().map(|f| f.pids.len()).unwrap_or(0);
        self.uncount(count.saturating_sub(made));
        match forked {
            Ok(Forked { error: Some(error), .. }) => {
                Err(PlatformError::Engine { engine: "gvisor", doing: "fork spares".into(), message: error })
            }
            Ok(_) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// `n` fewer spares on their way (never below none).
    fn uncount(&self, n: usize) {
        let _ = self.pending.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |p| Some(p.saturating_sub(n)));
    }

    /// The next spare to connect, within `timeout`, for a cold start (one is forked now when
    /// none is on its way: the pod's were let go); replacements are asked for by the caller.
    /// Returns it with the count of cold starts, its own included.
    pub async fn take_spare(&self, settings: &PodSettings, timeout: Duration) -> Result<(Spare, u64), PlatformError> {
        let mut spares = self.spares.lock().await;
        let cold_starts = self.cold_starts.fetch_add(1, Ordering::Relaxed) + 1;
        if self.pending() == 0 {
            self.fork_spares(settings, 1).await?;
        }
        match tokio::time::timeout(timeout, spares.recv()).await {
            Ok(Some(spare)) => {
                self.uncount(1);
                Ok((spare, cold_starts))
            }
            Ok(None) => Err(PlatformError::Engine { engine: "gvisor", doing: "take a spare".into(), message: "the pod stopped".into() }),
            Err(_) => Err(PlatformError::timed_out("a pod's spare", "connect", timeout)),
        }
    }

    /// Let the spares that have connected go, if there has been no cold start since the
    /// `cold_starts`th: each holds a handler's pages (prefaulted, copied from the Zygote's)
    /// while its lambda may have no cold start for hours. A spare whose channel closes exits.
    /// Returns how many went.
    pub async fn let_spares_go(&self, cold_starts: u64) -> usize {
        // Checked before the lock too: a busy pod's timers end here without queueing behind a
        // cold start waiting for its spare.
        if self.cold_starts.load(Ordering::Relaxed) != cold_starts {
            return 0;
        }
        let mut spares = self.spares.lock().await;
        if self.cold_starts.load(Ordering::Relaxed) != cold_starts {
            return 0;
        }
        let mut gone = 0;
        while let Ok(spare) = spares.try_recv() {
            drop(spare);
            gone += 1;
        }
        self.uncount(gone);
        gone
    }

    /// Spares asked for and not yet bound.
    pub fn pending(&self) -> usize {
        self.pending.load(Ordering::Relaxed)
    }

    /// How the handler `pid` ended: an exit code, a negated signal, or None while it runs.
    pub async fn status(&self, pid: i32) -> Option<i32> {
        let reply = self.control(json!({"op": "status", "pids": [pid]})).await.ok()?;
        reply["status"][pid.to_string()].as_i64().map(|s| s as i32)
    }

    /// SIGKILL one handler.
    pub async fn kill(&self, pid: i32) {
        if let Err(e) = self.control(json!({"op": "kill", "pid": pid})).await {
            tracing::debug!(pod = self.id, pid, "killing a pod's handler: {e}");
        }
    }

    /// A new FIFO for a handler's output: its path on the host and inside the pod.
    pub fn output_fifo(&self) -> (PathBuf, String) {
        let n = self.next_fifo.fetch_add(1, Ordering::Relaxed);
        let name = format!("out-{n}.fifo");
        (self.scratch.join(&name), format!("/host/{name}"))
    }

    /// One control frame and its reply.
    async fn control(&self, order: Value) -> Result<Value, PlatformError> {
        let mut control = self.control.lock().await;
        let exchange = async {
            control.send(&order, &[]).await?;
            control.recv::<Value>().await.map(|(reply, _)| reply)
        };
        match tokio::time::timeout(Duration::from_secs(10), exchange).await {
            Ok(reply) => reply.doing("talking to the pod's Zygote"),
            Err(_) => Err(PlatformError::timed_out("the pod's Zygote", "answer", Duration::from_secs(10))),
        }
    }

    /// Stop the pod: its container, bundle and cgroup go (its lambda's namespace gets its
    /// address back when the next pod starts in it).
    pub async fn stop(&self, runsc: &Runsc) {
        self.accepting.abort();
        // The link first: once the container is gone from runsc's list a new pod of the lambda
        // may start, and it needs the link in the lambda's namespace.
        self.return_link();
        runsc.delete(&self.container).await;
        remove_bundle(&self.bundle).await;
    }

    /// Give the lambda's link back to its namespace, if it is lent to this pod (which has no
    /// network from then on): when the pod stops, or when another pod of the lambda (new code)
    /// is to start, which needs it.
    pub fn return_link(&self) {
        let lent = self.lent.lock().expect("lent lock").take();
        if let (Some(netns), Some(network)) = (lent, &self.network) {
            if let Err(e) = network.take_link_back(netns.as_raw_fd()) {
                tracing::warn!(pod = self.id, "taking a lambda's link back from its pod: {e}");
            }
        }
    }
}

/// Accept the pod's spares as they connect, and its handlers reaching it after a restore;
/// each says which process it is first.
async fn accept_helpers(endpoint: Endpoint, spares: mpsc::Sender<Spare>, resumed: Arc<Resumed>, max_body: u32) {
    loop {
        let (mut channel, _) = match endpoint.accept_next(Duration::from_secs(24 * 3600), max_body).await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of descriptors, say: wait rather than spin; the pod's takers time out.
                tracing::warn!("accepting a pod's spare: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let said = tokio::time::timeout(Duration::from_secs(10), channel.recv::<Value>()).await;
        let Ok(Ok((hello, _))) = said else { continue };
        let pid = hello["pid"].as_i64().unwrap_or(0) as i32;
        if hello["op"] == "resumed" {
            resumed.add(pid, channel);
            continue;
        }
        if hello["op"] != "spare" {
            tracing::warn!("a pod's helper connected saying {hello}, not as a spare");
            continue;
        }
        if spares.send(Spare { channel, pid }).await.is_err() {
            return;
        }
    }
}

/// What a restore hands over: the Zygote's control channel and hello, the pod's output, and
/// handlers that reached the pod before the Zygote did.
type Restored = (Channel, Value, OutputPipe, Vec<(i32, Channel)>);

/// Restore `image` into the created container of `bundle`, and wait for the restored Zygote's
/// hello (a parked pod's handlers may connect first, saying they resumed).
async fn restored(
    runsc: &Runsc,
    settings: &PodSettings,
    bundle: &Bundle,
    image: &Path,
    networked: bool,
    sink: Arc<dyn OutputSink>,
) -> Result<Restored, PlatformError> {
    let (output, log) = OutputPipe::new(0, sink).doing("making the pod's log pipe")?;
    runsc.restore(&bundle.container, &bundle.dir, image, networked, log).await?;
    runsc.join_worker_cpuset(&bundle.cgroup);
    let timeout = settings.cfg.start_timeout;
    let deadline = tokio::time::Instant::now() + timeout;
    let mut early = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let (mut control, _) = bundle.endpoint.accept_next(left, settings.cfg.max_response).await?;
        match tokio::time::timeout_at(deadline, control.recv::<Value>()).await {
            Ok(Ok((hello, _))) if hello["role"] == "pod" && hello["restored"] == true => return Ok((control, hello, output, early)),
            Ok(Ok((hello, _))) if hello["op"] == "resumed" => early.push((hello["pid"].as_i64().unwrap_or(0) as i32, control)),
            Ok(Ok((hello, _))) => {
                return Err(PlatformError::Protocol { process: "the restored pod's Zygote".into(), said: hello.to_string() })
            }
            Ok(Err(e)) => return Err(e).doing("the restored pod's Zygote died before its hello"),
            Err(_) => return Err(PlatformError::timed_out("the restored pod's Zygote", "say hello", timeout)),
        }
    }
}

/// Bind the lambda's `code` onto a created container's /handler and lend the lambda's link to
/// its namespace `netns`.
async fn lend(netns: &OwnedFd, code: &std::path::Path, bundle: &Bundle, network: Option<&Arc<LambdaNetwork>>) -> Result<(), PlatformError> {
    let handler = super::ahead::handler_dir(bundle);
    crate::mounts::bind(code, &handler, false).at("binding the lambda's code onto", &handler)?;
    if let Some(network) = network {
        let (network, to) = (network.clone(), netns.as_raw_fd());
        let lent = tokio::task::spawn_blocking(move || network.lend_link(to)).await.map_err(std::io::Error::other).and_then(|r| r);
        lent.doing("lending the lambda's link to its pod's namespace")?;
    }
    Ok(())
}

/// Stop a pod's container and remove its bundle; the lambda's link, if lent to the pod's
/// namespace, is taken back first.
async fn stop(runsc: &Runsc, container: &str, bundle: &std::path::Path, lent: Option<&OwnedFd>, network: Option<&LambdaNetwork>) {
    if let (Some(netns), Some(network)) = (lent, network) {
        if let Err(e) = network.take_link_back(netns.as_raw_fd()) {
            tracing::warn!(container, "taking a lambda's link back from its pod: {e}");
        }
    }
    runsc.delete(container).await;
    remove_bundle(bundle).await;
}
