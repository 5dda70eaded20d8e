//! `sandbox.volumes`: host directories every sandbox sees at a path of its own, read-only
//! unless `writable`; and their checks.

use std::path::PathBuf;

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

/// A host directory every sandbox sees at `path`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VolumeSection {
    pub host: PathBuf,
    pub path: String,
    #[serde(default)]
    pub writable: bool,
}

/// Where a sandbox's own mounts, the runtime and the packages live (and /tmp, a link into
/// /host): no volume may cover them or lie within them; nor the paths of the volumes the
/// worker binds for itself (its features': the leases' files, the blobs).
const RESERVED: [&str; 9] = ["/proc", "/sys", "/dev", "/host", "/handler", "/opt/sprout", "/packages", "/wheels", "/tmp"];

impl VolumeSection {
    /// The volume as the sandbox engine takes it.
    pub fn to_volume(&self) -> sprout_sandbox::stage::Volume {
        sprout_sandbox::stage::Volume { host: self.host.clone(), path: self.path.clone(), writable: self.writable }
    }
}

/// Check the configured volumes; `reserved`: the paths of the worker's own volumes.
pub fn validate(volumes: &[VolumeSection], reserved: &[&str]) -> Result<()> {
    for (i, volume) in volumes.iter().enumerate() {
        let key = format!("sandbox.volumes[{i}]");
        let path = volume.path.as_str();
        if !is_plain_absolute(path) {
            bail!("{key}.path = {path:?} must be an absolute path like \"/srv/files\", without '.', '..', '//' or a trailing '/'");
        }
        if path == "/" {
            bail!("{key}.path must not be \"/\"");
        }
        if let Some(reserved) = RESERVED.iter().chain(reserved).find(|r| overlaps(path, r)) {
            bail!("{key}.path = {path:?} overlaps {reserved}, which every sandbox needs for itself");
        }
        for (j, earlier) in volumes[..i].iter().enumerate() {
            if overlaps(path, &earlier.path) {
                bail!("{key}.path = {path:?} overlaps sandbox.volumes[{j}].path = {:?}", earlier.path);
            }
        }
        let host = &volume.host;
        if !host.is_absolute() {
            bail!("{key}.host = {:?} must be an absolute path", host.display());
        }
        match std::fs::metadata(host) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => bail!("{key}.host = {:?} is not a directory", host.display()),
            Err(e) => bail!("{key}.host = {:?}: {e}", host.display()),
        }
    }
    Ok(())
}

/// `/a/b`: absolute, no empty, `.` or `..` segments, no trailing '/', no control characters.
fn is_plain_absolute(path: &str) -> bool {
    if path == "/" {
        return true;
    }
    let Some(rest) = path.strip_prefix('/') else {
        return false;
    };
    !path.chars().any(char::is_control) && rest.split('/').all(|s| !s.is_empty() && s != "." && s != "..")
}

/// Whether one path equals the other or lies under it.
fn overlaps(a: &str, b: &str) -> bool {
    let under = |x: &str, y: &str| x == y || x.strip_prefix(y).is_some_and(|rest| rest.starts_with('/'));
    under(a, b) || under(b, a)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn volume(host: &str, path: &str) -> VolumeSection {
        VolumeSection { host: PathBuf::from(host), path: path.into(), writable: false }
    }

    fn error(volumes: &[VolumeSection]) -> String {
        format!("{:#}", validate(volumes, &["/leases"]).unwrap_err())
    }

    #[test]
    fn good_volumes_pass() {
        assert!(validate(&[volume("/tmp", "/srv/files"), volume("/tmp", "/var/lib/olio")], &[]).is_ok());
        assert!(validate(&[volume("/tmp", "/optional")], &[]).is_ok()); // a prefix of /opt's name, not of the path
    }

    #[test]
    fn errors_name_the_key() {
        for bad in ["srv", "/srv/", "/srv//x", "/srv/../etc", "/./srv", ""] {
            let e = error(&[volume("/tmp", bad)]);
            assert!(e.contains("sandbox.volumes[0].path"), "{bad}: {e}");
        }
        assert!(error(&[volume("/tmp", "/")]).contains("must not be \"/\""));
        for reserved in
            ["/proc", "/proc/x", "/sys", "/dev/shm", "/host", "/handler", "/opt", "/opt/sprout/x", "/packages", "/tmp/x", "/leases/a"]
        {
            let e = error(&[volume("/tmp", reserved)]);
            assert!(e.contains("sandbox.volumes[0].path") && e.contains("overlaps"), "{reserved}: {e}");
        }
        let e = error(&[volume("/tmp", "/srv"), volume("/tmp", "/srv")]);
        assert!(e.contains("sandbox.volumes[1].path") && e.contains("sandbox.volumes[0].path"), "{e}");
        assert!(error(&[volume("/tmp", "/srv"), volume("/tmp", "/srv/x")]).contains("sandbox.volumes[1]"));
        assert!(error(&[volume("tmp", "/srv")]).contains("sandbox.volumes[0].host"));
        let e = error(&[volume("/no/such/dir", "/srv")]);
        assert!(e.contains("sandbox.volumes[0].host") && e.contains("No such file"), "{e}");
        assert!(error(&[volume("/etc/hostname", "/srv")]).contains("not a directory"));
    }
}
