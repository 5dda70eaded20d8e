//! Workers joining and leaving a running fleet: `add` starts a new member and has HAProxy
//! route to it once its health checks pass; `drain` stops new requests reaching a member,
//! waits for the ones under way to finish, then stops it and removes it from HAProxy.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use crate::control::{self, State};
use crate::haproxy;
use crate::plan::Member;
use crate::runtime;

/// HAProxy's backends a member serves in.
fn backends(state: &State) -> Vec<&'static str> {
    let mut b = vec![haproxy::LAMBDAS, haproxy::WORKERS];
    if state.app.is_some() {
        b.push(haproxy::SITES);
    }
    b
}

/// Start one more worker and route to it; returns it once HAProxy sees it up.
pub fn add(dir: &Path, progress: &mut dyn FnMut(&str)) -> Result<Member> {
    let dir = dir.canonicalize()?;
    let Some(mut state) = State::load(&dir)? else { bail!("no fleet is up in {}", dir.display()) };
    let index = state.members.iter().filter_map(|m| m.name.trim_start_matches('w').parse::<usize>().ok()).max().unwrap_or(0) + 1;
    let cpus = state.cpus.get((index - 1) % state.cpus.len().max(1)).copied().unwrap_or(0);
    let member = state.plan.member(index, &cpus.to_string(), state.memory_mb)?;
    if let Err(e) = control::start_member(&dir, &state, &member, progress) {
        let _ = control::stop_member(&dir, &member, progress);
        return Err(e);
    }
    state.members.push(member.clone());
    state.save(&dir)?;
    control::reload_haproxy(&dir, &state)?;
    wait_for(&dir, &state, &member.name, Duration::from_secs(30), |s| s.status.starts_with("UP") && !s.status.contains("going down"))?;
    progress(&format!("worker {} takes requests", member.name));
    Ok(member)
}

/// Take `name` out: no new requests, the ones under way finish (up to `grace`), then its
/// worker stops and HAProxy forgets it.
pub fn drain(dir: &Path, name: &str, grace: Duration, progress: &mut dyn FnMut(&str)) -> Result<()> {
    let dir = dir.canonicalize()?;
    let Some(mut state) = State::load(&dir)? else { bail!("no fleet is up in {}", dir.display()) };
    let Some(member) = state.members.iter().find(|m| m.name == name).cloned() else {
        bail!("the fleet has no worker {name:?} (it has {})", state.members.iter().map(|m| m.name.as_str()).collect::<Vec<_>>().join(", "));
    };
    if state.members.len() == 1 {
        bail!("{name} is the fleet's last worker; `sprout fleet down` stops the fleet");
    }
    let socket = dir.join("haproxy.sock");
    for backend in backends(&state) {
        runtime::command(&socket, &format!("set server {backend}/{name} state drain"))?;
    }
    progress(&format!("draining {name}: no new requests; waiting for those under way"));
    let idle = wait_for(&dir, &state, name, grace, |s| s.sessions == 0);
    if idle.is_err() {
        progress(&format!("{name} still had requests under way after {grace:?}; stopping it anyway"));
    }
    for backend in backends(&state) {
        runtime::command(&socket, &format!("set server {backend}/{name} state maint"))?;
    }
    state.members.retain(|m| m.name != name);
    state.save(&dir)?;
    control::reload_haproxy(&dir, &state)?;
    control::stop_member(&dir, &member, progress)?;
    progress(&format!("worker {name} drained and stopped"));
    Ok(())
}

/// Wait until every backend's line for server `name` satisfies `done`.
fn wait_for(dir: &Path, state: &State, name: &str, within: Duration, done: impl Fn(&runtime::ServerStat) -> bool) -> Result<()> {
    let socket = dir.join("haproxy.sock");
    let deadline = Instant::now() + within;
    loop {
        let stats = runtime::servers(&socket).unwrap_or_default();
        let lines: Vec<_> = stats.iter().filter(|s| s.server == name && backends(state).contains(&s.backend.as_str())).collect();
        if lines.len() == backends(state).len() && lines.iter().all(|s| done(s)) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("HAProxy's view of {name} did not settle within {within:?}: {lines:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
