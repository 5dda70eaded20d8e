//! Builds the Zygote's C provisioning loop (csrc/zygote.c) into a shared library that the
//! worker binary embeds and installs into each worker's runtime directory.

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
}
