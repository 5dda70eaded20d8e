//! The audit log's store: every change asked of the control plane (deploys and deletes, tenants, keys,
//! sites, leases made and released, console logins), who asked (the operator, a tenant's key
//! by its id, or a refused credential), and how it was answered, one JSON line each in
//! `DIR/audit.log` (mode 0600), written and synced before the reply leaves
//! ([`crate::audit_routes`] records and serves it). The operator reads everything, a tenant what
//! its keys did and what the operator did to its lambdas and keys. At 16 MiB the file is
//! renamed `audit.log.1` (the one before is dropped).
//!
//! Invocations (`/run`, `/map`, a lease's parts), blobs and lease files are data, not changes
//! of the control plane, and are not recorded.

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use axum::http::Method;
use serde::{Deserialize, Serialize};

use crate::auth::Principal;

/// The log's file in a worker directory.
pub const AUDIT_FILE: &str = "audit.log";
const ROTATE_AT: u64 = 16 << 20;

/// One recorded change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEntry {
    /// RFC 3339, UTC, milliseconds.
    pub time: String,
    /// `operator`, `tenant`, `refused` (a credential the worker turned away) or `anonymous`
    /// (the console's login form).
    pub actor: String,
    /// The acting tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// The key's id (a tenant's key, or the id of a refused one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    pub method: String,
    pub path: String,
    pub status: u16,
    /// The tenant owning the lambda or tenant the change is about, when it is a tenant's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
}

impl AuditEntry {
    /// Whether a tenant may read this entry: what it did, and what the operator did to its own.
    fn concerns(&self, tenant: &str) -> bool {
        self.tenant.as_deref() == Some(tenant) || (self.actor == "operator" && self.owner.as_deref() == Some(tenant))
    }
}

/// The audit log's file.
pub struct AuditLog {
    /// None: not kept (tests).
    path: Option<PathBuf>,
    lock: Mutex<()>,
}

impl AuditLog {
    pub fn open(dir: &Path) -> AuditLog {
        AuditLog { path: Some(dir.join(AUDIT_FILE)), lock: Mutex::new(()) }
    }

    pub fn none() -> AuditLog {
        AuditLog { path: None, lock: Mutex::new(()) }
    }

    /// Append `entry` and sync it; a failure is logged (the change itself was made).
    pub fn append(&self, entry: &AuditEntry) {
        let Some(path) = &self.path else { return };
        let _held = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = append_line(path, entry) {
            tracing::error!(path = %path.display(), ?entry, "the audit log could not be written: {e:#}");
        }
    }

    /// The newest `limit` entries `reader` may see, oldest first.
    pub fn read(&self, reader: &Principal, limit: usize) -> std::io::Result<Vec<AuditEntry>> {
        let Some(path) = &self.path else { return Ok(Vec::new()) };
        let _held = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let mut kept = std::collections::VecDeque::with_capacity(limit.min(1024));
        for file in [path.with_extension("log.1"), path.clone()] {
            let Ok(opened) = fs::File::open(&file) else { continue };
            for line in BufReader::new(opened).lines() {
                let Ok(entry) = serde_json::from_str::<AuditEntry>(&line?) else { continue };
                let visible = match reader {
                    Principal::Operator => true,
                    Principal::Tenant(grant) => entry.concerns(&grant.tenant),
                };
                if visible {
                    if kept.len() == limit {
                        kept.pop_front();
                    }
                    kept.push_back(entry);
                }
            }
        }
        Ok(kept.into())
    }
}

fn append_line(path: &Path, entry: &AuditEntry) -> std::io::Result<()> {
    if fs::metadata(path).is_ok_and(|m| m.len() >= ROTATE_AT) {
        fs::rename(path, path.with_extension("log.1"))?;
    }
    let mut line = serde_json::to_vec(entry)?;
    line.push(b'\n');
    let mut file = fs::OpenOptions::new().append(true).create(true).mode(0o600).open(path)?;
    file.write_all(&line)?;
    file.sync_data()
}

