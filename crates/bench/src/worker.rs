//! A real worker for a benchmark phase: configured from TOML, started with `sprout worker up`
//! pinned to one CPU (or a set of them), driven over HTTP (blocking, one agent per client thread), stopped with
//! `sprout worker down`. Uploads, deletes and `/stats` send the worker's token, read from
//! `DIR/api-token` (which `sprout worker init` makes); `/run` needs none.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::Value;

/// Pin the calling thread (and the processes it starts later) to `cpu`.
pub fn pin_to(cpu: usize) -> std::io::Result<()> {
    pin_to_cpus(&[cpu])
}

/// Pin the calling thread (and the processes it starts later) to the CPUs `cpus`.
pub fn pin_to_cpus(cpus: &[usize]) -> std::io::Result<()> {
    let mut set = nix::sched::CpuSet::new();
    for &cpu in cpus {
        set.set(cpu).map_err(std::io::Error::from)?;
    }
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set).map_err(std::io::Error::from)
}

pub struct BenchWorker {
    child: Child,
    pub dir: PathBuf,
    pub port: u16,
    sprout: PathBuf,
    agent: ureq::Agent,
    /// `Bearer <DIR/api-token>`.
    authorization: String,
}

/// One request's outcome.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub ms: f64,
    /// `cold` or `warm` (X-Sprout-Start).
    pub start: String,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

impl BenchWorker {
    /// Write `config` (the [worker] section is added) to DIR/config.toml, init and start the
    /// worker on `cpu`, and wait until it answers.
    pub fn start(sprout: &Path, dir: &Path, port: u16, cpu: Option<usize>, config: &str) -> Result<BenchWorker> {
        BenchWorker::start_on(sprout, dir, port, cpu.as_slice(), config)
    }

