//! The operator's verbs (`sprout ls`, `show`, `rm`, `logs`, `stats`, `sites`, and [`tenants`]'
//! `tenants` and `keys`): the worker's admin API, rendered for people.

use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read, Write};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;

use crate::client;

mod render;
pub mod tenants;

use render::*;

/// Where the worker is, how to authorize, and how to print: every admin verb's `--url`,
/// `--token` and `--json`.
#[derive(clap::Args, Clone, Debug)]
pub struct Endpoint {
    /// The worker's URL.
    #[arg(long, env = "SPROUT_URL", default_value = "http://127.0.0.1:5000")]
    pub url: String,
    /// The worker's API token (default: $SPROUT_TOKEN, else the one a worker on this
    /// machine leaves in /run/sprout/api/<address> while it runs).
    #[arg(long, env = "SPROUT_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Print the API's JSON as it came (pretty) instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `--static /prefix/=/dir`: the prefix and the directory.
pub fn parse_static(arg: &str) -> Result<(String, String), String> {
    match arg.split_once('=') {
        Some((prefix, dir)) if !prefix.is_empty() && !dir.is_empty() => Ok((prefix.to_string(), dir.to_string())),
        _ => Err(format!("{arg:?} is not /prefix/=/directory")),
    }
}

// ------------------------------------------------------------------ talking to the worker

/// A worker's admin API, with the token to send it.
struct Worker {
    url: String,
    token: Option<String>,
    agent: ureq::Agent,
}

impl Worker {
    fn new(endpoint: &Endpoint, read_timeout: Duration) -> Worker {
        let url = endpoint.url.trim_end_matches('/').to_string();
        let token = client::find_token(&url, endpoint.token.clone());
        let agent = ureq::AgentBuilder::new().timeout_connect(Duration::from_secs(10)).timeout_read(read_timeout).build();
        Worker { url, token, agent }
    }

    fn send(&self, method: &str, path: &str, query: &[(&str, &str)], body: Option<&Value>) -> Result<ureq::Response, Box<ureq::Error>> {
        let mut request = client::authorized(self.agent.request(method, &format!("{}{path}", self.url)), self.token.as_deref());
        for (key, value) in query {
            request = request.query(key, value);
        }
        match body {
            Some(body) => request.send_json(body),
            None => request.call(),
        }
        .map_err(Box::new)
    }

    /// The reply's status and body, or the API's error explained.
    fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Result<(u16, String)> {
        let response = self.send(method, path, &[], body).map_err(|e| client::explain(*e))?;
        Ok((response.status(), read_body(response)?))
    }

