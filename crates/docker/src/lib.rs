//! The `docker` baseline back-end: every sandbox is a container of the Docker engine, the way
//! most serverless platforms of SOCK's time ran handlers, so the benchmarks can measure what an
//! engine between the worker and runc costs on top of a general-purpose container. A crate of
//! its own because it speaks HTTP (the Engine API): the worker hands it to the engine, which
//! stays free of HTTP types.
//!
//! The worker talks to the Engine API over its Unix socket (HTTP/1.1 with hyper, one
//! connection per call). [`DockerBackend::prepare`] imports the base root file system as an
//! image once; each sandbox is then a container of that image with the helper, the packages
//! and the lambda's code bound in read-only, the worker's volumes bound as configured, and a
//! scratch directory bound at /host where the worker listens before the container starts —
//! the same files and the same helper as a lean sandbox (sprout-sandbox's [`Session`]), behind
//! the engine's create/start/delete round trips, image layers and per-container cgroups.
//! Containers carry a `sprout.worker` label, so [`DockerBackend::remove_leftovers`] finds what
//! an earlier worker left behind.

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Frame;
use hyper::{Method, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use sprout_sandbox::backend::{Backend, Counters, Sandbox};
use sprout_sandbox::cgroup::{view_of, Layout, Version};
use sprout_sandbox::channel::{Endpoint, Reply, Request};
use sprout_sandbox::error::{Doing, PlatformError};
use sprout_sandbox::scratch::{make_scratch, remove_dir};
use sprout_sandbox::session::{handler_kind, Calls, Session};
use sprout_sandbox::session_methods;
use sprout_sandbox::spec::{sandbox_env_strings, BackendStats, CreateError, InvokeError, SandboxSpec};
use sprout_sandbox::stage::{Stage, HELPER_IN_SANDBOX};

/// The Engine API version spoken (Docker 20.10 and later).
const API: &str = "/v1.41";

/// Size of the pieces the base image's tar stream is sent in.
const CHUNK: usize = 256 * 1024;

/// Settings of the Docker backend.
#[derive(Debug, Clone)]
pub struct DockerConfig {
    /// The engine's socket, usually /var/run/docker.sock.
    pub socket: PathBuf,
    /// The image sandboxes run, e.g. "sprout-base:bookworm"; imported from `base_image`.
    pub image: String,
    /// The base root file system directory on disk.
    pub base_image: PathBuf,
    /// Value of the `sprout.worker` label on this worker's containers.
    pub worker_label: String,
    /// The user handlers run as.
    pub uid: u32,
    pub gid: u32,
    /// The interpreter inside the base.
    pub python: String,
    pub start_timeout: Duration,
    /// Largest response body a handler may send, in bytes.
    pub max_response: u32,
    /// Pin containers to these CPUs (cpuset syntax, e.g. "0-3").
    pub cpuset: Option<String>,
}

/// The `docker` back-end.
pub struct DockerBackend {
    docker: Arc<Docker>,
}

/// What the back-end and its sandboxes share: a sandbox removes its container through it.
struct Docker {
    cfg: DockerConfig,
    stage: Arc<Stage>,
    layout: Option<Layout>,
    next_id: AtomicU64,
    counters: Counters,
}

/// One container of the engine and its helper.
struct DockerSandbox {
    session: Session,
    container: String,
    scratch: PathBuf,
    docker: Arc<Docker>,
}

/// A request body fed from a channel: the tar stream of the base image, built on a
/// blocking thread as it is sent.
struct ChannelBody(mpsc::Receiver<io::Result<Bytes>>);

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<io::Result<Frame<Bytes>>>> {
        self.0.poll_recv(cx).map(|chunk| chunk.map(|r| r.map(Frame::data)))
    }
}

/// The writing end of a [`ChannelBody`], for a blocking thread.
struct ChannelWriter {
    tx: mpsc::Sender<io::Result<Bytes>>,
    buf: Vec<u8>,
}

impl Write for ChannelWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= CHUNK {
            self.flush()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        let chunk = Bytes::from(std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK)));
        let gone = |_| io::Error::new(io::ErrorKind::BrokenPipe, "the engine stopped reading");
        if chunk.is_empty() {
            Ok(())
        } else {
            self.tx.blocking_send(Ok(chunk)).map_err(gone)
        }
    }
}

