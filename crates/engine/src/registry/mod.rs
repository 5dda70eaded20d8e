//! The lambda registry: each lambda's code, as uploaded through `POST /registry/<name>`.
//!
//! Versions are immutable directories, `DIR/registry/<name>@<version>/`, with their metadata
//! beside them in `<name>@<version>.json`. An upload is unpacked and checked in a staging
//! directory and published with one rename, so a half-unpacked lambda is never served.
//! Its Python modules are compiled to bytecode there first ([`bytecode`]).
//! Replacing a lambda takes effect for the next sandbox; sandboxes still running the old
//! version keep their code mounted, and the old directory is removed when the last of them
//! lets go of its [`Lambda`] (an `Arc`). On start the newest version of each name is kept.
//! A `requirements.txt` beside f.py is parsed and checked at upload (pinned versions unless
//! the configuration allows otherwise); its packages are installed by [`crate::packages`].
//! An `ol.yaml` (and `.env`) is parsed and checked at upload too ([`lambda_config`]);
//! it may name another entry file than f.py, which must then be there. One that asks to
//! `preload` holds the shared copy of its code ([`shared_code`]), made at upload.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

mod archive;
mod bytecode;
pub mod lambda_config;
mod shared_code;
mod syntax;

pub use crate::names::valid_name;
pub use archive::Caps;
pub use lambda_config::{InvokeAuth, KafkaTrigger, LambdaConfig};
pub use syntax::{Checker, SyntaxError};

use crate::config::BackendKind;
use crate::errors::ErrorCode;
use crate::isolation::{Isolation, Unavailable};
use crate::packages::requirements::{self, Requirement, RequirementsError};
use archive::ArchiveError;
use lambda_config::ConfigError;
use shared_code::{SharedCodeDir, SharedCodes};

/// One published version of a lambda.
#[derive(Debug, Serialize, Deserialize)]
pub struct Lambda {
    pub name: String,
    pub version: u64,
    /// sha256 of the uploaded archive.
    pub sha256: String,
    pub archive_bytes: u64,
    pub files: usize,
    pub unpacked_bytes: u64,
    /// Seconds since the Unix epoch.
    pub uploaded: u64,
    /// Its requirements.txt in canonical form, one package per line (none without one).
    #[serde(default)]
    pub requirements: Vec<String>,
    /// Its ol.yaml (the defaults without one).
    #[serde(default)]
    pub config: LambdaConfig,
    /// The isolation class the operator gave it at upload (`?isolation=`), kept by later
    /// versions uploaded without one; None: the configuration's ([`crate::isolation`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolation: Option<BackendKind>,
    /// The absolute modules its entry file imports (found at upload, never run): a Zygote
    /// made for its packages imports those of them ahead.
    #[serde(default)]
    pub imports: Arc<[String]>,
    #[serde(skip)]
    pub parsed_requirements: Vec<Requirement>,
    #[serde(skip)]
    pub dir: PathBuf,
    /// Its code without its settings files, shared with lambdas of the same code (ol.yaml's
    /// `preload`).
    #[serde(skip)]
    pub shared_code: Option<Arc<SharedCodeDir>>,
    #[serde(skip)]
    retired: AtomicBool,
}

#[cfg(test)]
impl Lambda {
    /// A lambda that was never uploaded, for the tests of what serves it.
    pub fn fake(name: &str, version: u64) -> Arc<Lambda> {
        Lambda::fake_with(name, version, LambdaConfig::default())
    }

    /// The same, with an `ol.yaml`.
    pub fn fake_with(name: &str, version: u64, config: LambdaConfig) -> Arc<Lambda> {
        Arc::new(Lambda {
            name: name.to_string(),
            version,
            sha256: String::new(),
            archive_bytes: 0,
            files: 0,
            unpacked_bytes: 0,
            uploaded: 0,
            requirements: Vec::new(),
            config,
            isolation: None,
            imports: Arc::from([]),
            parsed_requirements: Vec::new(),
            dir: PathBuf::from("/nonexistent"),
            shared_code: None,
            retired: AtomicBool::new(false),
        })
    }

    /// Mark it replaced, as an upload of a new version does.
    pub fn replaced(&self) {
        self.retired.store(true, Ordering::Release);
    }
}

impl Lambda {
    /// False once the lambda was replaced or deleted.
    pub fn is_current(&self) -> bool {
        !self.retired.load(Ordering::Acquire)
    }

    fn retire(&self) {
        self.retired.store(true, Ordering::Release);
        let _ = fs::remove_file(self.dir.with_extension("json"));
    }
}

impl Drop for Lambda {
    fn drop(&mut self) {
        if self.retired.load(Ordering::Acquire) {
            if let Err(e) = fs::remove_dir_all(&self.dir) {
                tracing::warn!("removing retired code {}: {e}", self.dir.display());
            }
        }
    }
}

