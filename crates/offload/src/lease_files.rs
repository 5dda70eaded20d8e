//! The leases' shared directories: `<worker dir>/leases/<id>`, seen by every sandbox as
//! `/leases/<id>`, made with a lease and removed with it, for its parts to share files (a
//! `sprout.elastic.Matrix`'s tiles), which a client reads and writes through the routes.
//!
//! `<worker dir>/leases` is root's, mode 0711: a sandbox reaches a lease's directory only by
//! its id (32 random hex digits), handed to the lease's parts in their events. The
//! directory itself is the sandboxes' user's, mode 0700. A file a part writes is charged to
//! that part (page cache and disk); a client's upload (`PUT`) is the worker's.

use std::fs;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::shared_files::{fresh_dir, SharedDir};

/// Where every sandbox sees the leases' directories.
pub const IN_SANDBOX: &str = "/leases";

/// The directory of every lease's directory, and who owns them.
pub struct LeaseFiles {
    host: PathBuf,
    uid: u32,
    gid: u32,
}

impl LeaseFiles {
    /// `<worker_dir>/leases`, emptied of what a worker that stopped without cleaning up left.
    pub fn prepare(worker_dir: &Path, uid: u32, gid: u32) -> Result<LeaseFiles> {
        let host = worker_dir.join("leases");
        fresh_dir(&host, 0o711).with_context(|| format!("making {} afresh", host.display()))?;
        Ok(LeaseFiles { host, uid, gid })
    }

    /// The volume sandboxes see the leases' directories through.
    pub fn volume(&self) -> sprout_sandbox::stage::Volume {
        sprout_sandbox::stage::Volume { host: self.host.clone(), path: IN_SANDBOX.into(), writable: true }
    }

    /// Make lease `id`'s directory; it goes when the returned value is dropped.
    pub fn make(&self, id: &str) -> io::Result<LeaseDir> {
        let path = self.host.join(id);
        fs::DirBuilder::new().mode(0o700).create(&path)?;
        let dir = LeaseDir { files: SharedDir::new(path, (self.uid, self.gid)), in_sandbox: format!("{IN_SANDBOX}/{id}") };
        nix::unistd::chown(dir.files.path(), Some(self.uid.into()), Some(self.gid.into()))?;
        Ok(dir)
    }
}

impl Drop for LeaseFiles {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.host); // the worker stops: what its leases left goes
    }
}

/// One lease's directory, removed (with what its parts left there) when dropped.
pub struct LeaseDir {
    pub files: SharedDir,
    in_sandbox: String,
}

impl LeaseDir {
    /// Where the lease's parts see it.
    pub fn in_sandbox(&self) -> &str {
        &self.in_sandbox
    }
}

impl Drop for LeaseDir {
    fn drop(&mut self) {
        if let Err(e) = fs::remove_dir_all(self.files.path()) {
            tracing::warn!(dir = %self.files.path().display(), "removing a lease's directory: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_dir_is_made_for_the_sandboxes_user_and_removed_with_its_files() {
        let root = tempfile::tempdir().unwrap();
        let (uid, gid) = (nix::unistd::getuid().as_raw(), nix::unistd::getgid().as_raw());
        let leases = LeaseFiles::prepare(root.path(), uid, gid).unwrap();
        let dir = leases.make("abc").unwrap();
        assert_eq!(dir.in_sandbox(), "/leases/abc");
        dir.files.write("t.npy", b"tile").unwrap();
        let path = root.path().join("leases/abc");
        assert!(path.join("t.npy").exists());
        drop(dir);
        assert!(!path.exists());
        let again = LeaseFiles::prepare(root.path(), uid, gid).unwrap();
        assert!(fs::read_dir(&again.host).unwrap().next().is_none(), "a new worker starts with no leases' files");
    }
}
