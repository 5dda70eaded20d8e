//! The install cache on disk (SOCK section 4.3): every package installed once, into a
//! directory of its own that every sandbox sees read-only at `/packages/<name>==<version>`.
//!
//! ```text
//! <cache>/installed/<name>==<version>/   one package as `pip install --no-deps --target` left
//!                                          it, owned by root, with .sprout-package.json
//! <cache>/installed/.ephemeral/<id>/      a sandbox's own install when the cache is off
//! <cache>/resolved/<sha256>.json          pip's resolution of one requirement set
//! <cache>/staging/<id>/                   installs in progress: never mounted, never used
//! ```
//!
//! A package appears in `installed/` by one rename of a finished directory, so nothing half
//! installed is ever visible; the directory survives restarts, and several workers may share
//! one cache (a rename that loses a race to an identical install is a success).

use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::requirements::normalize;

/// File in each installed package's directory describing it.
pub const META: &str = ".sprout-package.json";

/// Top-level names some packages install that are never worth importing ahead.
const NOT_MODULES: [&str; 6] = ["tests", "test", "docs", "examples", "benchmarks", "bin"];

/// One installed package.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InstalledPackage {
    /// `<normalized name>==<version>`: its directory under installed/.
    pub key: String,
    pub name: String,
    pub version: String,
    /// Importable top-level modules (top_level.txt, else read off the installed files).
    pub top_level: Vec<String>,
    /// `Requires-Dist` lines of its metadata.
    pub requires_dist: Vec<String>,
    /// Bytes on disk: the import cache's measure of what pre-importing it costs.
    pub size_bytes: u64,
    pub files: u64,
    /// Seconds since the Unix epoch.
    pub installed_at: u64,
    /// How long pip took.
    pub install_ms: u64,
}

/// One pinned package of a resolution.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pin {
    pub name: String,
    pub version: String,
    /// Names (normalized) of the packages of the same resolution it depends on.
    pub depends_on: Vec<String>,
}

impl Pin {
    pub fn key(&self) -> String {
        key(&self.name, &self.version)
    }
}

pub fn key(name: &str, version: &str) -> String {
    format!("{}=={version}", normalize(name))
}

pub struct InstallCache {
    root: PathBuf,
    next: AtomicU64,
}

impl InstallCache {
    /// Open (or create) the cache at `root`, removing installs a crash interrupted.
    pub fn open(root: &Path) -> io::Result<InstallCache> {
        for sub in ["installed", "resolved", "staging", "installed/.ephemeral"] {
            fs::create_dir_all(root.join(sub))?;
        }
        let cache = InstallCache { root: root.to_path_buf(), next: AtomicU64::new(0) };
        Ok(cache)
    }

    /// Remove leftovers of this process's earlier runs (staging and ephemeral installs). Only
    /// a worker that owns the cache alone may do this; entries of other live processes are
    /// recognized by the pid in their names and kept.
    pub fn sweep(&self) {
        for dir in [self.root.join("staging"), self.installed_dir().join(".ephemeral")] {
            let Ok(entries) = fs::read_dir(&dir) else {
                continue;
            };
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let pid: Option<i32> = name.split('-').next().and_then(|p| p.parse().ok());
                // SAFETY: kill with signal 0 only checks that process `p` exists; it takes integers and
                // touches no memory of ours.
                let alive = pid.map(|p| p != std::process::id() as i32 && unsafe { libc::kill(p, 0) } == 0).unwrap_or(false);
                if !alive {
                    let _ = fs::remove_dir_all(e.path());
                }
            }
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The directory mounted at /packages in every sandbox.
    pub fn installed_dir(&self) -> PathBuf {
        self.root.join("installed")
    }

    /// The installed package `key`, if it is in the cache.
    pub fn get(&self, key: &str) -> Option<InstalledPackage> {
        let meta = fs::read(self.installed_dir().join(key).join(META)).ok()?;
        serde_json::from_slice(&meta).ok()
    }

    /// Every installed package, by key.
    pub fn list(&self) -> Vec<InstalledPackage> {
        let mut out: Vec<InstalledPackage> = fs::read_dir(self.installed_dir())
            .map(|entries| entries.flatten().filter_map(|e| self.get(&e.file_name().to_string_lossy())).collect())
            .unwrap_or_default();
        out.sort_by(|a, b| a.key.cmp(&b.key));
        out
    }

    /// A fresh directory for an install in progress, writable by `uid:gid` (pip runs as them).
    pub fn staging(&self, uid: u32, gid: u32) -> io::Result<Staging> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let dir = self.root.join("staging").join(format!("{}-{n}", std::process::id()));
        if dir.exists() {
            fs::remove_dir_all(&dir)?;
        }
        fs::create_dir_all(dir.join("files"))?;
        fs::create_dir_all(dir.join("tmp"))?;
        for d in [dir.clone(), dir.join("files"), dir.join("tmp")] {
            std::os::unix::fs::chown(&d, Some(uid), Some(gid))?;
        }
        Ok(Staging { dir })
    }

