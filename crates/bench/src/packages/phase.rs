//! What every phase of `sprout bench packages` starts from: its options, the packages
//! measured, the cache configurations, the shared install cache and the workers configured
//! and started on it, and the files of the lambdas deployed.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Result};

use crate::worker::BenchWorker;

/// The packages measured one by one: (name, requirement, what a lambda imports).
pub const PACKAGES: [(&str, &str, &str); 6] = [
    ("django", "django==4.2.16", "from django.http import HttpResponse"),
    ("flask", "flask==3.0.3", "from flask import Flask"),
    ("jinja2", "jinja2==3.1.4", "import jinja2"),
    ("requests", "requests==2.32.3", "import requests"),
    ("pillow", "pillow==10.4.0", "from PIL import Image"),
    ("numpy", "numpy==1.26.4", "import numpy"),
];

pub const PARTS: [&str; 5] = ["cold", "django", "scale", "resize", "memory"];

#[derive(Debug, Clone)]
pub struct Options {
    pub parts: Vec<String>,
    /// Fewer samples and smaller points, for a quick look.
    pub quick: bool,
    /// Seconds each scalability point runs.
    pub scale_seconds: f64,
    pub worker_cpu: usize,
    pub client_cpu: usize,
    pub work_dir: PathBuf,
    pub out_dir: PathBuf,
    pub sprout: PathBuf,
    pub seed: u64,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            parts: PARTS.iter().map(|s| s.to_string()).collect(),
            quick: false,
            scale_seconds: 60.0,
            worker_cpu: 0,
            client_cpu: 1,
            work_dir: PathBuf::from("/tmp/sprout-bench-packages"),
            out_dir: PathBuf::from("bench/results"),
            sprout: std::env::current_exe().unwrap_or_else(|_| PathBuf::from("sprout")),
            seed: 1,
        }
    }
}

/// Which caches a phase's worker uses.
#[derive(Debug, Clone, Copy)]
pub struct Caches {
    pub install: bool,
    pub import: bool,
    pub handler: bool,
}

impl Caches {
    pub const NONE: Caches = Caches { install: false, import: false, handler: false };
    pub const HANDLER: Caches = Caches { install: false, import: false, handler: true };
    pub const INSTALL: Caches = Caches { install: true, import: false, handler: false };
    pub const IMPORT: Caches = Caches { install: true, import: true, handler: false };
    pub const ALL: Caches = Caches { install: true, import: true, handler: true };
    pub const INSTALL_HANDLER: Caches = Caches { install: true, import: false, handler: true };
}

/// State shared by the phases.
pub struct Bench {
    pub opts: Options,
    pub cache_dir: PathBuf,
    pub(super) next_port: std::sync::atomic::AtomicU16,
}

impl Bench {
    /// The worker configuration for `caches`, with the shared install cache.
    pub fn config(&self, caches: Caches, handler_cache_mb: u64, extra: &str) -> String {
        let packages = format!("cache_dir = \"{}\"\ninstall_cache = {}\n", self.cache_dir.display(), caches.install);
        self.config_with_packages(caches, handler_cache_mb, &packages) + extra
    }

    /// The worker configuration for `caches`, with `packages` as its [packages] section.
    pub fn config_with_packages(&self, caches: Caches, handler_cache_mb: u64, packages: &str) -> String {
        format!(
            "[sandbox]\ncgroup_pool = 32\nstart_timeout_ms = 600000\nzygote_memory_mb = 1024\n\
             [limits]\nmemory_mb = 512\npids = 256\ntimeout_ms = 600000\nmax_body_mb = 16\n\
             [packages]\ninstall_timeout_s = 900\n{packages}\
             [import_cache]\nenabled = {}\n\
             [instances]\nkeep_warm = {}\nmax_per_lambda = 4\nmax_total = 512\nidle_timeout_s = 3600\nqueue_depth = 1024\n\
             [handler_cache]\nmemory_mb = {handler_cache_mb}\n",
            caches.import, caches.handler,
        )
    }

    pub fn start(&self, phase: &str, config: &str) -> Result<BenchWorker> {
        let port = self.next_port.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        BenchWorker::start(&self.opts.sprout, &self.opts.work_dir.join(phase), port, Some(self.opts.worker_cpu), config)
    }

    /// Fill the install cache with `requirement` and its dependencies (once per run).
    pub fn preinstall(&self, requirement: &str) -> Result<()> {
        let dir = self.opts.work_dir.join("preinstall");
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("config.toml"), format!("[packages]\ncache_dir = \"{}\"\n", self.cache_dir.display()))?;
        let file = dir.join("requirements.txt");
        std::fs::write(&file, format!("{requirement}\n"))?;
        let out = Command::new(&self.opts.sprout).args(["packages", "preinstall"]).arg(&file).arg("--dir").arg(&dir).output()?;
        if !out.status.success() {
            bail!("preinstalling {requirement}: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(())
    }
}

/// The files of a lambda importing what `import` says, with `requirement`.
pub fn lambda_files(import: &str, requirement: &str, body: &str) -> Vec<(String, Vec<u8>)> {
    vec![
        ("f.py".to_string(), format!("{import}\n\n\ndef f(event):\n{body}\n").into_bytes()),
        ("requirements.txt".to_string(), format!("{requirement}\n").into_bytes()),
    ]
}

pub fn as_refs(files: &[(String, Vec<u8>)]) -> Vec<(&str, &[u8])> {
    files.iter().map(|(n, d)| (n.as_str(), d.as_slice())).collect()
}

/// Summed PSS (MiB) of every process of a worker's sandboxes and Zygotes.
pub fn worker_pss_mb(worker: &BenchWorker) -> f64 {
    sprout_sandbox::memory::pss_of_pids(&worker.sandbox_pids()) as f64 / (1 << 20) as f64
}
