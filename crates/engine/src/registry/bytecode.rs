//! Compiling an uploaded lambda's Python modules to bytecode once, at upload, as pip does for
//! packages at install: the lambda's directory is read-only in its sandboxes, so without
//! `__pycache__` every cold start compiled each module it imports again (Olio: most of a
//! cold start's CPU). The base image's python3 compiles (so the magic number and cache tag
//! are the sandboxes'), chrooted as the sandbox user under the syntax check's limits
//! ([`Checker::run_in_base`]); only `compile()` runs, never the code. The `.pyc`s are
//! timestamp-checked, as Python writes them, so a module whose file changes is compiled again.
//! Best effort: a module that does not compile, or a batch that fails, is left to be compiled
//! in the sandbox as before; the upload never fails for it.

use std::fs;
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::syntax::Checker;

/// Where a lambda's directory is inside its sandbox (the paths Python caches by).
const HANDLER_DIR: &str = "/handler";
/// Source bytes compiled by one program (each run has the syntax check's CPU limit).
const BATCH_BYTES: usize = 4 << 20;
/// Longest one batch may take, and all of them together.
const BATCH_DEADLINE: Duration = Duration::from_secs(15);
const TOTAL_DEADLINE: Duration = Duration::from_secs(60);

const COMPILE: &str = r#"
import importlib.util, json, marshal, sys
out = []
for m in json.load(sys.stdin):
    try:
        code = compile(bytes.fromhex(m["source"]), m["path"], "exec", dont_inherit=True)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        continue
    header = importlib.util.MAGIC_NUMBER + (0).to_bytes(4, "little") + \
        (m["mtime"] & 0xFFFFFFFF).to_bytes(4, "little") + (m["size"] & 0xFFFFFFFF).to_bytes(4, "little")
    out.append({"pyc": importlib.util.cache_from_source(m["path"]),
                "data": (header + marshal.dumps(code)).hex()})
json.dump(out, sys.stdout)
"#;

#[derive(Serialize)]
struct Module {
    path: String,
    mtime: u64,
    size: u64,
    source: String,
}

#[derive(Deserialize)]
struct Compiled {
    pyc: String,
    data: String,
}

/// What [`compile_tree`] did.
#[derive(Debug, Default, PartialEq)]
pub struct Outcome {
    pub modules: usize,
    pub compiled: usize,
    /// Why some batches failed (their modules compile in the sandbox instead).
    pub failures: Vec<String>,
}

/// Compile every `.py` file under `dir` (a lambda's unpacked directory) into `__pycache__`
/// beside it.
pub fn compile_tree(checker: &Checker, dir: &Path) -> Outcome {
    let mut outcome = Outcome::default();
    let started = Instant::now();
    let mut batch: Vec<Module> = Vec::new();
    let mut bytes = 0;
    for (rel, meta) in python_files(dir) {
        let Ok(source) = fs::read(dir.join(&rel)) else { continue };
        let mtime = meta.modified().ok().and_then(|t| t.duration_since(UNIX_EPOCH).ok()).map(|d| d.as_secs()).unwrap_or(0);
        bytes += source.len();
        outcome.modules += 1;
        batch.push(Module { path: format!("{HANDLER_DIR}/{}", rel.display()), mtime, size: meta.len(), source: hex::encode(&source) });
        if bytes >= BATCH_BYTES {
            run_batch(checker, dir, std::mem::take(&mut batch), &mut outcome, started);
            bytes = 0;
        }
    }
    run_batch(checker, dir, batch, &mut outcome, started);
    outcome
}

fn run_batch(checker: &Checker, dir: &Path, batch: Vec<Module>, outcome: &mut Outcome, started: Instant) {
    if batch.is_empty() {
        return;
    }
    if started.elapsed() > TOTAL_DEADLINE {
        outcome.failures.push(format!("{} module(s) left: compiling took longer than {} s", batch.len(), TOTAL_DEADLINE.as_secs()));
        return;
    }
    let input = serde_json::to_vec(&batch).expect("modules serialize");
    let compiled = match checker.run_in_base(COMPILE, &[], input, BATCH_DEADLINE) {
        Ok(out) if out.status.success() => serde_json::from_slice::<Vec<Compiled>>(&out.stdout).map_err(|e| e.to_string()),
        Ok(out) => Err(format!("{}: {}", out.status, String::from_utf8_lossy(&out.stderr).trim())),
        Err(e) => Err(format!("{e:#}")),
    };
    match compiled {
        Ok(compiled) => {
            for c in compiled {
                match write_pyc(dir, &c) {
                    Ok(()) => outcome.compiled += 1,
                    Err(e) => outcome.failures.push(e),
                }
            }
        }
        Err(e) => outcome.failures.push(format!("compiling {} module(s): {e}", batch.len())),
    }
}

