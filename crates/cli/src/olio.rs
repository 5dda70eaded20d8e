//! `sprout olio ...`: runs the Olio tools of the repository (`python3 -m olio_deploy`,
//! `python3 -m olio.loader`) in place of this process, with the repository's `python` and
//! `apps/olio` directories on PYTHONPATH.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{anyhow, Error};

/// The directory that holds `python/sprout` and `apps/olio`: `SPROUT_HOME`, else the first
/// ancestor of this binary that does (target/release/sprout -> the repository), else the
/// source tree this binary was built from.
pub fn repo_root() -> Result<PathBuf, Error> {
    let is_repo = |dir: &Path| dir.join("apps/olio/olio_deploy").is_dir() && dir.join("python/sprout").is_dir();
    if let Some(home) = std::env::var_os("SPROUT_HOME") {
        let home = PathBuf::from(home);
        if is_repo(&home) {
            return Ok(home);
        }
        return Err(anyhow!("SPROUT_HOME={} holds no apps/olio/olio_deploy and python/sprout", home.display()));
    }
    let exe = std::env::current_exe()?.canonicalize()?;
    if let Some(found) = exe.ancestors().skip(1).find(|dir| is_repo(dir)) {
        return Ok(found.to_path_buf());
    }
    let built_from = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    if is_repo(&built_from) {
        return Ok(built_from.canonicalize()?);
    }
    Err(anyhow!("cannot find the Sprout repository (apps/olio, python/sprout) from {}; set SPROUT_HOME", exe.display()))
}

/// Replace this process with `python3 -m <module> [verb] <args...>`; returns only on failure.
pub fn exec_python(module: &str, verb: Option<&str>, args: &[OsString]) -> Error {
    let root = match repo_root() {
        Ok(root) => root,
        Err(e) => return e,
    };
    let mut path = OsString::from(root.join("python"));
    path.push(":");
    path.push(root.join("apps/olio"));
    if let Some(old) = std::env::var_os("PYTHONPATH").filter(|p| !p.is_empty()) {
        path.push(":");
        path.push(old);
    }
    let python = std::env::var_os("SPROUT_PYTHON").unwrap_or_else(|| "python3".into());
    let mut cmd = Command::new(&python);
    cmd.arg("-m").arg(module).args(verb).args(args).env("PYTHONPATH", path);
    if let Ok(exe) = std::env::current_exe() {
        cmd.env("SPROUT_BIN", exe); // the deployments start this very binary's worker and cache
    }
    let err = cmd.exec();
    anyhow!("running {} -m {module}: {err}", python.to_string_lossy())
}