    /// Publish a finished install: hand the files to root (the sandbox user must not own
    /// them), describe it, and rename it into installed/ in one step.
    pub fn publish(&self, staging: &Staging, meta: &InstalledPackage) -> io::Result<()> {
        let files = staging.files();
        chown_tree(&files)?;
        fs::write(files.join(META), serde_json::to_vec_pretty(meta)?)?;
        let target = self.installed_dir().join(&meta.key);
        match fs::rename(&files, &target) {
            Ok(()) => Ok(()),
            // Someone installed the same package meanwhile: theirs serves as well as ours.
            Err(e) if target.join(META).exists() => {
                tracing::debug!("{} was installed concurrently ({e})", meta.key);
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Move a finished per-sandbox install (cache off) to where sandboxes can see it;
    /// returns its directory and its path inside a sandbox.
    pub fn publish_ephemeral(&self, staging: &Staging) -> io::Result<(PathBuf, String)> {
        let files = staging.files();
        chown_tree(&files)?;
        let name = staging.dir.file_name().unwrap().to_string_lossy().into_owned();
        let target = self.installed_dir().join(".ephemeral").join(&name);
        fs::rename(&files, &target)?;
        Ok((target, format!("/packages/.ephemeral/{name}")))
    }

    pub fn resolution(&self, digest: &str) -> Option<Vec<Pin>> {
        let data = fs::read(self.root.join("resolved").join(format!("{digest}.json"))).ok()?;
        serde_json::from_slice(&data).ok()
    }

    pub fn save_resolution(&self, digest: &str, pins: &[Pin]) -> io::Result<()> {
        let path = self.root.join("resolved").join(format!("{digest}.json"));
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        fs::write(&tmp, serde_json::to_vec_pretty(pins)?)?;
        fs::rename(tmp, path)
    }
}

/// An install in progress; removed when dropped (after a publish, only its leftovers).
pub struct Staging {
    pub dir: PathBuf,
}

impl Staging {
    /// Where pip installs to (`--target`).
    pub fn files(&self) -> PathBuf {
        self.dir.join("files")
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

fn chown_tree(dir: &Path) -> io::Result<()> {
    std::os::unix::fs::lchown(dir, Some(0), Some(0))?;
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            chown_tree(&path)?;
        } else {
            std::os::unix::fs::lchown(&path, Some(0), Some(0))?;
        }
    }
    Ok(())
}

/// Bytes and files under `dir`.
pub fn disk_usage(dir: &Path) -> (u64, u64) {
    let mut bytes = 0;
    let mut files = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let Ok(meta) = e.metadata() else { continue };
            if meta.is_dir() {
                stack.push(e.path());
            } else {
                bytes += meta.blocks() * 512;
                files += 1;
            }
        }
    }
    (bytes, files)
}

/// Describe what `pip install --no-deps --target files` left in `files`.
pub fn describe(files: &Path, install_ms: u64) -> io::Result<InstalledPackage> {
    let dist_info = fs::read_dir(files)?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().map(|x| x == "dist-info").unwrap_or(false))
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "pip installed no .dist-info directory"))?;
    let metadata = fs::read_to_string(dist_info.join("METADATA"))?;
    let field =
        |name: &str| metadata.lines().take_while(|l| !l.is_empty()).find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_string()));
    let name = field("Name:").ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "METADATA has no Name"))?;
    let version = field("Version:").ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "METADATA has no Version"))?;
    let requires_dist = metadata
        .lines()
        .take_while(|l| !l.is_empty())
        .filter_map(|l| l.strip_prefix("Requires-Dist:").map(|v| v.trim().to_string()))
        .collect();
    let top_level = top_level_modules(files, &dist_info);
    let (size_bytes, file_count) = disk_usage(files);
    Ok(InstalledPackage {
        key: key(&name, &version),
        name,
        version,
        top_level,
        requires_dist,
        size_bytes,
        files: file_count,
        installed_at: SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
        install_ms,
    })
}

fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().map(|c| c.is_ascii_alphabetic() || c == '_').unwrap_or(false) && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Importable top-level modules: `top_level.txt` when the package has one, else the modules
/// and packages found at the top of its install.
fn top_level_modules(files: &Path, dist_info: &Path) -> Vec<String> {
    let mut names: Vec<String> = match fs::read_to_string(dist_info.join("top_level.txt")) {
        Ok(text) => text.lines().map(|l| l.trim().replace('/', ".")).filter(|l| !l.is_empty()).collect(),
        Err(_) => fs::read_dir(files)
            .map(|entries| {
                entries
                    .flatten()
                    .filter_map(|e| {
                        let name = e.file_name().to_string_lossy().into_owned();
                        let path = e.path();
                        if path.is_dir() {
                            let package = path.join("__init__.py").exists();
                            package.then_some(name)
                        } else if let Some(stem) = name.strip_suffix(".py") {
                            Some(stem.to_string())
                        } else if name.ends_with(".so") {
                            name.split('.').next().map(str::to_string)
                        } else {
                            None
                        }
                    })
                    .collect()
            })
            .unwrap_or_default(),
    };
    names.retain(|n| n.split('.').all(is_identifier) && !NOT_MODULES.contains(&n.as_str()));
    names.sort();
    names.dedup();
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_install(dir: &Path, top_level: Option<&str>) {
        let di = dir.join("Demo_Pkg-1.0.dist-info");
        fs::create_dir_all(&di).unwrap();
        fs::write(di.join("METADATA"), "Metadata-Version: 2.1\nName: Demo_Pkg\nVersion: 1.0\nRequires-Dist: six>=1.0\nRequires-Dist: extra-thing ; extra == \"x\"\n\nLong description\nRequires-Dist: not-a-header\n").unwrap();
        if let Some(t) = top_level {
            fs::write(di.join("top_level.txt"), t).unwrap();
        }
        fs::create_dir_all(dir.join("demo_pkg")).unwrap();
        fs::write(dir.join("demo_pkg/__init__.py"), "x = 1\n").unwrap();
        fs::write(dir.join("helper_mod.py"), "").unwrap();
        fs::create_dir_all(dir.join("tests")).unwrap();
        fs::write(dir.join("tests/__init__.py"), "").unwrap();
        fs::create_dir_all(dir.join("demo_pkg.libs")).unwrap();
        fs::write(dir.join("_speedups.cpython-311-x86_64-linux-gnu.so"), "").unwrap();
    }

    #[test]
    fn metadata_and_modules_are_read_off_an_install() {
        let tmp = tempfile::tempdir().unwrap();
        fake_install(tmp.path(), None);
        let p = describe(tmp.path(), 5).unwrap();
        assert_eq!(p.key, "demo-pkg==1.0");
        assert_eq!(p.requires_dist, vec!["six>=1.0", "extra-thing ; extra == \"x\""]);
        assert_eq!(p.top_level, vec!["_speedups", "demo_pkg", "helper_mod"]);
        assert!(p.size_bytes > 0 && p.files >= 4);
    }

    #[test]
    fn top_level_txt_wins_when_present() {
        let tmp = tempfile::tempdir().unwrap();
        fake_install(tmp.path(), Some("demo_pkg\ntests\n"));
        assert_eq!(describe(tmp.path(), 0).unwrap().top_level, vec!["demo_pkg"]);
    }

    #[test]
    fn publishing_is_one_rename_and_a_lost_race_is_fine() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = InstallCache::open(tmp.path()).unwrap();
        for _ in 0..2 {
            let staging = cache.staging(0, 0).unwrap();
            fake_install(&staging.files(), None);
            let meta = describe(&staging.files(), 1).unwrap();
            cache.publish(&staging, &meta).unwrap();
        }
        let got = cache.get("demo-pkg==1.0").unwrap();
        assert_eq!(got.version, "1.0");
        assert_eq!(cache.list().len(), 1);
        assert_eq!(fs::read_dir(tmp.path().join("staging")).unwrap().count(), 0, "staging left behind");
    }
}