/// Why an upload was refused; `code` is the API's stable error code.
#[derive(Debug, thiserror::Error)]
pub enum UploadError {
    #[error("invalid lambda name {0:?}: use 1-64 letters, digits, '-', '_' or '.', starting with a letter or digit")]
    InvalidName(String),
    #[error(transparent)]
    Archive(#[from] ArchiveError),
    #[error("syntax error in {0}")]
    Syntax(SyntaxError),
    #[error(transparent)]
    Requirements(#[from] RequirementsError),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("{0}")]
    Internal(String),
}

impl UploadError {
    pub fn code(&self) -> ErrorCode {
        match self {
            UploadError::InvalidName(_) => ErrorCode::InvalidName,
            UploadError::Archive(e) => e.code(),
            UploadError::Syntax(_) => ErrorCode::SyntaxError,
            UploadError::Requirements(e) => e.code(),
            UploadError::Config(_) => ErrorCode::InvalidLambdaConfig,
            UploadError::Internal(_) => ErrorCode::Internal,
        }
    }
}

/// The shared copy of `lambda`'s published code when its ol.yaml asks to `preload`; failing
/// that, none (each sandbox loads its own code).
fn share(shared: &SharedCodes, lambda: &Lambda) -> Option<Arc<SharedCodeDir>> {
    let preload = lambda.config.preload.as_ref()?;
    shared
        .share(&lambda.dir, preload)
        .map_err(|e| tracing::warn!(lambda = %lambda.name, "its code cannot be shared (each sandbox loads it): {e}"))
        .ok()
}

pub struct Registry {
    dir: PathBuf,
    caps: Caps,
    checker: Checker,
    allow_unpinned: bool,
    isolation: Arc<Isolation>,
    shared: SharedCodes,
    lambdas: RwLock<HashMap<String, Arc<Lambda>>>,
    next_version: AtomicU64,
}

impl Registry {
    /// Open the registry at `dir`, keeping the newest version of each lambda found there.
    pub fn open(dir: &Path, caps: Caps, checker: Checker, allow_unpinned: bool, isolation: Arc<Isolation>) -> anyhow::Result<Registry> {
        fs::create_dir_all(dir)?;
        let staging = dir.join(".staging");
        if staging.exists() {
            fs::remove_dir_all(&staging)?;
        }
        let shared = SharedCodes::open(&dir.join(".shared"))?;
        let mut newest: HashMap<String, Lambda> = HashMap::new();
        let mut max_version = 0;
        for entry in fs::read_dir(dir)? {
            let path = entry?.path();
            let Some((name, version)) = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.rsplit_once('@'))
                .and_then(|(n, v)| Some((n.to_string(), v.parse::<u64>().ok()?)))
            else {
                continue;
            };
            if !path.is_dir() {
                continue;
            }
            max_version = max_version.max(version);
            let meta = fs::read(path.with_extension("json")).ok().and_then(|b| serde_json::from_slice::<Lambda>(&b).ok());
            let Some(mut lambda) = meta.filter(|m| m.name == name && m.version == version) else {
                tracing::warn!("removing {}: no metadata (an interrupted upload)", path.display());
                let _ = fs::remove_dir_all(&path);
                continue;
            };
            lambda.dir = path;
            let text = lambda.requirements.join("\n");
            match requirements::parse(&text, true) {
                Ok(parsed) => lambda.parsed_requirements = parsed,
                Err(e) => {
                    tracing::warn!(lambda = %name, "stored requirements no longer parse: {e}")
                }
            }
            let older = match newest.get(&name) {
                Some(current) if current.version > version => Some(lambda),
                _ => newest.insert(name, lambda),
            };
            if let Some(old) = older {
                old.retire();
            }
        }
        let lambdas = newest
            .into_iter()
            .map(|(k, mut v)| {
                v.shared_code = share(&shared, &v);
                (k, Arc::new(v))
            })
            .collect();
        Ok(Registry {
            dir: dir.to_path_buf(),
            caps,
            checker,
            allow_unpinned,
            isolation,
            shared,
            lambdas: RwLock::new(lambdas),
            next_version: AtomicU64::new(max_version + 1),
        })
    }

    pub fn get(&self, name: &str) -> Option<Arc<Lambda>> {
        self.lambdas.read().unwrap().get(name).cloned()
    }

    /// The isolation class `lambda` runs in, by the worker's policy as it is now (an error
    /// when that class is not run here any more).
    pub fn class_of(&self, lambda: &Lambda) -> Result<BackendKind, Unavailable> {
        self.isolation.class(&lambda.name, lambda.isolation, lambda.config.isolation)
    }

    pub fn isolation(&self) -> &Isolation {
        &self.isolation
    }

    /// All lambdas, by name.
    pub fn list(&self) -> Vec<Arc<Lambda>> {
        let mut all: Vec<_> = self.lambdas.read().unwrap().values().cloned().collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all
    }

    /// Check and publish a new version of `name` from a tar.gz (blocking: unpacks and runs
    /// the syntax check); `chosen` is the operator's isolation class for it (None: the
    /// current version's choice, if any). An `ol.yaml` asking for a stronger class than this
    /// worker runs is refused.
    pub fn upload(&self, name: &str, archive_data: &[u8], chosen: Option<BackendKind>) -> Result<Arc<Lambda>, UploadError> {
        if !valid_name(name) {
            return Err(UploadError::InvalidName(name.to_string()));
        }
        let version = self.next_version.fetch_add(1, Ordering::Relaxed);
        let staging = self.dir.join(".staging").join(format!("{name}@{version}"));
        let internal = |e: std::io::Error| UploadError::Internal(e.to_string());
        fs::create_dir_all(&staging).map_err(internal)?;
        let chosen = chosen.or_else(|| self.get(name).and_then(|l| l.isolation));
        let result = self.check_and_publish(name, version, archive_data, &staging, chosen);
        if result.is_err() {
            let _ = fs::remove_dir_all(&staging);
        }
        result
    }

    fn check_and_publish(
        &self,
        name: &str,
        version: u64,
        data: &[u8],
        staging: &Path,
        chosen: Option<BackendKind>,
    ) -> Result<Arc<Lambda>, UploadError> {
        let unpacked = archive::unpack(data, staging, self.caps)?;
        let read_text = |file: &str| -> Result<Option<String>, UploadError> {
            match fs::read(staging.join(file)) {
                Ok(bytes) => String::from_utf8(bytes)
                    .map(Some)
                    .map_err(|_| ConfigError { file: lambda_config::FILE_NAME, line: None, reason: format!("{file} is not UTF-8") }.into()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(UploadError::Internal(format!("reading {file}: {e}"))),
            }
        };
        let config = lambda_config::load(read_text(lambda_config::FILE_NAME)?.as_deref(), read_text(".env")?.as_deref())?;
        if !config.environment.is_empty() {
            // As OpenLambda does: the environment is also the lambda's .env.
            fs::write(staging.join(".env"), config.dotenv()).map_err(|e| UploadError::Internal(format!("writing .env: {e}")))?;
        }
        if let Err(e) = self.isolation.class(name, chosen, config.isolation) {
            return Err(ConfigError { file: lambda_config::FILE_NAME, line: None, reason: e.to_string() }.into());
        }
        let entry = config.entry_file();
        archive::check_entry(staging, entry)?;
        let source = fs::read(staging.join(entry)).map_err(|e| UploadError::Internal(format!("reading {entry}: {e}")))?;
        let imports = match self.checker.check(entry, &source) {
            Ok(Ok(imports)) => imports,
            Ok(Err(err)) => return Err(UploadError::Syntax(err)),
            Err(e) => return Err(UploadError::Internal(format!("{e:#}"))),
        };
        let parsed = match fs::read(staging.join("requirements.txt")) {
            Ok(bytes) => {
                let text = String::from_utf8(bytes)
                    .map_err(|_| RequirementsError::Invalid { line: 0, message: "requirements.txt is not UTF-8".into() })?;
                requirements::parse(&text, self.allow_unpinned)?
            }
            Err(_) => Vec::new(),
        };
        let compiled = bytecode::compile_tree(&self.checker, staging);
        for failure in &compiled.failures {
            tracing::warn!(lambda = name, "bytecode left to the sandboxes: {failure}");
        }
        let dir = self.dir.join(format!("{name}@{version}"));
        let mut lambda = Lambda {
            name: name.to_string(),
            version,
            sha256: hex::encode(Sha256::digest(data)),
            archive_bytes: data.len() as u64,
            files: unpacked.files,
            unpacked_bytes: unpacked.bytes,
            uploaded: SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
            requirements: parsed.iter().map(|r| r.canonical()).collect(),
            config,
            isolation: chosen,
            imports: imports.into(),
            parsed_requirements: parsed,
            dir: dir.clone(),
            shared_code: None,
            retired: AtomicBool::new(false),
        };
        let internal = |e: std::io::Error| UploadError::Internal(e.to_string());
        fs::write(dir.with_extension("json"), serde_json::to_vec_pretty(&lambda).unwrap()).map_err(internal)?;
        fs::rename(staging, &dir).map_err(internal)?;
        lambda.shared_code = share(&self.shared, &lambda);
        let lambda = Arc::new(lambda);
        let previous = self.lambdas.write().unwrap().insert(name.to_string(), lambda.clone());
        if let Some(old) = previous {
            old.retire();
        }
        Ok(lambda)
    }

    /// Remove `name`; false when there is no such lambda.
    pub fn delete(&self, name: &str) -> bool {
        match self.lambdas.write().unwrap().remove(name) {
            Some(old) => {
                old.retire();
                true
            }
            None => false,
        }
    }
}
