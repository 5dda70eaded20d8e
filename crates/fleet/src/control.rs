//! `sprout fleet up | down | status | deploy`: start N workers, each in its own network
//! namespace pinned to its CPUs with its own memory budget and sharing one API token, then
//! HAProxy in front of them; stop it all; say how each part is; deploy a lambda to every
//! worker. What is running is recorded in `DIR/fleet.json`, so `down` finds it again.

use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::haproxy::{self, Listen, Policy};
use crate::netns;
use crate::plan::{Member, Plan, API_PORT};
use crate::postgres::Cluster;
use crate::worker_config::{self, Service};

const STATE: &str = "fleet.json";
const TOKEN: &str = "api-token";
/// The password of the fleet's PostgreSQL superuser (its registry's connection), 0600.
const PG_PASSWORD: &str = "pg-password";

/// What `up` is asked for.
#[derive(Debug, Clone)]
pub struct UpOptions {
    pub workers: usize,
    pub cpus: Vec<usize>,
    pub memory_mb: u64,
    pub policy: Policy,
    pub api: SocketAddr,
    pub app: Option<SocketAddr>,
    /// TOML every worker's config.toml starts from (the operator's settings; the fleet's own
    /// are merged in: [`crate::worker_config`]).
    pub extra_config: String,
    /// Services on this host (or elsewhere) every worker's sandboxes may reach by name.
    pub services: Vec<Service>,
    /// The fleet's PostgreSQL's port (None: a free one), so a `--service` can name it.
    pub pg_port: Option<u16>,
}

/// A running fleet, as `DIR/fleet.json` records it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct State {
    pub plan: Plan,
    pub members: Vec<Member>,
    pub policy: Policy,
    pub api: SocketAddr,
    pub app: Option<SocketAddr>,
    /// The port of the fleet's PostgreSQL (the shared registry).
    pub pg_port: u16,
    /// What members added later get: CPUs dealt in turn, memory, extra configuration.
    pub cpus: Vec<usize>,
    pub memory_mb: u64,
    pub extra_config: String,
    #[serde(default)]
    pub services: Vec<Service>,
}

