//! The microVMs' guest kernel: built once per machine, on demand (by the first worker
//! configured for the `vm` back-end on a host with hardware virtualization, or its
//! `sprout worker init`), from Debian's `linux-source` package
//! with the configuration kept in the repository (`crates/vmm/guest/kernel.config`, applied
//! to `allnoconfig`), and cached under a key of the source and the configuration, so a
//! changed configuration or kernel package builds a new one and an unchanged one is reused.

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};

use super::run;

/// The configuration fragment, compiled in so the binary and its kernel always agree.
pub const CONFIG: &str = include_str!("../../../vmm/guest/kernel.config");

/// Where Debian's linux-source packages put their tarballs.
const SOURCE_DIR: &str = "/usr/src";

/// Debian's packages the build needs, named when one is missing (scripts/setup.sh does not
/// install them: most machines never build this kernel).
const BUILD_PACKAGES: &str = "linux-source bc flex bison libelf-dev make gcc";

/// File beside a finished kernel recording what it was built from.
const MARKER: &str = "built-from";

/// A finished kernel image.
#[derive(Debug, Clone)]
pub struct Kernel {
    pub vmlinux: PathBuf,
    /// Version of the source it was built from, e.g. "6.1".
    pub source: String,
}

/// The newest kernel source tarball Debian's `linux-source` installed, with its version.
pub fn source_tarball() -> Result<(PathBuf, String)> {
    let mut found: Vec<(Vec<u32>, PathBuf, String)> = Vec::new();
    for entry in fs::read_dir(SOURCE_DIR).with_context(|| format!("reading {SOURCE_DIR}"))?.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        if let Some(version) = name.strip_prefix("linux-source-").and_then(|v| v.strip_suffix(".tar.xz")) {
            let key = version.split('.').map(|p| p.parse().unwrap_or(0)).collect();
            found.push((key, entry.path(), version.to_string()));
        }
    }
    found.sort();
    let (_, path, version) = found.pop().with_context(|| format!("no kernel source in {SOURCE_DIR}: apt-get install {BUILD_PACKAGES}"))?;
    Ok((path, version))
}

/// The cache key of a kernel built from `tarball` with [`CONFIG`].
fn key(tarball: &Path) -> Result<String> {
    let size = fs::metadata(tarball)?.len();
    let mut hash = Sha256::new();
    hash.update(format!("{}\n{size}\n", tarball.display()));
    hash.update(CONFIG);
    Ok(hex::encode(&hash.finalize()[..8]))
}

/// What [`ensure`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Reused,
    Built(Duration),
}

/// Make sure a kernel for this configuration exists under `root` (e.g. /var/lib/sprout/vm),
/// building it (minutes) if not; `progress` gets a line per step and one every few seconds
/// while compiling.
pub fn ensure(root: &Path, progress: &mut dyn FnMut(&str)) -> Result<(Kernel, Outcome)> {
    let (tarball, version) = source_tarball()?;
    let dir = root.join(format!("kernel-{version}-{}", key(&tarball)?));
    let kernel = Kernel { vmlinux: dir.join("vmlinux"), source: version.clone() };
    if dir.join(MARKER).exists() {
        return Ok((kernel, Outcome::Reused));
    }
    fs::create_dir_all(root)?;
    let lock_file = fs::File::create(root.join("kernel.lock"))?;
    let _lock = nix::fcntl::Flock::lock(lock_file, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| anyhow::anyhow!("locking the kernel build: {e}"))?;
    if dir.join(MARKER).exists() {
        return Ok((kernel, Outcome::Reused));
    }
    let started = Instant::now();
    let build = root.join("kernel-build");
    if build.exists() {
        fs::remove_dir_all(&build)?;
    }
    fs::create_dir_all(&build)?;
    let result = build_in(&build, &tarball, &version, progress).and_then(|vmlinux| {
        let staging = dir.with_extension("building");
        if staging.exists() {
            fs::remove_dir_all(&staging)?;
        }
        fs::create_dir_all(&staging)?;
        fs::copy(&vmlinux, staging.join("vmlinux")).context("copying vmlinux")?;
        fs::write(staging.join("kernel.config"), CONFIG)?;
        fs::write(staging.join(MARKER), format!("{}\n", tarball.display()))?;
        if dir.exists() {
            fs::remove_dir_all(&dir)?;
        }
        fs::rename(&staging, &dir)?;
        Ok(())
    });
    let _ = fs::remove_dir_all(&build);
    result?;
    Ok((kernel, Outcome::Built(started.elapsed())))
}