    /// As [`BenchWorker::start`], pinned to the CPUs `cpus` (none: not pinned).
    pub fn start_on(sprout: &Path, dir: &Path, port: u16, cpus: &[usize], config: &str) -> Result<BenchWorker> {
        if dir.exists() {
            // A stale worker directory of an earlier run: make sure nothing of it is mounted.
            let _ = Command::new(sprout).args(["worker", "down"]).arg(dir).output();
            let _ = Command::new(sprout).args(["worker", "cleanup"]).arg(dir).output();
            std::fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
        }
        std::fs::create_dir_all(dir)?;
        let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or("bench").replace(|c: char| !c.is_ascii_alphanumeric(), "-");
        let full = format!("[worker]\nlisten = \"127.0.0.1:{port}\"\nname = \"bench-{name}\"\nlog = \"warn\"\n{config}");
        std::fs::write(dir.join("config.toml"), full)?;
        let init = Command::new(sprout).args(["worker", "init"]).arg(dir).output()?;
        if !init.status.success() {
            bail!("sprout worker init: {}", String::from_utf8_lossy(&init.stderr));
        }
        let token_file = dir.join("api-token");
        let token = std::fs::read_to_string(&token_file).with_context(|| format!("reading {}", token_file.display()))?;
        let authorization = format!("Bearer {}", token.trim());
        let log = std::fs::File::create(dir.join("bench-worker.log"))?;
        let mut cmd = Command::new(sprout);
        cmd.args(["worker", "up"]).arg(dir).stdout(log.try_clone()?).stderr(log);
        if !cpus.is_empty() {
            let cpus = cpus.to_vec();
            // SAFETY: the closure runs in the forked child before exec; pin_to_cpus only fills a CpuSet on
            // the stack and calls sched_setaffinity, which is async-signal-safe, and allocates nothing.
            unsafe {
                use std::os::unix::process::CommandExt;
                cmd.pre_exec(move || pin_to_cpus(&cpus));
            }
        }
        let child = cmd.spawn()?;
        let agent = ureq::AgentBuilder::new().timeout(Duration::from_secs(900)).build();
        let mut worker = BenchWorker { child, dir: dir.to_path_buf(), port, sprout: sprout.to_path_buf(), agent, authorization };
        let deadline = Instant::now() + Duration::from_secs(300);
        loop {
            if let Some(status) = worker.child.try_wait()? {
                bail!("the worker in {} exited ({status}): {}", dir.display(), worker.log_tail(8));
            }
            if worker.agent.get(&format!("{}/status", worker.url())).call().is_ok() {
                return Ok(worker);
            }
            if Instant::now() > deadline {
                bail!("the worker in {} did not start", dir.display());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn log_tail(&self, lines: usize) -> String {
        let log = std::fs::read_to_string(self.dir.join("bench-worker.log")).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(lines).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    /// Upload a lambda made of `files` (name, contents).
    pub fn upload(&self, name: &str, files: &[(&str, &[u8])]) -> Result<()> {
        upload_with(&self.agent, &self.url(), &self.authorization, name, files)
    }

    /// A separate HTTP client for another thread.
    pub fn client(&self) -> Client {
        Client {
            agent: ureq::AgentBuilder::new().timeout(Duration::from_secs(900)).build(),
            url: self.url(),
            authorization: self.authorization.clone(),
        }
    }

    pub fn invoke(&self, name: &str, body: &[u8]) -> Result<Reply> {
        invoke_with(&self.agent, &self.url(), name, body)
    }

    pub fn stats(&self) -> Result<Value> {
        Ok(self.agent.get(&format!("{}/stats", self.url())).set("Authorization", &self.authorization).call()?.into_json()?)
    }

    pub fn delete(&self, name: &str) -> Result<()> {
        self.agent.delete(&format!("{}/registry/{name}", self.url())).set("Authorization", &self.authorization).call()?;
        Ok(())
    }

    /// Host pids of every process of this worker's sandboxes and Zygotes.
    pub fn sandbox_pids(&self) -> Vec<i32> {
        let name = format!(
            "sprout-bench-{}",
            self.dir.file_name().and_then(|n| n.to_str()).unwrap_or("bench").replace(|c: char| !c.is_ascii_alphanumeric(), "-")
        );
        let mut out = Vec::new();
        let mut stack = vec![Path::new("/sys/fs/cgroup/pids").join(&name), Path::new("/sys/fs/cgroup").join(&name)];
        while let Some(dir) = stack.pop() {
            if let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) {
                out.extend(text.split_whitespace().filter_map(|p| p.parse::<i32>().ok()));
            }
            if let Ok(entries) = std::fs::read_dir(&dir) {
                stack.extend(entries.flatten().filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false)).map(|e| e.path()));
            }
        }
        out.sort();
        out.dedup();
        out
    }

    pub fn stop(mut self) -> Result<()> {
        let out = Command::new(&self.sprout).args(["worker", "down"]).arg(&self.dir).output()?;
        if !out.status.success() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
        Ok(())
    }
}

/// An HTTP client of one worker, for one thread.
pub struct Client {
    agent: ureq::Agent,
    url: String,
    authorization: String,
}

impl Client {
    /// A client of any worker API (a load balancer's, say) with `token`.
    pub fn new(url: &str, token: &str, timeout: Duration) -> Client {
        Client { agent: ureq::AgentBuilder::new().timeout(timeout).build(), url: url.to_string(), authorization: format!("Bearer {token}") }
    }

    pub fn invoke(&self, name: &str, body: &[u8]) -> Result<Reply> {
        invoke_with(&self.agent, &self.url, name, body)
    }

    pub fn upload(&self, name: &str, files: &[(&str, &[u8])]) -> Result<()> {
        upload_with(&self.agent, &self.url, &self.authorization, name, files)
    }
}

fn invoke_with(agent: &ureq::Agent, url: &str, name: &str, body: &[u8]) -> Result<Reply> {
    let started = Instant::now();
    let response = match agent.post(&format!("{url}/run/{name}")).set("Content-Type", "application/json").send_bytes(body) {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => return Err(e.into()),
    };
    let status = response.status();
    let start = response.header("x-sprout-start").unwrap_or("").to_string();
    let mut bytes = Vec::new();
    response.into_reader().take(64 << 20).read_to_end(&mut bytes)?;
    Ok(Reply { status, ms: started.elapsed().as_secs_f64() * 1000.0, start, body: bytes })
}

fn upload_with(agent: &ureq::Agent, url: &str, authorization: &str, name: &str, files: &[(&str, &[u8])]) -> Result<()> {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut tar = tar::Builder::new(gz);
    for (path, data) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        tar.append_data(&mut header, path, *data)?;
    }
    let mut gz = tar.into_inner()?;
    gz.flush()?;
    let archive = gz.finish()?;
    match agent.post(&format!("{url}/registry/{name}")).set("Authorization", authorization).send_bytes(&archive) {
        Ok(_) => Ok(()),
        Err(ureq::Error::Status(code, r)) => bail!("uploading {name}: {code} {}", r.into_string().unwrap_or_default()),
        Err(e) => Err(e.into()),
    }
}
