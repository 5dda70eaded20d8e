//! A container sandbox's scratch directory (bound at /host: its writable space and the
//! socket the worker listens on), made and removed the same way by both container baselines (runc here, docker in
//! sprout-docker).

use std::path::Path;

/// Make a sandbox's scratch directory with its `tmp`, owned by the sandbox user: the base's
/// /tmp is a symlink to host/tmp.
pub fn make_scratch(dir: &Path, uid: u32, gid: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir.join("tmp"))?;
    [dir.to_path_buf(), dir.join("tmp")].iter().try_for_each(|d| {
        std::os::unix::fs::chown(d, Some(uid), Some(gid))?;
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755))
    })
}

/// Remove a directory tree, saying so only when that fails for another reason than absence.
pub async fn remove_dir(dir: &Path) {
    match tokio::fs::remove_dir_all(dir).await {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            tracing::warn!("removing {}: {e}", dir.display())
        }
        _ => {}
    }
}
