//! `sprout-vmm`: boot one microVM and run it until the guest stops; its exit status is the
//! guest's (what it wrote to the exit port), 125 when the guest reset itself, 124 when it
//! flooded its console, and 1 when the VMM failed.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use sprout_vmm::{GuestExit, Linux, Vm, VmConfig};

#[derive(Parser)]
#[command(about = "Run one Sprout microVM until its guest stops")]
struct Args {
    /// The guest kernel: an uncompressed ELF vmlinux.
    #[arg(long)]
    kernel: PathBuf,
    /// Read-only disks, in order: the first is the guest's root (/dev/vda).
    #[arg(long = "disk")]
    disks: Vec<PathBuf>,
    /// Guest memory, MiB.
    #[arg(long, default_value_t = 128)]
    memory_mib: u64,
    /// Kernel command-line words after the VMM's own (console, root disk, devices).
    #[arg(long, default_value = "")]
    cmdline: String,
    /// Give the guest a vsock device reached through this host Unix socket (CID 3).
    #[arg(long)]
    vsock: Option<PathBuf>,
    /// Where the guest's console output goes.
    #[arg(long)]
    console: Option<PathBuf>,
    /// Console bytes after which the guest is stopped for flooding it.
    #[arg(long, default_value_t = 4 << 20)]
    console_limit: u64,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(GuestExit::Status(s)) => ExitCode::from(s),
        Ok(GuestExit::Reset) => {
            eprintln!("sprout-vmm: the guest reset itself (a reboot or a kernel panic; see its console)");
            ExitCode::from(125)
        }
        Ok(GuestExit::ConsoleFlood) => {
            eprintln!("sprout-vmm: the guest's console passed {} bytes; stopped", args.console_limit);
            ExitCode::from(124)
        }
        Err(e) => {
            eprintln!("sprout-vmm: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn run(args: &Args) -> anyhow::Result<GuestExit> {
    let mut cmdline = String::from("console=ttyS0 reboot=t panic=-1 pci=off nomodules random.trust_cpu=on");
    if !args.disks.is_empty() {
        cmdline.push_str(" root=/dev/vda ro rootwait");
    }
    let devices = sprout_vmm::vm::virtio_cmdline(args.disks.len() + usize::from(args.vsock.is_some()));
    for words in [devices.as_str(), args.cmdline.as_str()] {
        if !words.is_empty() {
            cmdline.push(' ');
            cmdline.push_str(words);
        }
    }
    let config = VmConfig {
        memory_mib: args.memory_mib,
        console: args.console.clone(),
        console_limit: args.console_limit,
        disks: args.disks.clone(),
        vsock: args.vsock.clone().map(|uds| (3, uds)),
    };
    let guest = Linux { kernel: args.kernel.clone(), cmdline };
    let mut vm = Vm::build(&config, &guest)?;
    vm.run()
}
