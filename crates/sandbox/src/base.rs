//! The sandbox base image: a Debian minbase root file system with python3, built once with
//! debootstrap and shared read-only by every sandbox of every worker on the machine.
//!
//! [`ensure`] reuses a finished image (a second `sprout worker init` takes milliseconds) and
//! otherwise builds one into a temporary directory, adapts it (mount points for the
//! sandbox's code, scratch, packages and runtime; /tmp pointing into the scratch), and
//! renames it into place, so a half-built image is never used. A lock file serializes
//! concurrent builds of the same image.

use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::mounts;
use crate::stage::BASE_MOUNT_POINTS;

/// Where the machine-wide image lives unless `[base] path` says otherwise.
pub const DEFAULT_PATH: &str = "/var/lib/sprout/base-bookworm";

/// The Debian suite it is built from unless `[base] suite` says otherwise.
pub const DEFAULT_SUITE: &str = "bookworm";

/// File in a finished image recording what it is.
pub const MARKER: &str = ".sprout-base";

/// Debian packages debootstrap adds to minbase: the interpreter, and pip, which installs
/// lambdas' packages inside installer sandboxes (lambdas themselves run with -I -S and never
/// see Debian's dist-packages).
pub const INCLUDE: &str = "python3,python3-pip";

/// What the marker of an image this version can use says about its layout.
fn layout_line() -> String {
    format!("include={INCLUDE} mounts={}", BASE_MOUNT_POINTS.join(","))
}

/// What [`ensure`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Reused,
    Built(Duration),
}

/// Whether `path` holds a finished base image of `suite` with this version's layout.
pub fn is_ready(path: &Path, suite: &str) -> bool {
    fs::read_to_string(path.join(MARKER))
        .map(|m| m.lines().any(|l| l == format!("suite={suite}")) && m.lines().any(|l| l == layout_line()))
        .unwrap_or(false)
}

/// The mirror the host's own apt uses for `suite` (deb822 .sources files or sources.list).
pub fn host_mirror(suite: &str) -> Option<String> {
    let mut candidates = Vec::new();
    if let Ok(entries) = fs::read_dir("/etc/apt/sources.list.d") {
        for e in entries.flatten() {
            if e.path().extension().map(|x| x == "sources").unwrap_or(false) {
                candidates.push(fs::read_to_string(e.path()).unwrap_or_default());
            }
        }
    }
    for stanza in candidates.iter().flat_map(|f| f.split("\n\n")) {
        let field = |name: &str| stanza.lines().find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_string()));
        let suites = field("Suites:").unwrap_or_default();
        let types = field("Types:").unwrap_or_default();
        if types.split_whitespace().any(|t| t == "deb") && suites.split_whitespace().any(|s| s == suite) {
            if let Some(uri) = field("URIs:").and_then(|u| u.split_whitespace().next().map(str::to_string)) {
                return Some(uri);
            }
        }
    }
    let list = fs::read_to_string("/etc/apt/sources.list").unwrap_or_default();
    list.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|w| w.len() >= 3 && w[0] == "deb" && w.contains(&suite))
        .and_then(|w| w.iter().find(|x| x.contains("://")).map(|x| x.to_string()))
}

/// Make sure a base image of `suite` exists at `path`, building it if needed. `progress`
/// receives one line per step of the build.
pub fn ensure(path: &Path, suite: &str, mirror: Option<&str>, progress: &mut dyn FnMut(&str)) -> Result<Outcome> {
    if is_ready(path, suite) {
        return Ok(Outcome::Reused);
    }
    let parent = path.parent().context("base image path has no parent directory")?;
    fs::create_dir_all(parent)?;
    let lock_file = fs::File::create(path.with_extension("lock"))?;
    let _lock = nix::fcntl::Flock::lock(lock_file, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| anyhow::anyhow!("locking the base image: {e}"))?;
    if is_ready(path, suite) {
        return Ok(Outcome::Reused); // built by someone else while we waited
    }
    if path.join(MARKER).exists() {
        bail!(
            "{} was built by another version of Sprout (its layout differs: this one needs {}); \
             remove it while no worker uses it, and run init again",
            path.display(),
            layout_line()
        );
    }
    if path.exists() {
        bail!("{} exists but is not a finished {suite} base image; remove it and run init again", path.display());
    }
    let mirror = match mirror {
        Some(m) if !m.is_empty() => m.to_string(),
        _ => host_mirror(suite).with_context(|| format!("no apt source for {suite} on this host; set base.mirror in config.toml"))?,
    };
    let started = Instant::now();
    let building = path.with_extension("building");
    discard(&building)?;
    progress(&format!("building the {suite} base image with debootstrap from {mirror} (about a minute)"));
    let result = debootstrap(&building, suite, &mirror, progress).and_then(|_| adapt(&building, suite));
    if let Err(e) = result {
        let _ = discard(&building);
        return Err(e);
    }
    fs::rename(&building, path)?;
    Ok(Outcome::Built(started.elapsed()))
}

