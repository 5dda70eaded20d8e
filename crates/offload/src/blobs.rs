//! The blob store: items and results of a map too large for a request body or a channel
//! frame (docs/offload.md), as files of `<worker dir>/blobs`, which every sandbox sees as
//! `/blobs`, and clients reach through `PUT`, `GET` and `DELETE /blobs/<name>` (the HTTP
//! edge's).
//!
//! The directory is root's, mode 1733: a sandbox may create a blob (a result) but not list
//! the others, reaches one only by the name handed to it (the SDK names them with 128 random
//! bits), and cannot remove or replace a blob it does not own (a client's are root's). Every
//! blob goes [`TTL`] after it was last written; all go when the worker stops or starts.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};

use crate::shared_files::{fresh_dir, SharedDir};

/// Where every sandbox sees the blobs.
pub const IN_SANDBOX: &str = "/blobs";
/// How long a blob is kept after it was last written.
pub const TTL: Duration = Duration::from_secs(15 * 60);
/// How often blobs past their time are looked for.
const SWEEP: Duration = Duration::from_secs(30);

/// The worker's blob store.
pub struct Blobs {
    pub files: SharedDir,
}

impl Blobs {
    /// `<worker_dir>/blobs`, made afresh.
    pub fn prepare(worker_dir: &Path) -> Result<Blobs> {
        let host = worker_dir.join("blobs");
        fresh_dir(&host, 0o1733).with_context(|| format!("making {} afresh", host.display()))?;
        Ok(Blobs { files: SharedDir::new(host, (0, 0)) })
    }

    /// The volume sandboxes see the blobs through.
    pub fn volume(&self) -> sprout_sandbox::stage::Volume {
        sprout_sandbox::stage::Volume { host: self.files.path().to_path_buf(), path: IN_SANDBOX.into(), writable: true }
    }

    /// Remove the blobs last written before `now - TTL` every [`SWEEP`], while `self` lives.
    pub fn sweep_in_background(self: &Arc<Blobs>) {
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(SWEEP);
            loop {
                tick.tick().await;
                let Some(blobs) = weak.upgrade() else { return };
                let dir = blobs.files.path().to_path_buf();
                let _ = tokio::task::spawn_blocking(move || expired(&dir, SystemTime::now() - TTL).into_iter().for_each(remove)).await;
            }
        });
    }
}

impl Drop for Blobs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(self.files.path()); // the worker stops: its blobs go
    }
}

/// The files of `dir` last written before `before`.
pub fn expired(dir: &Path, before: SystemTime) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    entries.flatten().filter(|e| e.metadata().ok().and_then(|m| m.modified().ok()).is_some_and(|t| t < before)).map(|e| e.path()).collect()
}

fn remove(path: PathBuf) {
    if let Err(e) = std::fs::remove_file(&path) {
        tracing::warn!(blob = %path.display(), "removing a blob past its time: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blobs_past_their_time_are_found() {
        let root = tempfile::tempdir().unwrap();
        std::fs::write(root.path().join("old"), b"x").unwrap();
        let now = SystemTime::now();
        std::fs::write(root.path().join("new"), b"y").unwrap();
        let old = std::fs::File::options().write(true).open(root.path().join("old")).unwrap();
        old.set_modified(now - TTL - Duration::from_secs(1)).unwrap();
        assert_eq!(expired(root.path(), now - TTL), [root.path().join("old")]);
        assert!(expired(&root.path().join("missing"), now).is_empty());
    }
}