/// Percent-encode a query parameter value.
fn encode(value: &str) -> String {
    let plain = |b: u8| b.is_ascii_alphanumeric() || b"-_.~".contains(&b);
    value.bytes().map(|b| if plain(b) { (b as char).to_string() } else { format!("%{b:02X}") }).collect()
}

/// The engine's message in an error response (`{"message": "..."}`); `doing` is a verb phrase.
fn api_error(doing: &'static str, status: StatusCode, body: &[u8]) -> PlatformError {
    let message = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v["message"].as_str().map(str::to_string))
        .unwrap_or_else(|| String::from_utf8_lossy(body).trim().to_string());
    PlatformError::Engine { engine: "the Docker engine", doing: doing.into(), message: format!("{message} ({status})") }
}

impl DockerBackend {
    pub fn new(cfg: DockerConfig, stage: Arc<Stage>) -> DockerBackend {
        let layout = Layout::detect(Version::Auto, None)
            .map_err(|e| tracing::warn!("no cgroup hierarchy found; docker sandboxes go unwatched: {e}"))
            .ok();
        DockerBackend { docker: Arc::new(Docker { cfg, stage, layout, next_id: AtomicU64::new(1), counters: Counters::default() }) }
    }

    /// Import the base image unless the engine has it already.
    pub async fn prepare(&self) -> Result<(), PlatformError> {
        self.docker.prepare().await
    }

    /// Remove the containers an earlier worker with this label left behind; how many.
    pub async fn remove_leftovers(&self) -> usize {
        self.docker.remove_leftovers().await
    }
}