/// Unpack, configure, check and compile; returns the path of the built vmlinux.
fn build_in(build: &Path, tarball: &Path, version: &str, progress: &mut dyn FnMut(&str)) -> Result<PathBuf> {
    let mut missing: Vec<&str> = ["make", "gcc", "bc", "flex", "bison"].into_iter().filter(|tool| !on_path(tool)).collect();
    if !Path::new("/usr/include/libelf.h").exists() {
        missing.push("libelf's headers");
    }
    if !missing.is_empty() {
        bail!("building the guest kernel needs {}: apt-get install {BUILD_PACKAGES}", missing.join(", "));
    }
    progress(&format!("guest kernel: unpacking {} (about half a minute)", tarball.display()));
    run(Command::new("tar").arg("-xf").arg(tarball).arg("-C").arg(build))?;
    let source = build.join(format!("linux-source-{version}"));
    if !source.join("Makefile").exists() {
        bail!("{} did not unpack into {}", tarball.display(), source.display());
    }
    let fragment = build.join("sprout.config");
    fs::write(&fragment, CONFIG)?;
    progress("guest kernel: configuring (allnoconfig + crates/vmm/guest/kernel.config)");
    run(Command::new("make").current_dir(&source).arg("allnoconfig").env("KCONFIG_ALLCONFIG", &fragment))?;
    let config = fs::read_to_string(source.join(".config"))?;
    let missing = missing_options(CONFIG, &config);
    if !missing.is_empty() {
        bail!("the guest kernel's configuration lost {} (a dependency is not enabled): {}", missing.len(), missing.join(", "));
    }
    let jobs = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    progress(&format!("guest kernel: compiling with {jobs} job(s) (a few minutes)"));
    compile(&source, jobs, progress)?;
    Ok(source.join("vmlinux"))
}

/// Whether `program` is on PATH.
fn on_path(program: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()))
}

/// Options the fragment sets that the final configuration does not have as set.
pub fn missing_options(fragment: &str, config: &str) -> Vec<String> {
    fragment
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("CONFIG_"))
        .filter(|wanted| !config.lines().any(|l| l.trim() == *wanted))
        .map(str::to_string)
        .collect()
}

fn compile(source: &Path, jobs: usize, progress: &mut dyn FnMut(&str)) -> Result<()> {
    let mut child = Command::new("make")
        .current_dir(source)
        .arg(format!("-j{jobs}"))
        .arg("vmlinux")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting make")?;
    let stderr = child.stderr.take().expect("piped");
    let errors = std::thread::spawn(move || BufReader::new(stderr).lines().map_while(Result::ok).collect::<Vec<_>>());
    let (started, mut last) = (Instant::now(), Instant::now());
    let mut compiled = 0;
    for line in BufReader::new(child.stdout.take().expect("piped")).lines().map_while(Result::ok) {
        if line.trim_start().starts_with("CC") {
            compiled += 1;
        }
        if last.elapsed() >= Duration::from_secs(10) {
            progress(&format!("  {compiled} files compiled ({:.0} s)", started.elapsed().as_secs_f64()));
            last = Instant::now();
        }
    }
    let status = child.wait()?;
    let errors = errors.join().unwrap_or_default();
    if !status.success() {
        let tail = errors[errors.len().saturating_sub(20)..].join("\n");
        bail!("compiling the guest kernel failed ({status}):\n{tail}");
    }
    progress(&format!("  {compiled} files compiled in {:.0} s", started.elapsed().as_secs_f64()));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_option_dropped_by_kconfig_is_reported() {
        let fragment = "# comment\nCONFIG_A=y\nCONFIG_B=y\nCONFIG_N=1\n";
        let config = "CONFIG_A=y\n# CONFIG_B is not set\nCONFIG_N=1\n";
        assert_eq!(missing_options(fragment, config), vec!["CONFIG_B=y"]);
    }

    #[test]
    fn the_fragment_enables_the_devices_the_vmm_provides() {
        for option in
            ["CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES=y", "CONFIG_VIRTIO_BLK=y", "CONFIG_VIRTIO_VSOCKETS=y", "CONFIG_SERIAL_8250_CONSOLE=y"]
        {
            assert!(CONFIG.lines().any(|l| l == option), "{option}");
        }
    }
}