/// Write one `.pyc` where Python looks for it: `<dir>/…/__pycache__/<name>.<tag>.pyc`, and
/// nowhere else.
fn write_pyc(dir: &Path, c: &Compiled) -> Result<(), String> {
    let rel = c.pyc.strip_prefix(&format!("{HANDLER_DIR}/")).map(PathBuf::from);
    let rel = match rel {
        Some(rel)
            if rel.components().all(|p| matches!(p, Component::Normal(_)))
                && rel.extension().is_some_and(|e| e == "pyc")
                && rel.parent().and_then(|p| p.file_name()).is_some_and(|n| n == "__pycache__") =>
        {
            rel
        }
        _ => return Err(format!("refused a cache path outside the lambda: {}", c.pyc)),
    };
    let data = hex::decode(&c.data).map_err(|e| format!("{}: {e}", c.pyc))?;
    let path = dir.join(&rel);
    let parent = path.parent().expect("a __pycache__ parent");
    // A symbolic link named __pycache__ (archives may hold links inside the lambda) is not followed.
    if fs::symlink_metadata(parent).is_ok_and(|m| !m.is_dir()) {
        return Err(format!("{} is not a directory", rel.parent().unwrap().display()));
    }
    fs::create_dir_all(parent).and_then(|_| fs::write(&path, data)).map_err(|e| format!("writing {}: {e}", rel.display()))
}

/// Regular `.py` files under `dir`, relative, in a stable order; links are not followed.
fn python_files(dir: &Path) -> Vec<(PathBuf, fs::Metadata)> {
    let mut found = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let Ok(entries) = fs::read_dir(dir.join(&rel)) else { continue };
        for entry in entries.flatten() {
            let (Ok(meta), name) = (entry.metadata(), entry.file_name()) else { continue };
            let child = rel.join(&name);
            if meta.is_dir() && name != "__pycache__" {
                stack.push(child);
            } else if meta.is_file() && child.extension().is_some_and(|e| e == "py") {
                found.push((child, meta));
            }
        }
    }
    found.sort_by(|a, b| a.0.cmp(&b.0));
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_python_files_but_not_caches_or_links() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        fs::create_dir_all(d.join("pkg/__pycache__")).unwrap();
        fs::write(d.join("f.py"), "x = 1\n").unwrap();
        fs::write(d.join("pkg/mod.py"), "y = 2\n").unwrap();
        fs::write(d.join("pkg/data.txt"), "").unwrap();
        fs::write(d.join("pkg/__pycache__/old.py"), "").unwrap();
        std::os::unix::fs::symlink(d.join("f.py"), d.join("link.py")).unwrap();
        let names: Vec<_> = python_files(d).into_iter().map(|(p, _)| p.display().to_string()).collect();
        assert_eq!(names, ["f.py", "pkg/mod.py"]);
    }

    #[test]
    fn a_cache_path_must_stay_in_the_lambda_and_in_a_pycache() {
        let dir = tempfile::tempdir().unwrap();
        let data = hex::encode(b"pyc");
        let ok = Compiled { pyc: "/handler/pkg/__pycache__/mod.cpython-311.pyc".into(), data: data.clone() };
        write_pyc(dir.path(), &ok).unwrap();
        assert_eq!(fs::read(dir.path().join("pkg/__pycache__/mod.cpython-311.pyc")).unwrap(), b"pyc");
        for bad in ["/etc/__pycache__/x.pyc", "/handler/../x/__pycache__/y.pyc", "/handler/pkg/mod.pyc", "/handler/__pycache__/x.py"] {
            let c = Compiled { pyc: bad.into(), data: data.clone() };
            assert!(write_pyc(dir.path(), &c).is_err(), "{bad}");
        }
        // A link named __pycache__ is not written through.
        fs::create_dir_all(dir.path().join("elsewhere")).unwrap();
        std::os::unix::fs::symlink(dir.path().join("elsewhere"), dir.path().join("__pycache__")).unwrap();
        let c = Compiled { pyc: "/handler/__pycache__/f.cpython-311.pyc".into(), data };
        assert!(write_pyc(dir.path(), &c).is_err());
        assert!(fs::read_dir(dir.path().join("elsewhere")).unwrap().next().is_none());
    }
}
