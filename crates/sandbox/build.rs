//! Builds the Zygote's C provisioning loop (csrc/zygote.c) into a shared library that the
//! worker binary embeds and installs into each worker's runtime directory, and lists the
//! `sprout` Python package's modules (python/sprout, but for its runtime) for the binary to
//! embed beside it, so every sandbox can `import sprout`.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=csrc/zygote.c");
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("libsprout.so");
    let compiler = cc::Build::new().get_compiler();
    let status = Command::new(compiler.path())
        .args(["-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&out)
        .arg("csrc/zygote.c")
        .status()
        .expect("running the C compiler");
    assert!(status.success(), "compiling csrc/zygote.c failed");
    embed_python_package();
}

/// Write `$OUT_DIR/python_package.rs`: `[(path under python/, include_bytes!(...)), ...]`.
fn embed_python_package() {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap()).join("../../python");
    let package = root.join("sprout");
    // Only the modules are watched, not their directories: Cargo counts a directory changed
    // when anything in it is newer, and running Python (the tests do) writes `__pycache__`
    // there, which would rebuild the worker after every test run. A module added to the
    // package is picked up once its package's `__init__.py` (or this file) changes.
    let mut files = Vec::new();
    let mut stack = vec![package.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("reading python/sprout") {
            let path = entry.expect("a directory entry").path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if path.is_dir() {
                if name != "runtime" && name != "__pycache__" {
                    stack.push(path);
                }
            } else if name.ends_with(".py") {
                files.push(path);
            }
        }
    }
    files.sort();
    let mut out = String::from("&[\n");
    for file in files {
        let rel = file.strip_prefix(&root).unwrap().to_str().unwrap().to_string();
        let abs = file.canonicalize().unwrap();
        println!("cargo:rerun-if-changed={}", abs.display());
        out.push_str(&format!("    ({rel:?}, include_bytes!({:?})),\n", abs.to_str().unwrap()));
    }
    out.push_str("]\n");
    std::fs::write(PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("python_package.rs"), out).unwrap();
}