/// Remove a (possibly failed) build, unmounting what debootstrap mounted inside it first.
fn discard(dir: &Path) -> Result<()> {
    if dir.exists() {
        mounts::detach_all_under(dir)?;
        fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    Ok(())
}

fn debootstrap(target: &Path, suite: &str, mirror: &str, progress: &mut dyn FnMut(&str)) -> Result<()> {
    let mut child = Command::new("debootstrap")
        .args(["--variant=minbase", &format!("--include={INCLUDE}"), suite])
        .arg(target)
        .arg(mirror)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => {
                anyhow::anyhow!("debootstrap is not installed (apt-get install debootstrap, or run scripts/setup.sh)")
            }
            _ => anyhow::anyhow!("starting debootstrap: {e}"),
        })?;
    let stderr = child.stderr.take().unwrap();
    let errors = std::thread::spawn(move || BufReader::new(stderr).lines().map_while(Result::ok).collect::<Vec<_>>().join("\n"));
    let mut steps = 0;
    for line in BufReader::new(child.stdout.take().unwrap()).lines().map_while(Result::ok) {
        if let Some(step) = line.strip_prefix("I: ") {
            steps += 1;
            progress(&format!("  [{steps:>3}] {step}"));
        }
    }
    let status = child.wait()?;
    let errors = errors.join().unwrap_or_default();
    if !status.success() {
        let log = target.join("debootstrap/debootstrap.log");
        let tail: String = fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .rev()
            .take(15)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n");
        bail!("debootstrap failed ({status}):\n{errors}\n{tail}");
    }
    Ok(())
}

/// Turn a fresh debootstrap root into a Sprout base image.
fn adapt(root: &Path, suite: &str) -> Result<()> {
    if !root.join("usr/bin/python3").exists() {
        bail!("the built image has no /usr/bin/python3");
    }
    for point in BASE_MOUNT_POINTS {
        fs::create_dir_all(root.join(point))?;
    }
    // /tmp lives in each sandbox's writable scratch.
    let tmp = root.join("tmp");
    if tmp.is_dir() {
        fs::remove_dir_all(&tmp)?;
    }
    symlink("host/tmp", &tmp)?;
    for cache in ["var/cache/apt/archives", "var/lib/apt/lists"] {
        if let Ok(entries) = fs::read_dir(root.join(cache)) {
            for e in entries.flatten() {
                if e.file_type().map(|t| t.is_file()).unwrap_or(false) {
                    let _ = fs::remove_file(e.path());
                }
            }
        }
    }
    let python = Command::new("chroot")
        .arg(root)
        .args(["/usr/bin/python3", "-I", "-S", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"])
        .output()?;
    let version = String::from_utf8_lossy(&python.stdout).trim().to_string();
    if !python.status.success() {
        bail!("python3 does not run in the built image: {}", String::from_utf8_lossy(&python.stderr));
    }
    let pip = Command::new("chroot").arg(root).args(["/usr/bin/python3", "-m", "pip", "--version"]).output()?;
    if !pip.status.success() {
        bail!("pip does not run in the built image: {}", String::from_utf8_lossy(&pip.stderr));
    }
    let marker = format!("suite={suite}\n{}\npython={version}\nbuilt_by=sprout {}\n", layout_line(), env!("CARGO_PKG_VERSION"));
    fs::write(root.join(MARKER), marker)?;
    Ok(())
}

/// The python version recorded in a finished image, e.g. "3.11".
pub fn python_version(path: &Path) -> Option<String> {
    fs::read_to_string(path.join(MARKER)).ok()?.lines().find_map(|l| l.strip_prefix("python=").map(str::to_string))
}

/// Where the machine-wide base image of `suite` lives by default.
pub fn default_path(suite: &str) -> PathBuf {
    PathBuf::from(format!("/var/lib/sprout/base-{suite}"))
}