    fn get(&self, path: &str) -> Result<String> {
        Ok(self.call("GET", path, None)?.1)
    }
}

fn read_body(response: ureq::Response) -> Result<String> {
    let mut text = String::new();
    response.into_reader().take(1 << 30).read_to_string(&mut text).map_err(|e| anyhow!("reading the worker's reply: {e}"))?;
    Ok(text)
}

fn parse(text: &str) -> Result<Value> {
    serde_json::from_str(text).with_context(|| format!("the worker's reply is not JSON: {}", text.chars().take(200).collect::<String>()))
}

/// A path segment, percent-encoded (a name or host with characters a URL path would change).
fn segment(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// Write to stdout; a reader that went away (`sprout logs x | head`) ends the command quietly.
fn emit(text: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
        result => Ok(result?),
    }
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

const TIMEOUT: Duration = Duration::from_secs(60);

// ------------------------------------------------------------------ the verbs

/// `/stats`, or nothing when the key may not read it (a tenant's: the worker's figures are the
/// operator's), so `ls` and `show` list a tenant's lambdas without their figures.
fn stats_if_allowed(worker: &Worker) -> Result<Value> {
    match worker.send("GET", "/stats", &[], None) {
        Ok(response) => parse(&read_body(response)?),
        Err(e) if matches!(*e, ureq::Error::Status(403, _)) => Ok(Value::Object(Default::default())),
        Err(e) => Err(client::explain(*e)),
    }
}

/// `sprout ls`: every lambda with its version, upload time, sandboxes and invocations.
pub fn ls(endpoint: &Endpoint) -> Result<()> {
    let worker = Worker::new(endpoint, TIMEOUT);
    let names: Vec<String> = serde_json::from_value(parse(&worker.get("/registry")?)?).context("GET /registry is not a list of names")?;
    let stats = with_invocations(stats_if_allowed(&worker)?);
    let mut lambdas = Vec::new();
    for name in names {
        match worker.send("GET", &format!("/registry/{}", segment(&name)), &[], None) {
            Ok(response) => lambdas.push((name, read_body(response)?)),
            Err(e) if matches!(*e, ureq::Error::Status(404, _)) => continue, // deleted since the list
            Err(e) => return Err(client::explain(*e)),
        }
    }
    lambdas.sort_by(|a, b| a.0.cmp(&b.0));
    if endpoint.json {
        let items: Vec<String> = lambdas.iter().map(|(name, raw)| combined(raw, figures_of(&stats, name))).collect();
        return emit(&format!("{}\n", pretty(&format!("[{}]", items.join(",")))));
    }
    let rows: Result<Vec<(Value, Option<&Value>)>> =
        lambdas.iter().map(|(name, raw)| Ok((parse(raw)?, figures_of(&stats, name)))).collect();
    emit(&render_ls(&rows?, now()))
}

/// `sprout show NAME`: one lambda's metadata and figures.
pub fn show(endpoint: &Endpoint, name: &str) -> Result<()> {
    let worker = Worker::new(endpoint, TIMEOUT);
    let raw = worker.get(&format!("/registry/{}", segment(name)))?;
    let stats = with_invocations(stats_if_allowed(&worker)?);
    let figures = figures_of(&stats, name);
    if endpoint.json {
        return emit(&format!("{}\n", pretty(&combined(&raw, figures))));
    }
    emit(&render_show(&parse(&raw)?, figures, now()))
}

/// `sprout rm NAME...`: delete each; every failure is printed, and any makes the exit status 1.
pub fn rm(endpoint: &Endpoint, names: &[String]) -> Result<()> {
    let worker = Worker::new(endpoint, TIMEOUT);
    let mut failed = 0;
    for name in names {
        match worker.call("DELETE", &format!("/registry/{}", segment(name)), None) {
            Ok((_, raw)) if endpoint.json => emit(&format!("{}\n", pretty(&raw)))?,
            Ok(_) => emit(&format!("deleted {name}\n"))?,
            Err(e) => {
                eprintln!("sprout: {name}: {e:#}");
                failed += 1;
            }
        }
    }
    if failed > 0 {
        bail!("{failed} of {} not deleted", names.len());
    }
    Ok(())
}

/// What `sprout logs` asks for.
pub struct LogsQuery<'a> {
    pub follow: bool,
    pub since: Option<&'a str>,
    pub request: Option<&'a str>,
    pub limit: Option<u32>,
}

/// `sprout logs NAME`: a lambda's log entries as text lines; with `follow`, the stream until
/// the worker ends it or the user stops us.
pub fn logs(endpoint: &Endpoint, name: &str, q: &LogsQuery) -> Result<()> {
    // Following, the worker writes an empty line every 15 s: a silence of 90 s is a dead link.
    let worker = Worker::new(endpoint, if q.follow { Duration::from_secs(90) } else { TIMEOUT });
    let limit = q.limit.map(|l| l.to_string());
    let mut query = Vec::new();
    if let Some(since) = q.since {
        query.push(("since", since));
    }
    if let Some(request) = q.request {
        query.push(("request", request));
    }
    if let Some(limit) = &limit {
        query.push(("limit", limit.as_str()));
    }
    if q.follow {
        query.push(("follow", "1"));
    }
    let response = worker.send("GET", &format!("/logs/{}", segment(name)), &query, None).map_err(|e| client::explain(*e))?;
    if !q.follow {
        let raw = read_body(response)?;
        if endpoint.json {
            return emit(&format!("{}\n", pretty(&raw)));
        }
        let reply = parse(&raw)?;
        let mut text = String::new();
        for entry in reply["entries"].as_array().map(Vec::as_slice).unwrap_or_default() {
            text.push_str(&render_entry(entry));
            text.push('\n');
        }
        emit(&text)?;
        if let Some(note) = dropped_note(&reply["dropped"]) {
            eprintln!("{note}");
        }
        return Ok(());
    }
    let mut lines = BufReader::new(response.into_reader());
    let mut line = String::new();
    loop {
        line.clear();
        match lines.read_line(&mut line) {
            Ok(0) => {
                eprintln!("sprout: the worker at {} ended the log stream", worker.url);
                return Ok(());
            }
            Ok(_) => {}
            Err(e) => bail!("the log stream from {} ended: {e}", worker.url),
        }
        let text = line.trim_end_matches(['\n', '\r']);
        if text.trim().is_empty() {
            continue; // keep-alive
        }
        if endpoint.json {
            emit(&format!("{text}\n"))?;
            continue;
        }
        match serde_json::from_str::<Value>(text) {
            Ok(entry) => emit(&format!("{}\n", render_entry(&entry)))?,
            Err(_) => emit(&format!("{}\n", clean(text)))?,
        }
    }
}

/// `sprout stats`: the worker's figures for people.
pub fn stats(endpoint: &Endpoint) -> Result<()> {
    let raw = Worker::new(endpoint, TIMEOUT).get("/stats")?;
    if endpoint.json {
        return emit(&format!("{}\n", pretty(&raw)));
    }
    emit(&render_stats(&parse(&raw)?))
}

/// `sprout sites ls`: the app port's sites by host.
pub fn sites_ls(endpoint: &Endpoint) -> Result<()> {
    let raw = Worker::new(endpoint, TIMEOUT).get("/sites")?;
    if endpoint.json {
        return emit(&format!("{}\n", pretty(&raw)));
    }
    emit(&render_sites(&parse(&raw)?))
}

/// `sprout sites put HOST --lambda NAME [--static /prefix/=/dir ...]`: add or replace a site.
pub fn sites_put(endpoint: &Endpoint, host: &str, lambda: &str, statics: &[(String, String)]) -> Result<()> {
    let statics: serde_json::Map<String, Value> = statics.iter().map(|(p, d)| (p.clone(), Value::from(d.as_str()))).collect();
    let body = serde_json::json!({"lambda": lambda, "static": statics});
    let (status, raw) = Worker::new(endpoint, TIMEOUT).call("PUT", &format!("/sites/{}", segment(host)), Some(&body))?;
    if endpoint.json {
        return emit(&format!("{}\n", pretty(&raw)));
    }
    let reply = parse(&raw)?;
    let site = if reply["site"].is_object() { &reply["site"] } else { &body };
    let verb = if status == 201 { "added" } else { "replaced" };
    emit(&format!("{verb} site {}: {}\n", reply["host"].as_str().unwrap_or(host), describe_site(site)))
}

/// `sprout sites rm HOST`.
pub fn sites_rm(endpoint: &Endpoint, host: &str) -> Result<()> {
    let (_, raw) = Worker::new(endpoint, TIMEOUT).call("DELETE", &format!("/sites/{}", segment(host)), None)?;
    if endpoint.json {
        return emit(&format!("{}\n", pretty(&raw)));
    }
    emit(&format!("removed site {host}\n"))
}