impl Docker {
    /// One API call on a fresh connection; returns the status and the whole response body.
    async fn call<B>(&self, method: Method, path: &str, content_type: &str, body: B) -> Result<(StatusCode, Bytes), PlatformError>
    where
        B: hyper::body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let failed = |e: &dyn std::fmt::Display| PlatformError::Engine {
            engine: "the Docker engine",
            doing: format!("answer {method} {path}").into(),
            message: e.to_string(),
        };
        let stream = tokio::net::UnixStream::connect(&self.cfg.socket)
            .await
            .at("reaching the Docker engine (start it with `dockerd --iptables=false --bridge=none`) at", &self.cfg.socket)?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(|e| failed(&e))?;
        tokio::spawn(connection);
        let request = hyper::Request::builder()
            .method(method.clone())
            .uri(format!("{API}{path}"))
            .header(hyper::header::HOST, "docker")
            .header(hyper::header::CONTENT_TYPE, content_type)
            .body(body)
            .map_err(|e| failed(&e))?;
        let response = sender.send_request(request).await.map_err(|e| failed(&e))?;
        let status = response.status();
        let body = response.into_body().collect().await.map_err(|e| failed(&e))?.to_bytes();
        Ok((status, body))
    }

    /// An API call with an optional JSON body.
    async fn call_json(&self, method: Method, path: &str, body: Option<Value>) -> Result<(StatusCode, Bytes), PlatformError> {
        let bytes = body.map(|b| Bytes::from(b.to_string())).unwrap_or_default();
        self.call(method, path, "application/json", Full::new(bytes)).await
    }

    /// A JSON API call that must succeed: its decoded body, or the engine's message as error.
    async fn api(&self, method: Method, path: &str, body: Option<Value>, doing: &'static str) -> Result<Value, PlatformError> {
        let (status, body) = self.call_json(method, path, body).await?;
        if !status.is_success() {
            return Err(api_error(doing, status, &body));
        }
        Ok(serde_json::from_slice(&body).unwrap_or(Value::Null))
    }

    /// Check that the engine answers, remove containers an earlier worker left behind, and
    /// import the base image unless the engine already has it.
    pub async fn prepare(&self) -> Result<(), PlatformError> {
        self.api(Method::GET, "/_ping", None, "answer a ping").await?;
        self.remove_leftovers().await;
        let inspect = format!("/images/{}/json", encode(&self.cfg.image));
        match self.call_json(Method::GET, &inspect, None).await? {
            (StatusCode::NOT_FOUND, _) => self.import_image().await?,
            (status, body) if !status.is_success() => return Err(api_error("inspect the image", status, &body)),
            _ => return Ok(()),
        }
        self.api(Method::GET, &inspect, None, "inspect the imported image").await.map(drop)
    }

    /// Import `base_image` as `image`: a tar stream of the directory, written on a blocking
    /// thread and sent as it is made (the base is a few hundred MB).
    async fn import_image(&self) -> Result<(), PlatformError> {
        let started = Instant::now();
        let base = self.cfg.base_image.clone();
        if !base.join("opt/sprout").is_dir() {
            let error = io::Error::new(io::ErrorKind::InvalidInput, "no opt/sprout: not a Sprout base image");
            return Err(PlatformError::Path { doing: "importing the base image".into(), path: base, error });
        }
        tracing::info!(image = %self.cfg.image, base = %base.display(), "importing the base image into Docker");
        let (repo, tag) = match self.cfg.image.rsplit_once(':') {
            Some((repo, tag)) if !tag.contains('/') => (repo, tag),
            _ => (self.cfg.image.as_str(), "latest"),
        };
        let (tx, rx) = mpsc::channel(8);
        let writer = tokio::task::spawn_blocking(move || {
            let mut tar = tar::Builder::new(ChannelWriter { tx: tx.clone(), buf: Vec::with_capacity(CHUNK) });
            tar.follow_symlinks(false);
            let result = tar.append_dir_all("", &base).and_then(|()| tar.into_inner()?.flush());
            if let Err(e) = &result {
                let _ = tx.blocking_send(Err(io::Error::new(e.kind(), e.to_string())));
                // abort the upload
            }
            result
        });
        let path = format!("/images/create?fromSrc=-&repo={}&tag={}", encode(repo), encode(tag));
        let response = self.call(Method::POST, &path, "application/x-tar", ChannelBody(rx)).await;
        // A broken pipe only echoes the engine's own failure, which the response tells better.
        match writer.await.doing("archiving the base image")? {
            Err(e) if e.kind() != io::ErrorKind::BrokenPipe => {
                return Err(PlatformError::Io { doing: "archiving the base image".into(), error: e })
            }
            _ => {}
        }
        let (status, body) = response?;
        if !status.is_success() {
            return Err(api_error("import the base image", status, &body));
        }
        // Progress messages are a stream of JSON objects; a failure is one with "error".
        for message in serde_json::Deserializer::from_slice(&body).into_iter::<Value>().flatten() {
            if let Some(error) = message["error"].as_str() {
                let message = error.to_string();
                return Err(PlatformError::Engine { engine: "the Docker engine", doing: "import the base image".into(), message });
            }
        }
        tracing::info!(image = %self.cfg.image, seconds = started.elapsed().as_secs_f64(), "base image imported");
        Ok(())
    }

    /// Remove every container labelled as this worker's; returns how many were removed.
    async fn remove_leftovers(&self) -> usize {
        let filters = json!({"label": [format!("sprout.worker={}", self.cfg.worker_label)]}).to_string();
        let path = format!("/containers/json?all=1&filters={}", encode(&filters));
        let listed = self.api(Method::GET, &path, None, "list leftover containers").await;
        let containers = listed.map_err(|e| tracing::warn!("{e}")).unwrap_or_default();
        let mut removed = 0;
        for id in containers.as_array().into_iter().flatten().filter_map(|c| c["Id"].as_str()) {
            if self.remove_container(id).await {
                removed += 1;
            }
        }
        if removed > 0 {
            tracing::info!(removed, worker = %self.cfg.worker_label, "removed docker sandboxes left behind");
        }
        removed
    }

    /// Kill and remove a container; false if the engine refused.
    async fn remove_container(&self, id: &str) -> bool {
        let e = match self.call_json(Method::DELETE, &format!("/containers/{id}?force=1&v=1"), None).await {
            Ok((status, _)) if status.is_success() || status == StatusCode::NOT_FOUND => return true,
            Ok((status, body)) => api_error("remove a container", status, &body),
            Err(e) => e,
        };
        tracing::warn!(container = id, "{e}");
        false
    }

    /// Why a started container's helper never spoke: how the container ended, if it did.
    async fn why_silent(&self, container: &str, e: PlatformError) -> PlatformError {
        if let Ok(inspected) = self.api(Method::GET, &format!("/containers/{container}/json"), None, "inspect the container").await {
            let state = &inspected["State"];
            if state["Running"] == false {
                let mut during = format!("during setup with status {}", state["ExitCode"]);
                if let Some(error) = state["Error"].as_str().filter(|e| !e.is_empty()) {
                    during = format!("{during}: {error}");
                }
                return PlatformError::exited("the sandbox's container", during);
            }
        }
        e
    }

    /// The container's create request.
    fn container_config(&self, spec: &SandboxSpec, scratch: &Path) -> Value {
        let limits = &spec.limits;
        let code = self.stage.code_view(&spec.code_dir);
        let host = json!({
            "Binds": [
                format!("{}:/handler:ro", code.display()),
                format!("{}:/host", scratch.display()),
                format!("{}:/opt/sprout:ro", self.stage.runtime.display()),
                format!("{}:/packages:ro", self.stage.packages.display()),
            ],
            // The worker's volumes, as lean sandboxes see them (the engine makes the mount points).
            "Mounts": self.stage.volumes.iter().map(|v| json!({
                "Type": "bind", "Source": v.host, "Target": v.path, "ReadOnly": !v.writable,
                "BindOptions": {"Propagation": "rprivate"},
            })).collect::<Vec<Value>>(),
            "NetworkMode": "none",
            "Memory": limits.memory_bytes,
            "MemorySwap": limits.memory_bytes,
            "PidsLimit": limits.pids,
            "LogConfig": {"Type": "none", "Config": {}},
            "SecurityOpt": ["no-new-privileges"],
            "CapDrop": ["ALL"],
            "ReadonlyRootfs": true,
            // 0 and null mean unlimited and every CPU, as the engine reads them.
            "NanoCpus": (limits.cpus * 1e9) as i64,
            "CpusetCpus": self.cfg.cpuset,
        });
        json!({
            "Image": self.cfg.image,
            "Cmd": [self.cfg.python, "-I", "-S", HELPER_IN_SANDBOX, "handler"],
            "User": format!("{}:{}", self.cfg.uid, self.cfg.gid),
            "Env": sandbox_env_strings(&spec.env),
            "WorkingDir": "/",
            "Hostname": "sandbox",
            "Labels": {"sprout.worker": self.cfg.worker_label},
            "HostConfig": host,
        })
    }

    /// Create and start the container (its id goes into `container` as soon as it exists)
    /// and wait for its helper to connect and load the lambda.
    async fn provision(
        self: &Arc<Self>,
        id: u64,
        spec: &SandboxSpec,
        scratch: &Path,
        container: &mut Option<String>,
    ) -> Result<DockerSandbox, CreateError> {
        let started = Instant::now();
        make_scratch(scratch, self.cfg.uid, self.cfg.gid).at("making the scratch directory", scratch)?;
        let endpoint = Endpoint::listen_in(scratch)?;
        let name = format!("sprout-{}-{id}", self.cfg.worker_label);
        let config = self.container_config(spec, scratch);
        let path = format!("/containers/create?name={}", encode(&name));
        let created = self.api(Method::POST, &path, Some(config), "create the container").await?;
        let full_id = created["Id"].as_str().ok_or_else(|| PlatformError::protocol("the Docker engine", &created))?;
        *container = Some(full_id.to_string());
        self.api(Method::POST, &format!("/containers/{full_id}/start"), None, "start the container").await?;
        let (mut channel, process) = match endpoint.accept(self.cfg.start_timeout, self.cfg.max_response).await {
            Ok(accepted) => accepted,
            Err(e) => return Err(self.why_silent(full_id, e).await.into()),
        };
        let hello = channel.handshake(&spec.env, &spec.paths, self.cfg.start_timeout).await?;
        let kind = handler_kind(hello)?;
        let layout = self.layout.as_ref();
        let cgroup_path =
            view_of(layout, &format!("docker/{full_id}")).or_else(|| view_of(layout, &format!("system.slice/docker-{full_id}.scope")));
        // The container's output goes to Docker's own log (`docker logs`), as a baseline's.
        let session = Session::new(id, kind, started.elapsed(), channel, process, cgroup_path, spec.limits, spec.attachments(), None);
        Ok(DockerSandbox { session, container: full_id.to_string(), scratch: scratch.to_path_buf(), docker: self.clone() })
    }
}

