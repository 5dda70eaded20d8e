//! Packages for lambdas: a lambda's `requirements.txt` is resolved by pip once per requirement
//! set, each package is installed once into the install cache, and a sandbox sees exactly the
//! packages its lambda asked for, and their dependencies, on its `sys.path` (SOCK section 4.3).
//!
//! * [`requirements`] parses and checks the file (pinned versions unless configured otherwise);
//! * [`install_cache`] is the install cache on disk; [`pip`] runs pip in one-shot sandboxes.
//!
//! [`Packages::for_sandbox`] is what a cold start awaits: the resolved, installed set, shared
//! by every request that needs it while it is being made. A failure is remembered for
//! `FAILURE_TTL` so a broken requirement does not start pip on every request. With the install
//! cache off, each call installs the whole set afresh into a directory of its own, removed
//! with the sandbox: the baseline the cache is measured against.

pub mod install_cache;
pub mod pip;
pub mod requirements;
pub mod tree;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use sprout_sandbox::Package;
use tokio::sync::OnceCell;

use install_cache::{InstallCache, InstalledPackage, Pin};
use pip::{Installer, PipError};
use requirements::Requirement;

/// How long a failed resolution or install is remembered before pip is tried again.
const FAILURE_TTL: Duration = Duration::from_secs(30);

/// Why a lambda's packages are not available.
#[derive(Debug, Clone, Serialize, thiserror::Error)]
#[error("{message}")]
pub struct InstallError {
    /// The package that failed to install (none when resolution failed).
    pub package: Option<String>,
    pub message: String,
    /// The end of pip's output.
    pub output: String,
    /// The lines of pip's output that say why.
    pub reasons: Vec<String>,
}

impl InstallError {
    fn from_pip(package: Option<String>, e: PipError) -> InstallError {
        InstallError { package, message: e.message, output: e.output, reasons: e.reasons }
    }

    fn internal(message: String) -> InstallError {
        InstallError { package: None, message, output: String::new(), reasons: Vec::new() }
    }
}

/// The packages one sandbox sees.
#[derive(Debug)]
pub struct PackageSet {
    /// Installed packages, dependencies before their dependents.
    pub packages: Vec<Package>,
    /// sys.path entries of the packages, in the same order.
    pub paths: Vec<String>,
    /// A per-sandbox install (install cache off), removed when the last holder drops it.
    /// A sandbox's own install (the install cache off), removed when the set is dropped.
    pub _ephemeral: Option<EphemeralDir>,
}

/// A directory removed when dropped.
#[derive(Debug)]
pub struct EphemeralDir(pub std::path::PathBuf);

impl Drop for EphemeralDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

type Outcome = (Instant, Result<Arc<PackageSet>, InstallError>);
/// Installs in progress, by package key: concurrent needs of one package share its install.
type Installing = Mutex<HashMap<String, Arc<OnceCell<Result<InstalledPackage, InstallError>>>>>;

#[derive(Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    installs: AtomicU64,
    install_failures: AtomicU64,
    resolutions: AtomicU64,
    resolution_failures: AtomicU64,
    install_ms: AtomicU64,
}

pub struct Packages {
    cache: InstallCache,
    installer: Installer,
    use_cache: bool,
    allow_unpinned: bool,
    sets: Mutex<HashMap<String, Arc<OnceCell<Outcome>>>>,
    installing: Installing,
    counters: Counters,
    uid: u32,
    gid: u32,
}

impl Packages {
    pub fn new(cache: InstallCache, installer: Installer, use_cache: bool, allow_unpinned: bool, uid: u32, gid: u32) -> Packages {
        Packages {
            cache,
            installer,
            use_cache,
            allow_unpinned,
            sets: Mutex::new(HashMap::new()),
            installing: Mutex::new(HashMap::new()),
            counters: Counters::default(),
            uid,
            gid,
        }
    }

    pub fn cache(&self) -> &InstallCache {
        &self.cache
    }

    pub fn allow_unpinned(&self) -> bool {
        self.allow_unpinned
    }

