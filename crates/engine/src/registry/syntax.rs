//! Checking an uploaded lambda's entry file (f.py, or its `OL_ENTRY_FILE`) for syntax errors before it is accepted, with the interpreter the
//! lambda will run on: the base image's python3, chrooted into the base, as the unprivileged
//! sandbox user, under CPU, memory and time limits. Only `compile()` and `ast.parse()` run —
//! never the code. A file that compiles also yields the absolute modules it imports (anywhere
//! in it), which the import cache has a Zygote for the lambda's packages import ahead.

use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use anyhow::Context;
use serde::Deserialize;

const CHECK: &str = r#"
import json, sys
source = sys.stdin.buffer.read()
try:
    compile(source, sys.argv[1], "exec", dont_inherit=True)
except SyntaxError as e:
    print(json.dumps({"message": e.msg, "line": e.lineno, "offset": e.offset, "text": (e.text or "").rstrip()}))
    sys.exit(3)
except (ValueError, MemoryError, RecursionError) as e:
    print(json.dumps({"message": f"{type(e).__name__}: {e}", "line": None, "offset": None, "text": ""}))
    sys.exit(3)
import ast
names = []
for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import):
        names.extend(a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
        names.append(node.module)
        names.extend(f"{node.module}.{a.name}" for a in node.names if a.name != "*")  # maybe submodules
print(json.dumps({"imports": sorted(set(names))[:256]}))  # at most 256 recorded
"#;

/// A syntax error found in a lambda's entry file.
#[derive(Debug, Clone, Deserialize)]
pub struct SyntaxError {
    /// The file's name in the lambda's directory.
    #[serde(skip)]
    pub file: String,
    pub message: String,
    pub line: Option<u32>,
    pub offset: Option<u32>,
    pub text: String,
}

impl std::fmt::Display for SyntaxError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.line {
            Some(line) => write!(f, "{} line {line}: {}", self.file, self.message)?,
            None => write!(f, "{}: {}", self.file, self.message)?,
        }
        if !self.text.is_empty() {
            write!(f, ": {}", self.text.trim())?;
        }
        Ok(())
    }
}

pub struct Checker {
    base: PathBuf,
    python: String,
    uid: u32,
    gid: u32,
}

impl Checker {
    pub fn new(base: &Path, python: &str, uid: u32, gid: u32) -> Checker {
        Checker { base: base.to_path_buf(), python: python.to_string(), uid, gid }
    }

    /// `Ok(Ok(imports))` when `source` (of the file `file`) compiles, with the absolute
    /// modules it imports; `Ok(Err(error))` when it does not; `Err` when the check itself
    /// could not run.
    pub fn check(&self, file: &str, source: &[u8]) -> anyhow::Result<Result<Vec<String>, SyntaxError>> {
        let output = self
            .run_in_base(CHECK, &[file], source.to_vec(), Duration::from_secs(15))
            .map_err(|e| anyhow::anyhow!("checking {file}'s syntax: {e:#}"))?;
        match output.status.code() {
            Some(0) => {
                #[derive(Deserialize)]
                struct Checked {
                    imports: Vec<String>,
                }
                let checked: Checked = serde_json::from_slice(&output.stdout).context("reading the syntax check's imports")?;
                Ok(Ok(checked.imports))
            }
            Some(3) => Ok(Err(SyntaxError { file: file.to_string(), ..serde_json::from_slice(&output.stdout)? })),
            _ => anyhow::bail!("the syntax check failed to run ({}): {}", output.status, String::from_utf8_lossy(&output.stderr).trim()),
        }
    }

    /// Run the Python program `script` with `args` in the sandbox base (chrooted, as the
    /// sandbox user, 512 MiB of address space, 10 s of CPU), `input` on its stdin; killed
    /// when it takes longer than `deadline`.
    pub(crate) fn run_in_base(&self, script: &str, args: &[&str], input: Vec<u8>, deadline: Duration) -> anyhow::Result<Output> {
        let base = sprout_sandbox::mounts::cpath(&self.base)?;
        let (uid, gid) = (self.uid, self.gid);
        let mut cmd = Command::new(&self.python);
        cmd.args(["-I", "-S", "-c", script])
            .args(args)
            .env_clear()
            .env("LANG", "C.UTF-8")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // Enter the base, then drop root and cap resources; only raw system calls here. No
        // RLIMIT_NPROC: it counts every process of the sandbox user, so with more handlers
        // alive than the limit the program itself could not exec (EAGAIN); compile() runs none.
        // SAFETY: the closure runs in the forked child before exec and makes only async-signal-safe
        // system calls (raw setgroups/setgid/setuid, not libc's thread-signalling wrappers) on `base`, a
        // NUL-terminated CString it owns, made before the fork, and on the live local `lim`; nothing allocates.
        unsafe {
            cmd.pre_exec(move || {
                let limit = |res, value: u64| {
                    let lim = libc::rlimit { rlim_cur: value, rlim_max: value };
                    libc::setrlimit(res, &lim)
                };
                if libc::chroot(base.as_ptr()) != 0
                    || libc::chdir(c"/".as_ptr()) != 0
                    || limit(libc::RLIMIT_AS, 512 << 20) != 0
                    || limit(libc::RLIMIT_CPU, 10) != 0
                    || libc::syscall(libc::SYS_setgroups, 0usize, std::ptr::null::<libc::gid_t>()) != 0
                    || libc::syscall(libc::SYS_setgid, gid as libc::c_long) != 0
                    || libc::syscall(libc::SYS_setuid, uid as libc::c_long) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().with_context(|| format!("running {} in the sandbox base", self.python))?;
        let mut stdin = child.stdin.take().unwrap();
        let writer = std::thread::spawn(move || {
            let _ = stdin.write_all(&input);
        });
        // Read stdout while it runs: a program printing more than a pipe holds would block.
        let mut stdout = child.stdout.take().unwrap();
        let reader = std::thread::spawn(move || {
            let mut out = Vec::new();
            let _ = stdout.read_to_end(&mut out);
            out
        });
        let deadline = std::time::Instant::now() + deadline;
        loop {
            if child.try_wait()?.is_some() || std::time::Instant::now() > deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        if child.try_wait()?.is_none() {
            let _ = child.kill();
            let _ = child.wait();
            anyhow::bail!("it took too long");
        }
        let _ = writer.join();
        let stdout = reader.join().unwrap_or_default();
        let output = child.wait_with_output()?;
        Ok(Output { stdout, ..output })
    }
}