impl State {
    pub fn load(dir: &Path) -> Result<Option<State>> {
        match fs::read(dir.join(STATE)) {
            Ok(bytes) => Ok(Some(serde_json::from_slice(&bytes).with_context(|| format!("reading {}", dir.join(STATE).display()))?)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    pub(crate) fn save(&self, dir: &Path) -> Result<()> {
        let tmp = dir.join(format!("{STATE}.tmp"));
        fs::write(&tmp, serde_json::to_vec_pretty(self)?)?;
        fs::rename(tmp, dir.join(STATE))?;
        Ok(())
    }

    fn listen(&self, dir: &Path) -> Listen {
        Listen { api: self.api, app: self.app, admin_socket: dir.join("haproxy.sock"), routes_map: dir.join("routes.map") }
    }
}

/// The fleet's PostgreSQL superuser's password.
fn pg_password(dir: &Path) -> Result<String> {
    Ok(fs::read_to_string(dir.join(PG_PASSWORD)).context("reading the fleet's PostgreSQL password")?.trim().to_string())
}

fn random_hex(bytes: usize) -> Result<String> {
    let mut buf = vec![0u8; bytes];
    use std::io::Read;
    fs::File::open("/dev/urandom")?.read_exact(&mut buf)?;
    Ok(hex::encode(buf))
}

/// The `sprout` binary workers are started with.
fn sprout() -> Result<PathBuf> {
    std::env::current_exe().context("finding the sprout binary")
}

fn run(command: &mut Command, what: &str) -> Result<String> {
    let out = command.output().with_context(|| format!("{what}: starting {command:?}"))?;
    if !out.status.success() {
        bail!(
            "{what} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim(),
            String::from_utf8_lossy(&out.stdout).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).to_string())
}

/// A member's worker directory.
pub fn worker_dir(dir: &Path, m: &Member) -> PathBuf {
    dir.join(&m.name)
}

/// Start the fleet in `dir`.
pub fn up(dir: &Path, opts: &UpOptions, progress: &mut dyn FnMut(&str)) -> Result<State> {
    if opts.workers == 0 {
        bail!("a fleet needs at least one worker");
    }
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let dir = dir.canonicalize()?;
    if let Some(state) = State::load(&dir)? {
        bail!("a fleet of {} workers is already up in {} (`sprout fleet down` it first)", state.members.len(), dir.display());
    }
    worker_config::check_extra(&opts.extra_config)?;
    if Command::new("haproxy").arg("-v").output().is_err() {
        bail!("haproxy is not installed (apt-get install haproxy, or run scripts/setup.sh)");
    }
    let plan = Plan::for_dir(&dir);
    let members = plan.members(opts.workers, &opts.cpus, opts.memory_mb)?;
    let pg_port = match opts.pg_port {
        Some(port) => port,
        None => std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port(),
    };
    let state = State {
        plan: plan.clone(),
        members: members.clone(),
        policy: opts.policy,
        api: opts.api,
        app: opts.app,
        pg_port,
        cpus: opts.cpus.clone(),
        memory_mb: opts.memory_mb,
        extra_config: opts.extra_config.clone(),
        services: opts.services.clone(),
    };
    // Recorded before anything starts, so `down` can undo a start-up that fails half-way.
    state.save(&dir)?;
    let started = start_all(&dir, &state, progress);
    if let Err(e) = started {
        progress("start-up failed; stopping what was started");
        let _ = down(&dir, progress);
        return Err(e);
    }
    Ok(state)
}

fn start_all(dir: &Path, state: &State, progress: &mut dyn FnMut(&str)) -> Result<()> {
    let token_path = dir.join(TOKEN);
    if !token_path.exists() {
        run(Command::new(sprout()?).args(["worker", "init"]).arg(dir.join(".token")), "making the fleet's API token")?;
        fs::rename(dir.join(".token").join(TOKEN), &token_path)?;
        let _ = fs::remove_dir_all(dir.join(".token"));
    }
    let password_path = dir.join(PG_PASSWORD);
    if !password_path.exists() {
        fs::write(&password_path, random_hex(16)?)?;
        fs::set_permissions(&password_path, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    }
    netns::create_services(&state.plan.services_label(), state.plan.services_addr())?;
    let cluster = Cluster::for_tag(&state.plan.tag, state.pg_port);
    progress(&format!("starting the fleet's PostgreSQL (the shared registry) at {}:{}", state.plan.services_addr(), state.pg_port));
    cluster.start(state.plan.subnet, state.plan.services_addr(), &pg_password(dir)?)?;
    for m in &state.members {
        start_member(dir, state, m, progress)?;
    }
    write_haproxy(dir, state)?;
    let cfg = dir.join("haproxy.cfg");
    run(Command::new("haproxy").arg("-c").arg("-f").arg(&cfg), "checking haproxy.cfg")?;
    run(Command::new("haproxy").args(["-W", "-D", "-f"]).arg(&cfg).arg("-p").arg(dir.join("haproxy.pid")), "starting haproxy")?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !all_up(state) {
        if Instant::now() > deadline {
            bail!("HAProxy did not see every worker up within 30 s: {}", serde_json::to_string(&status(dir)?)?);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    progress(&format!(
        "fleet up: {} workers behind HAProxy at http://{} ({} routing)",
        state.members.len(),
        state.api,
        state.policy.name()
    ));
    Ok(())
}

/// Make a member's namespace and start its worker there (ready when this returns).
pub(crate) fn start_member(dir: &Path, state: &State, m: &Member, progress: &mut dyn FnMut(&str)) -> Result<()> {
    let cluster = Cluster::for_tag(&state.plan.tag, state.pg_port);
    let wdir = worker_dir(dir, m);
    fs::create_dir_all(&wdir)?;
    let registry = cluster.url(state.plan.services_addr(), &pg_password(dir)?);
    let listen = state.listen(dir);
    let fleetwide = worker_config::Fleetwide {
        registry: &registry,
        app: state.app.is_some(),
        routes: (state.policy == Policy::PackageAware).then_some((listen.admin_socket.as_path(), listen.routes_map.as_path())),
        services: &state.services,
    };
    let config = worker_config::render(&state.plan, m, &fleetwide, &state.extra_config)?;
    // It holds the registry's password: the owner's alone.
    fs::write(wdir.join("config.toml"), config)?;
    fs::set_permissions(wdir.join("config.toml"), std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    fs::copy(dir.join(TOKEN), wdir.join(TOKEN))?;
    netns::create(m)?;
    run(Command::new(sprout()?).args(["worker", "init"]).arg(&wdir), "worker init")?;
    progress(&format!("starting worker {} at {} in namespace {} on CPU {}", m.name, m.addr, m.netns, m.cpus));
    run(
        // nsenter enters only the network namespace: `ip netns exec` would also give the
        // worker a mount namespace with a fresh /sys, hiding the cgroup hierarchies.
        Command::new("nsenter")
            .arg(format!("--net=/run/netns/{}", m.netns))
            .args(["taskset", "-c", &m.cpus])
            .arg(sprout()?)
            .args(["worker", "up"])
            .arg(&wdir)
            .arg("--detach"),
        &format!("starting worker {}", m.name),
    )?;
    Ok(())
}

/// Stop a member's worker, clean up after it, and remove its namespace.
pub(crate) fn stop_member(dir: &Path, m: &Member, progress: &mut dyn FnMut(&str)) -> Result<()> {
    let wdir = worker_dir(dir, m);
    let mut result = Ok(());
    if wdir.join("config.toml").exists() {
        progress(&format!("stopping worker {}", m.name));
        // A worker that died (killed, crashed) leaves its sandboxes' mounts and cgroups:
        // cleanup removes them, and does nothing after a clean stop.
        result = run(Command::new(sprout()?).args(["worker", "down"]).arg(&wdir), "worker down")
            .and_then(|_| run(Command::new(sprout()?).args(["worker", "cleanup"]).arg(&wdir), "worker cleanup"))
            .map(|_| ());
    }
    netns::remove(m);
    result
}

/// Rewrite HAProxy's configuration for the members now in `state`, check it, and have
/// HAProxy's master load it (its old process finishes the requests under way).
pub(crate) fn reload_haproxy(dir: &Path, state: &State) -> Result<()> {
    if state.policy == Policy::PackageAware {
        // The workers keep the routes in the running HAProxy: the new one reads them from the file.
        let lines: String = routes(dir)?.iter().map(|(lambda, key)| format!("{lambda} {key}\n")).collect();
        fs::write(dir.join("routes.map"), lines)?;
    }
    write_haproxy(dir, state)?;
    run(Command::new("haproxy").arg("-c").arg("-f").arg(dir.join("haproxy.cfg")), "checking haproxy.cfg")?;
    let Some(pid) = haproxy_pid(dir) else { bail!("HAProxy is not running in {}", dir.display()) };
    // SAFETY: kill takes two integers and touches no memory of ours; `pid` is HAProxy's
    // master, read from its pid file, positive.
    if pid <= 0 || unsafe { libc::kill(pid, libc::SIGUSR2) } != 0 {
        bail!("could not signal HAProxy's master (pid {pid}) to reload");
    }
    Ok(())
}

fn write_haproxy(dir: &Path, state: &State) -> Result<()> {
    let listen = state.listen(dir);
    if !listen.routes_map.exists() {
        fs::write(&listen.routes_map, "")?;
    }
    fs::write(dir.join("haproxy.cfg"), haproxy::config(&state.members, state.policy, &listen))?;
    Ok(())
}

/// Whether every worker answers `GET /status` through HAProxy's health checks.
fn all_up(state: &State) -> bool {
    state.members.iter().all(worker_ready)
}

pub(crate) fn worker_ready(m: &Member) -> bool {
    let agent = ureq::AgentBuilder::new().timeout(Duration::from_millis(500)).build();
    agent
        .get(&format!("http://{}:{API_PORT}/status", m.addr))
        .call()
        .ok()
        .and_then(|r| r.into_string().ok())
        .is_some_and(|s| s == "ready\n")
}

/// HAProxy's master process, when it runs.
pub(crate) fn haproxy_pid(dir: &Path) -> Option<i32> {
    let pid: i32 = fs::read_to_string(dir.join("haproxy.pid")).ok()?.lines().next()?.trim().parse().ok()?;
    Path::new(&format!("/proc/{pid}")).exists().then_some(pid)
}

/// Stop everything of the fleet in `dir`; false when nothing was recorded there.
pub fn down(dir: &Path, progress: &mut dyn FnMut(&str)) -> Result<bool> {
    let Some(state) = State::load(dir)? else { return Ok(false) };
    if let Some(pid) = haproxy_pid(dir) {
        progress("stopping haproxy");
        if pid > 0 {
            // SAFETY: kill takes two integers and touches no memory of ours; `pid` is HAProxy's
            // master, read from its pid file, positive (never 0 or a process group).
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let mut failures = Vec::new();
    for m in &state.members {
        if let Err(e) = stop_member(dir, m, progress) {
            failures.push(format!("{}: {e:#}", m.name));
        }
    }
    progress("stopping the fleet's PostgreSQL");
    Cluster::for_tag(&state.plan.tag, state.pg_port).remove();
    netns::remove_services(&state.plan.services_label(), state.plan.services_addr());
    let _ = fs::remove_file(dir.join("haproxy.pid"));
    fs::remove_file(dir.join(STATE))?;
    if !failures.is_empty() {
        bail!("stopped the fleet, but: {}", failures.join("; "));
    }
    Ok(true)
}

/// How each part of the fleet is: HAProxy, and each worker's status and its HAProxy state.
pub fn status(dir: &Path) -> Result<Value> {
    let Some(state) = State::load(dir)? else { bail!("no fleet is up in {}", dir.display()) };
    // HAProxy's own view of each worker (UP, DOWN, DRAIN, MAINT), from its lambda backend.
    let seen = crate::runtime::servers(&dir.join("haproxy.sock")).unwrap_or_default();
    let haproxy_state = |name: &str| seen.iter().find(|s| s.backend == haproxy::LAMBDAS && s.server == name).map(|s| s.status.clone());
    let workers: Vec<Value> = state
        .members
        .iter()
        .map(|m| {
            json!({"name": m.name, "address": m.addr.to_string(), "netns": m.netns, "cpus": m.cpus, "memory_mb": m.memory_mb,
                   "ready": worker_ready(m), "haproxy": haproxy_state(&m.name)})
        })
        .collect();
    Ok(json!({
        "api": format!("http://{}", state.api),
        "app": state.app.map(|a| format!("http://{a}")),
        "policy": state.policy.name(),
        "haproxy": haproxy_pid(dir).is_some(),
        "workers": workers,
        "services_address": state.plan.services_addr().to_string(),
        "postgres": {"address": format!("{}:{}", state.plan.services_addr(), state.pg_port),
                     "socket_dir": Cluster::for_tag(&state.plan.tag, state.pg_port).data, "user": "postgres",
                     "password_file": dir.join(PG_PASSWORD)},
        "routes": (state.policy == Policy::PackageAware).then(|| routes(dir).ok()).flatten(),
        "services": state.services.iter().map(|s| json!({"name": s.name, "address": s.endpoint(&state.plan).to_string(), "lambdas": s.lambdas})).collect::<Vec<_>>(),
    }))
}

/// Deploy a lambda directory through the fleet's entry point (one worker stores it in the
/// shared registry), then wait until every worker has this version; returns how long that took.
pub fn deploy(dir: &Path, lambda_dir: &Path, name: Option<&str>) -> Result<Duration> {
    let Some(state) = State::load(dir)? else { bail!("no fleet is up in {}", dir.display()) };
    let token = fs::read_to_string(dir.join(TOKEN))?.trim().to_string();
    let mut cmd = Command::new(sprout()?);
    cmd.arg("deploy").arg(lambda_dir).args(["--url", &format!("http://{}", state.api), "--token", &token]);
    if let Some(name) = name {
        cmd.args(["--name", name]);
    }
    let started = Instant::now();
    let said = run(&mut cmd, "deploying through the fleet")?;
    let uploaded: Value = serde_json::from_str(said.trim()).with_context(|| format!("reading what deploy said: {said}"))?;
    let (name, sha) = (uploaded["name"].as_str().unwrap_or_default(), uploaded["sha256"].as_str().unwrap_or_default());
    let deadline = started + SPREAD_BOUND;
    for m in &state.members {
        while lambda_sha(m, name, &token).as_deref() != Some(sha) {
            if Instant::now() > deadline {
                bail!("worker {} did not have {name} (sha256 {sha}) within {SPREAD_BOUND:?} of its upload", m.name);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let took = started.elapsed();
    // The worker that took the upload routes it once its packages are installed
    // (crates/worker/src/fleet_routes.rs): wait for that, so requests from now on find it.
    if state.policy == Policy::PackageAware && uploaded["requirements"].as_array().is_some_and(|r| !r.is_empty()) {
        let deadline = Instant::now() + ROUTE_BOUND;
        while !routes(dir)?.contains_key(name) {
            if Instant::now() > deadline {
                bail!("{name} has no package-aware route {ROUTE_BOUND:?} after its upload (see the workers' logs)");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    Ok(took)
}

/// The package-aware routes the running HAProxy holds: lambda -> key.
pub fn routes(dir: &Path) -> Result<std::collections::BTreeMap<String, String>> {
    let answer = crate::runtime::command(&dir.join("haproxy.sock"), &format!("show map {}", dir.join("routes.map").display()))?;
    // Each entry's line: its id (0x...), the key, the value; anything else is an error.
    if !answer.trim().is_empty() && !answer.starts_with("0x") {
        bail!("HAProxy did not list the routes: {}", answer.trim());
    }
    let entries = answer.lines().filter_map(|l| l.split_once(' ').and_then(|(_, rest)| rest.split_once(' ')));
    Ok(entries.map(|(k, v)| (k.to_string(), v.trim().to_string())).collect())
}

/// How long `deploy` waits for a package-aware route: the lambda's packages are installed
/// first (pip, when the install cache does not have them).
const ROUTE_BOUND: Duration = Duration::from_secs(120);

/// How long a change made through one worker may take to reach every other: the workers'
/// poll interval (1 s) is the bound when a notification is lost, plus unpacking.
pub const SPREAD_BOUND: Duration = Duration::from_secs(5);

/// The sha256 of the version of `name` a worker has.
fn lambda_sha(m: &Member, name: &str, token: &str) -> Option<String> {
    let agent = ureq::AgentBuilder::new().timeout(Duration::from_secs(2)).build();
    let reply =
        agent.get(&format!("http://{}:{API_PORT}/registry/{name}", m.addr)).set("Authorization", &format!("Bearer {token}")).call().ok()?;
    let body: Value = serde_json::from_str(&reply.into_string().ok()?).ok()?;
    body["sha256"].as_str().map(str::to_string)
}