    fn digest(&self, text: &str) -> String {
        let mut h = Sha256::new();
        h.update(text.as_bytes());
        h.update(b"\n--\n");
        h.update(self.installer.source_fingerprint().as_bytes());
        hex::encode(&h.finalize()[..16])
    }

    /// The packages a new sandbox of a lambda with `reqs` sees: the cached set, or (install
    /// cache off) a fresh install of its own.
    pub async fn for_sandbox(&self, reqs: &[Requirement]) -> Result<Arc<PackageSet>, InstallError> {
        if reqs.is_empty() {
            return Ok(Arc::new(PackageSet { packages: Vec::new(), paths: Vec::new(), _ephemeral: None }));
        }
        if !self.use_cache {
            return self.install_ephemeral(reqs).await;
        }
        let (set, made_now) = self.prepare_set(reqs).await;
        let set = set?;
        if !made_now {
            // Counted package by package when the set was made.
            self.counters.hits.fetch_add(set.packages.len() as u64, Ordering::Relaxed);
        }
        Ok(set)
    }

    /// Install a freshly uploaded lambda's packages ahead of its first request (nothing with
    /// the install cache off: then every sandbox installs its own).
    pub async fn prefetch(&self, reqs: &[Requirement]) -> Result<(), InstallError> {
        if self.use_cache && !reqs.is_empty() {
            self.prepare(reqs).await?;
        }
        Ok(())
    }

    /// Resolve and install `reqs` into the cache (once; concurrent callers share the work).
    pub async fn prepare(&self, reqs: &[Requirement]) -> Result<Arc<PackageSet>, InstallError> {
        self.prepare_set(reqs).await.0
    }

    /// [`Packages::prepare`], and whether this call did the work.
    async fn prepare_set(&self, reqs: &[Requirement]) -> (Result<Arc<PackageSet>, InstallError>, bool) {
        let text = requirements::canonical_text(reqs);
        let digest = self.digest(&text);
        let cell = {
            let mut sets = self.sets.lock().unwrap();
            let cell = sets.entry(digest.clone()).or_default();
            if let Some((at, Err(_))) = cell.get() {
                if at.elapsed() > FAILURE_TTL {
                    *cell = Arc::default();
                }
            }
            cell.clone()
        };
        let made_now = std::sync::atomic::AtomicBool::new(false);
        let (_, result) = cell
            .get_or_init(|| async {
                made_now.store(true, Ordering::Relaxed);
                (Instant::now(), self.make_set(reqs, &text, &digest).await.map(Arc::new))
            })
            .await;
        (result.clone(), made_now.load(Ordering::Relaxed))
    }

    async fn make_set(&self, reqs: &[Requirement], text: &str, digest: &str) -> Result<PackageSet, InstallError> {
        let pins = match self.cache.resolution(digest).or_else(|| self.resolve_locally(reqs)) {
            Some(pins) => pins,
            None => {
                let staging = self.cache.staging(self.uid, self.gid).map_err(|e| InstallError::internal(e.to_string()))?;
                self.counters.resolutions.fetch_add(1, Ordering::Relaxed);
                let pins = self.installer.resolve(text, &staging).await.map_err(|e| {
                    self.counters.resolution_failures.fetch_add(1, Ordering::Relaxed);
                    InstallError::from_pip(None, e)
                })?;
                if let Err(e) = self.cache.save_resolution(digest, &pins) {
                    tracing::warn!("saving a resolution: {e}");
                }
                pins
            }
        };
        let mut installed = BTreeMap::new();
        for pin in &pins {
            let package = match self.cache.get(&pin.key()) {
                Some(p) => {
                    self.counters.hits.fetch_add(1, Ordering::Relaxed);
                    p
                }
                None => {
                    self.counters.misses.fetch_add(1, Ordering::Relaxed);
                    self.install_once(pin).await?
                }
            };
            installed.insert(pin.name.clone(), package);
        }
        // Zygotes import ahead the modules of the packages the lambda named; those of mere
        // dependencies only when lambdas are seen to load them.
        let named = |name: &str| reqs.iter().any(|r| r.normalized == name);
        let packages: Vec<Package> = dependency_order(&pins)
            .into_iter()
            .filter_map(|name| installed.get(&name).map(|p| (name, p)))
            .map(|(name, p)| Package {
                key: p.key.clone(),
                path: format!("/packages/{}", p.key),
                modules: if named(&name) { p.top_level.clone() } else { Vec::new() },
                size_bytes: p.size_bytes,
            })
            .collect();
        let paths = packages.iter().map(|p| p.path.clone()).collect();
        Ok(PackageSet { packages, paths, _ephemeral: None })
    }

