//! The `vm` back-end ([`backend`]): sandboxes that are KVM microVMs, and the guest artifacts
//! every one boots — the kernel ([`kernel`]) and root disk ([`rootfs`]), each built once per
//! machine and cached by a key of its inputs.

pub mod backend;
pub mod kernel;
pub mod rootfs;

use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Context, Result};

/// Where the machine-wide guest artifacts live by default.
pub fn default_dir() -> PathBuf {
    PathBuf::from("/var/lib/sprout/vm")
}

/// What this host's KVM is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvmHost {
    /// No /dev/kvm, or not ours to open.
    Missing,
    /// PVM (the `kvm_pvm` module): virtualization by page tables, without VT-x or AMD-V, as
    /// some clouds offer inside their VMs. It runs only guest kernels built for PVM, and the
    /// vm back-end's guest is a stock kernel from Debian's linux-source.
    Pvm,
    /// Hardware virtualization (VT-x or AMD-V, nested or not).
    Hardware,
}

/// Which kind of KVM this host has.
pub fn kvm_host() -> KvmHost {
    if std::fs::OpenOptions::new().read(true).write(true).open("/dev/kvm").is_err() {
        KvmHost::Missing
    } else if std::path::Path::new("/sys/module/kvm_pvm").exists() {
        KvmHost::Pvm
    } else {
        KvmHost::Hardware
    }
}

/// Run a build step; its stderr is the error when it fails.
fn run(command: &mut Command) -> Result<()> {
    let out = command.output().with_context(|| format!("starting {command:?}"))?;
    if !out.status.success() {
        bail!("{command:?} failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}