/// Whether a request asks for a change of the control plane.
pub fn is_audited(method: &Method, path: &str) -> bool {
    if method == Method::GET || method == Method::HEAD || method == Method::OPTIONS {
        return false;
    }
    let under = |prefix: &str| path == prefix || path.starts_with(&format!("{prefix}/"));
    let lease_change = path
        .strip_prefix("/leases/")
        .is_some_and(|rest| !rest.is_empty() && !rest.contains('/') && (method == Method::POST || method == Method::DELETE));
    under("/registry") || under("/tenants") || under("/sites") || lease_change || path == "/console/login"
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::tenants::{Grant, Scope};

    fn entry(actor: &str, tenant: Option<&str>, owner: Option<&str>, path: &str) -> AuditEntry {
        AuditEntry {
            time: "t".into(),
            actor: actor.into(),
            tenant: tenant.map(Into::into),
            key: None,
            method: "POST".into(),
            path: path.into(),
            status: 201,
            owner: owner.map(Into::into),
            request_id: None,
        }
    }

    #[test]
    fn changes_are_audited_and_reads_and_invocations_are_not() {
        for (method, path) in [
            (Method::POST, "/registry/echo"),
            (Method::PUT, "/registry/echo"),
            (Method::DELETE, "/registry/echo"),
            (Method::POST, "/tenants"),
            (Method::POST, "/tenants/a/keys"),
            (Method::DELETE, "/tenants/a/keys/k"),
            (Method::PUT, "/sites/example.com"),
            (Method::POST, "/leases/echo"),
            (Method::DELETE, "/leases/l-1"),
            (Method::POST, "/console/login"),
            (Method::PATCH, "/registry"),
        ] {
            assert!(is_audited(&method, path), "{method} {path}");
        }
        for (method, path) in [
            (Method::GET, "/registry/echo"),
            (Method::GET, "/tenants"),
            (Method::POST, "/run/echo"),
            (Method::POST, "/map/echo"),
            (Method::POST, "/leases/l-1/0"),
            (Method::POST, "/leases/l-1/keepalive"),
            (Method::PUT, "/leases/l-1/files/x"),
            (Method::PUT, "/blobs/x"),
            (Method::POST, "/registryx"),
        ] {
            assert!(!is_audited(&method, path), "{method} {path}");
        }
    }

    #[test]
    fn a_tenant_reads_what_it_did_and_what_the_operator_did_to_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let log = AuditLog::open(dir.path());
        log.append(&entry("operator", None, None, "/tenants"));
        log.append(&entry("tenant", Some("a"), Some("a"), "/registry/a-fn"));
        log.append(&entry("tenant", Some("b"), Some("b"), "/registry/b-fn"));
        log.append(&entry("operator", None, Some("a"), "/tenants/a/keys"));
        log.append(&entry("tenant", Some("b"), Some("a"), "/registry/a-fn"));
        log.append(&entry("refused", None, None, "/registry/x"));
        let a = Principal::Tenant(Grant { tenant: "a".into(), key_id: "k".into(), scope: Scope::default() });
        let paths = |p: &Principal, limit| log.read(p, limit).unwrap().into_iter().map(|e| e.path).collect::<Vec<_>>();
        assert_eq!(paths(&a, 100), ["/registry/a-fn", "/tenants/a/keys"]);
        assert_eq!(paths(&Principal::Operator, 100).len(), 6);
        assert_eq!(paths(&Principal::Operator, 2), ["/registry/a-fn", "/registry/x"]);
        let mode = std::os::unix::fs::PermissionsExt::mode(&fs::metadata(dir.path().join(AUDIT_FILE)).unwrap().permissions());
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn the_log_is_rotated_once_and_both_files_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let log = AuditLog::open(dir.path());
        log.append(&entry("operator", None, None, "/old"));
        let file = fs::OpenOptions::new().append(true).open(dir.path().join(AUDIT_FILE)).unwrap();
        file.set_len(ROTATE_AT).unwrap(); // pad past the limit (zero bytes: lines that are not JSON are skipped)
        log.append(&entry("operator", None, None, "/new"));
        assert!(dir.path().join("audit.log.1").exists());
        let paths: Vec<_> = log.read(&Principal::Operator, 10).unwrap().into_iter().map(|e| e.path).collect();
        assert_eq!(paths, ["/old", "/new"]);
    }
}