/// How many times a container is made when runc loses the race below.
const RACE_ATTEMPTS: u32 = 3;

/// Whether a container failed to start only because a cgroup hierarchy mounted on the host
/// went away while runc was mounting the host's cgroups into it: runc lists every cgroup mount
/// of the host (a lean worker's own hierarchy under its directory among them) and fails when
/// one is unmounted before it stats it. Nothing about the container is wrong; made again, it
/// starts.
fn lost_a_host_mount_race(e: &CreateError) -> bool {
    let message = e.to_string();
    message.contains(r#"error mounting "cgroup""#) && message.contains("no such file or directory")
}

#[async_trait]
impl Backend for DockerBackend {
    fn name(&self) -> &'static str {
        "docker"
    }

    async fn create(&self, spec: &SandboxSpec) -> Result<Box<dyn Sandbox>, CreateError> {
        let docker = &self.docker;
        let mut attempt = 1;
        loop {
            let id = docker.next_id.fetch_add(1, Ordering::Relaxed);
            let scratch = docker.stage.run.join("docker").join(id.to_string());
            let mut container = None;
            let result = docker.provision(id, spec, &scratch, &mut container).await;
            if result.is_err() {
                if let Some(container) = container {
                    docker.remove_container(&container).await;
                }
                remove_dir(&scratch).await;
            }
            match result {
                Err(e) if attempt < RACE_ATTEMPTS && lost_a_host_mount_race(&e) => {
                    tracing::info!(attempt, "starting a container again: {e}");
                    attempt += 1;
                }
                result => {
                    docker.counters.record(&result);
                    return Ok(Box::new(result?));
                }
            }
        }
    }

    fn stats(&self) -> BackendStats {
        self.docker.counters.stats()
    }

    async fn shutdown(&self) {
        self.docker.remove_leftovers().await;
        remove_dir(&self.docker.stage.run.join("docker")).await;
    }
}