    /// A fully pinned set whose packages are all in the cache and bring every dependency they
    /// need, at versions they accept, is used as written (OpenLambda's model: pip-compile
    /// output needs no resolver). None when anything is uncertain: pip resolves then.
    fn resolve_locally(&self, reqs: &[Requirement]) -> Option<Vec<Pin>> {
        let mut held: Vec<(String, InstalledPackage)> = Vec::new();
        for r in reqs {
            if r.marker.is_some() || !r.extras.is_empty() {
                return None;
            }
            held.push((r.normalized.clone(), self.cache.get(&install_cache::key(&r.normalized, r.pinned_version()?))?));
        }
        let mut pins = Vec::new();
        for (name, package) in &held {
            let mut depends_on = Vec::new();
            for dist in &package.requires_dist {
                let (requirement, marker) = match dist.split_once(';') {
                    Some((r, m)) => (r.trim(), Some(m.trim())),
                    None => (dist.trim(), None),
                };
                if marker.map(|m| m.contains("extra")).unwrap_or(false) {
                    continue; // an optional extra nobody asked for
                }
                let dep = requirements::normalize(pip::requirement_name(requirement));
                let specifier = requirement[pip::requirement_name(requirement).len()..].trim();
                match held.iter().find(|(n, _)| *n == dep) {
                    Some((_, found)) => {
                        if !requirements::satisfies(&found.version, specifier.split(';').next().unwrap_or(""))? {
                            return None; // a conflict: let pip explain it
                        }
                        depends_on.push(dep);
                    }
                    // Missing, and needed (or maybe needed: a marker we do not evaluate).
                    None => return None,
                }
            }
            depends_on.sort();
            pins.push(Pin { name: name.clone(), version: package.version.clone(), depends_on });
        }
        Some(pins)
    }

    /// Install one pinned package, once even when several sets need it at the same time.
    async fn install_once(&self, pin: &Pin) -> Result<InstalledPackage, InstallError> {
        let key = pin.key();
        let cell = self.installing.lock().unwrap().entry(key.clone()).or_default().clone();
        let result = cell
            .get_or_init(|| async {
                if let Some(p) = self.cache.get(&key) {
                    return Ok(p);
                }
                let staging = self.cache.staging(self.uid, self.gid).map_err(|e| InstallError::internal(e.to_string()))?;
                self.counters.installs.fetch_add(1, Ordering::Relaxed);
                let took = self.installer.install(pin, &staging).await.map_err(|e| {
                    self.counters.install_failures.fetch_add(1, Ordering::Relaxed);
                    InstallError::from_pip(Some(key.clone()), e)
                })?;
                self.counters.install_ms.fetch_add(took.as_millis() as u64, Ordering::Relaxed);
                let meta = install_cache::describe(&staging.files(), took.as_millis() as u64).map_err(|e| InstallError {
                    package: Some(key.clone()),
                    message: format!("reading what pip installed: {e}"),
                    output: String::new(),
                    reasons: Vec::new(),
                })?;
                if meta.key != key {
                    return Err(InstallError::internal(format!("pip installed {} when asked for {key}", meta.key)));
                }
                self.cache.publish(&staging, &meta).map_err(|e| InstallError::internal(format!("publishing {key}: {e}")))?;
                tracing::info!(package = %key, ms = took.as_millis() as u64, bytes = meta.size_bytes, "installed");
                Ok(meta)
            })
            .await
            .clone();
        self.installing.lock().unwrap().remove(&key);
        result
    }

