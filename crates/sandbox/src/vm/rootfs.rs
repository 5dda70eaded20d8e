//! The microVMs' root disk: an ext4 image of the sandbox base image plus the guest's init
//! (`crates/vmm/guest/init.c`, compiled static) and Sprout's in-sandbox runtime, made with
//! `mkfs.ext4 -d` (e2fsprogs) and cached under a key of everything in it, so a changed base,
//! init or runtime makes a new image and an unchanged one is reused.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use sha2::{Digest, Sha256};

use super::run;

/// The guest's PID 1, compiled in so the binary and its disk agree.
pub const INIT_SOURCE: &str = include_str!("../../../vmm/guest/init.c");

/// Where init lives in the guest.
pub const INIT_PATH: &str = "/sbin/sprout-init";

/// What [`ensure`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Reused,
    Built(Duration),
}

/// Everything that goes into the image, for its key: the base's marker (its suite, layout
/// and build), init's source, and the runtime's files.
fn key(base: &Path, runtime: Option<&Path>) -> Result<String> {
    let mut hash = Sha256::new();
    hash.update(fs::read(base.join(crate::base::MARKER)).with_context(|| format!("{} is not a finished base image", base.display()))?);
    hash.update(INIT_SOURCE);
    if let Some(runtime) = runtime {
        let mut files = Vec::new();
        collect_files(runtime, &mut files)?;
        files.sort();
        for f in files {
            hash.update(f.strip_prefix(runtime).unwrap_or(&f).to_string_lossy().as_bytes());
            hash.update(fs::read(&f)?);
        }
    }
    Ok(hex::encode(&hash.finalize()[..8]))
}

fn collect_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for entry in fs::read_dir(dir)?.flatten() {
        let path = entry.path();
        let kind = entry.file_type()?;
        if kind.is_dir() && entry.file_name() != "__pycache__" {
            collect_files(&path, out)?;
        } else if kind.is_file() {
            out.push(path);
        }
    }
    Ok(())
}

/// Make sure a root disk of `base` (with the worker's `runtime` directory at /opt/sprout)
/// exists under `root`; returns its path.
pub fn ensure(root: &Path, base: &Path, runtime: Option<&Path>, progress: &mut dyn FnMut(&str)) -> Result<(PathBuf, Outcome)> {
    let image = root.join(format!("root-{}.ext4", key(base, runtime)?));
    if image.exists() {
        return Ok((image, Outcome::Reused));
    }
    fs::create_dir_all(root)?;
    let lock_file = fs::File::create(root.join("root.lock"))?;
    let _lock = nix::fcntl::Flock::lock(lock_file, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| anyhow::anyhow!("locking the root disk build: {e}"))?;
    if image.exists() {
        return Ok((image, Outcome::Reused));
    }
    let started = Instant::now();
    let staging = root.join("root-staging");
    if staging.exists() {
        fs::remove_dir_all(&staging)?;
    }
    progress(&format!("guest root disk: {} + init + runtime -> {}", base.display(), image.display()));
    let result = stage(&staging, base, runtime).and_then(|_| make_image(&staging, &image));
    let _ = fs::remove_dir_all(&staging);
    result?;
    Ok((image, Outcome::Built(started.elapsed())))
}

/// A copy of the base made of hard links (files are never written, only replaced), adapted
/// for a guest that is its own machine.
fn stage(staging: &Path, base: &Path, runtime: Option<&Path>) -> Result<()> {
    run(Command::new("cp").arg("-al").arg(base).arg(staging))?;
    // The lean sandboxes' /tmp points into their scratch; a guest mounts its own tmpfs there.
    let tmp = staging.join("tmp");
    fs::remove_file(&tmp).or_else(|_| fs::remove_dir_all(&tmp))?;
    fs::create_dir(&tmp)?;
    for dir in ["proc", "sys", "dev", "run"] {
        fs::create_dir_all(staging.join(dir))?;
    }
    let source = staging.join("sprout-init.c");
    fs::write(&source, INIT_SOURCE)?;
    let init = staging.join(INIT_PATH.trim_start_matches('/'));
    let _ = fs::remove_file(&init);
    run(Command::new("gcc").args(["-static", "-Os", "-s", "-o"]).arg(&init).arg(&source))?;
    fs::remove_file(&source)?;
    if let Some(runtime) = runtime {
        let target = staging.join("opt/sprout");
        fs::create_dir_all(&target)?;
        run(Command::new("cp").arg("-r").arg(runtime.join(".")).arg(&target))?;
    }
    Ok(())
}

/// An ext4 image holding `staging`, sized to it with room for the file system's own data.
fn make_image(staging: &Path, image: &Path) -> Result<()> {
    let du = Command::new("du").args(["-s", "--block-size=1M"]).arg(staging).output()?;
    let used: u64 = String::from_utf8_lossy(&du.stdout).split_whitespace().next().and_then(|n| n.parse().ok()).context("du")?;
    let size_mb = used + used / 5 + 32;
    let partial = image.with_extension("partial");
    let _ = fs::remove_file(&partial);
    run(Command::new("mkfs.ext4")
        .args(["-q", "-F", "-L", "sprout-root", "-O", "^has_journal", "-E", "root_owner=0:0", "-d"])
        .arg(staging)
        .arg(&partial)
        .arg(format!("{size_mb}M")))
    .context("mkfs.ext4 (e2fsprogs)")?;
    fs::rename(&partial, image)?;
    Ok(())
}