#[async_trait]
impl Sandbox for DockerSandbox {
    session_methods!();

    async fn invoke(
        &mut self,
        request: &Request,
        body: &[u8],
        timeout: Duration,
        calls: &dyn Calls,
    ) -> Result<(Reply, Bytes), InvokeError> {
        self.session.invoke(request, body, timeout, calls).await
    }

    async fn destroy(self: Box<Self>) {
        let DockerSandbox { session, container, scratch, docker } = *self;
        let Session { channel, attached, .. } = session;
        drop(channel);
        docker.remove_container(&container).await;
        remove_dir(&scratch).await;
        docker.counters.destroyed();
        drop(attached); // a per-sandbox package install: only once nothing runs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_vanished_host_cgroup_mount_is_a_race_worth_another_container() {
        let said = |message: &str| {
            let body = serde_json::to_vec(&json!({ "message": message })).unwrap();
            CreateError::Platform(api_error("start the container", StatusCode::BAD_REQUEST, &body))
        };
        let race = said(
            r#"failed to create shim task: OCI runtime create failed: runc create failed: unable to start container process: error during container init: error mounting "cgroup" to rootfs at "/sys/fs/cgroup": stat /tmp/w3/run/cgroup-dynmods: no such file or directory: unknown"#,
        );
        assert!(lost_a_host_mount_race(&race), "{race}");
        assert!(!lost_a_host_mount_race(&said(r#"runc create failed: exec: "python3": executable file not found in $PATH"#)));
        assert!(!lost_a_host_mount_race(&said(r#"error mounting "cgroup" to rootfs at "/sys/fs/cgroup": permission denied"#)));
    }
}