    async fn install_ephemeral(&self, reqs: &[Requirement]) -> Result<Arc<PackageSet>, InstallError> {
        let text = requirements::canonical_text(reqs);
        let staging = self.cache.staging(self.uid, self.gid).map_err(|e| InstallError::internal(e.to_string()))?;
        self.counters.installs.fetch_add(1, Ordering::Relaxed);
        self.counters.misses.fetch_add(reqs.len() as u64, Ordering::Relaxed);
        let took = self.installer.install_all(&text, &staging).await.map_err(|e| {
            self.counters.install_failures.fetch_add(1, Ordering::Relaxed);
            InstallError::from_pip(None, e)
        })?;
        self.counters.install_ms.fetch_add(took.as_millis() as u64, Ordering::Relaxed);
        let (dir, path) = self.cache.publish_ephemeral(&staging).map_err(|e| InstallError::internal(e.to_string()))?;
        Ok(Arc::new(PackageSet { packages: Vec::new(), paths: vec![path], _ephemeral: Some(EphemeralDir(dir)) }))
    }

    /// Figures for /stats.
    pub fn stats(&self) -> Value {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        json!({
            "enabled": self.use_cache,
            "hits": get(&c.hits),
            "misses": get(&c.misses),
            "installs": get(&c.installs),
            "install_failures": get(&c.install_failures),
            "install_seconds": get(&c.install_ms) as f64 / 1000.0,
            "resolutions": get(&c.resolutions),
            "resolution_failures": get(&c.resolution_failures),
            "installed_packages": self.cache.list().len(),
        })
    }

    /// (hits, misses, installs, failures) for /metrics.
    pub fn counters(&self) -> [(&'static str, &'static str, u64); 4] {
        let c = &self.counters;
        [
            ("sprout_install_cache_hits", "Packages of new sandboxes found in the install cache", c.hits.load(Ordering::Relaxed)),
            ("sprout_install_cache_misses", "Packages of new sandboxes that had to be installed", c.misses.load(Ordering::Relaxed)),
            ("sprout_package_installs", "pip installs run", c.installs.load(Ordering::Relaxed)),
            (
                "sprout_package_install_failures",
                "pip runs (resolutions and installs) that failed",
                c.install_failures.load(Ordering::Relaxed) + c.resolution_failures.load(Ordering::Relaxed),
            ),
        ]
    }
}

/// Names of `pins`, each after the packages it depends on (ties by name).
fn dependency_order(pins: &[Pin]) -> Vec<String> {
    let mut done: Vec<String> = Vec::new();
    let mut remaining: Vec<&Pin> = pins.iter().collect();
    remaining.sort_by(|a, b| a.name.cmp(&b.name));
    while !remaining.is_empty() {
        let ready =
            remaining.iter().position(|p| p.depends_on.iter().all(|d| done.contains(d) || !pins.iter().any(|q| &q.name == d))).unwrap_or(0); // a cycle: break it at the first name
        done.push(remaining.remove(ready).name.clone());
    }
    done
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pin(name: &str, deps: &[&str]) -> Pin {
        Pin { name: name.into(), version: "1".into(), depends_on: deps.iter().map(|d| d.to_string()).collect() }
    }

    #[test]
    fn dependencies_come_first_and_cycles_do_not_hang() {
        let pins = [
            pin("django", &["asgiref", "sqlparse"]),
            pin("asgiref", &["typing-extensions"]),
            pin("sqlparse", &[]),
            pin("typing-extensions", &[]),
        ];
        assert_eq!(dependency_order(&pins), vec!["sqlparse", "typing-extensions", "asgiref", "django"]);
        let cycle = [pin("a", &["b"]), pin("b", &["a"])];
        assert_eq!(dependency_order(&cycle).len(), 2);
    }
}
