//! What a tenant's blobs and leases' files hold against its `files_mb` quota, and the limit
//! of its next upload.
//!
//! A tenant's stored bytes are measured when it uploads (its blobs' ([`crate::blob_owners`]),
//! and every file in the directories of the leases of its lambdas, which their sandboxes may
//! also write), not counted along the way, so nothing drifts; two uploads at once may each
//! pass the check, overshooting by at most one upload (`limits.max_upload_mb`).

use std::path::{Path, PathBuf};

use sprout_engine::ErrorCode;

use crate::http::ApiError;
use crate::quotas::Refused;
use crate::state::Api;

/// How much an upload may write, and the error past it.
pub struct UploadLimit {
    pub bytes: usize,
    /// The quota that set `bytes`, when one did (not `limits.max_upload_mb`).
    quota: Option<(String, Refused)>,
}

impl UploadLimit {
    /// The error for an upload past this limit.
    pub fn exceeded(&self) -> ApiError {
        match &self.quota {
            Some((tenant, refused)) => refused.error(ErrorCode::FilesQuotaExceeded, tenant),
            None => ApiError::new(
                ErrorCode::PayloadTooLarge,
                format!("the request body exceeds the limit of {} bytes (limits.max_upload_mb)", self.bytes),
            ),
        }
    }

    /// An upload that failed with `error`: counted against `api.usage` when this limit's
    /// quota refused it.
    pub fn count(&self, api: &Api, error: &ApiError) {
        if let (Some((tenant, refused)), ErrorCode::FilesQuotaExceeded) = (&self.quota, error.0.code) {
            api.usage.count_refusal(tenant, refused.quota);
        }
    }
}

/// The limit of an upload of `tenant` (None: the operator's, or an owner-less lambda's) that
/// replaces `replacing` (the file it would take the place of): `limits.max_upload_mb`, or
/// less when the tenant's `files_mb` quota leaves less room; Err when none is left.
pub async fn upload_limit(api: &Api, tenant: Option<&str>, replacing: PathBuf) -> Result<UploadLimit, ApiError> {
    let max = UploadLimit { bytes: api.max_upload, quota: None };
    let Some(tenant) = tenant else { return Ok(max) };
    let Some(limit_mb) = api.auth.tenants.quotas(tenant).ok().and_then(|q| q.files_mb) else { return Ok(max) };
    let paths = stored_paths(api, tenant);
    let stored = tokio::task::spawn_blocking(move || bytes_under(&paths).saturating_sub(file_size(&replacing)))
        .await
        .map_err(|e| ApiError::new(ErrorCode::Internal, format!("measuring stored files: {e}")))?;
    let room = (limit_mb << 20).saturating_sub(stored);
    if room >= api.max_upload as u64 {
        return Ok(max);
    }
    let limit =
        UploadLimit { bytes: room as usize, quota: Some((tenant.to_string(), Refused { quota: "files_mb", limit: limit_mb as f64 })) };
    if room == 0 {
        let error = limit.exceeded();
        limit.count(api, &error);
        return Err(error);
    }
    Ok(limit)
}

/// The bytes `tenant`'s blobs and leases' files hold now.
pub async fn stored_bytes(api: &Api, tenant: &str) -> u64 {
    let paths = stored_paths(api, tenant);
    tokio::task::spawn_blocking(move || bytes_under(&paths)).await.unwrap_or(0)
}

/// What `tenant` stores: its blobs and its leases' directories.
fn stored_paths(api: &Api, tenant: &str) -> Vec<PathBuf> {
    let blobs = api.blob_owners.of(tenant).into_iter().map(|name| api.blobs.files.path().join(name));
    let leases = api.leases.dirs(|lambda| api.auth.tenants.owner(lambda).as_deref() == Some(tenant));
    blobs.chain(leases.iter().map(|dir| dir.files.path().to_path_buf())).collect()
}

fn file_size(path: &Path) -> u64 {
    std::fs::symlink_metadata(path).ok().filter(|m| m.is_file()).map_or(0, |m| m.len())
}

/// The bytes of every file at or under `paths` (symbolic links not followed).
fn bytes_under(paths: &[PathBuf]) -> u64 {
    let mut total = 0;
    let mut todo: Vec<PathBuf> = paths.to_vec();
    while let Some(path) = todo.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&path) else { continue };
        if meta.is_file() {
            total += meta.len();
        } else if meta.is_dir() {
            todo.extend(std::fs::read_dir(&path).into_iter().flatten().flatten().map(|e| e.path()));
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_under_counts_files_in_nested_directories_and_not_links() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a"), [0u8; 100]).unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/b"), [0u8; 50]).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", dir.path().join("link")).unwrap();
        let one = dir.path().join("a");
        assert_eq!(bytes_under(&[dir.path().to_path_buf()]), 150);
        assert_eq!(bytes_under(&[one.clone(), dir.path().join("missing")]), 100);
        assert_eq!(file_size(&one), 100);
        assert_eq!(file_size(dir.path()), 0);
    }
}
