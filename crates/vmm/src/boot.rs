//! Putting a guest in memory: the [`Guest`] interface every guest kind implements, and the
//! Linux one (an uncompressed ELF `vmlinux` entered in 64-bit mode with a zero page, the x86
//! 64-bit boot protocol). A guest that is not Linux (a library OS) implements [`Guest`] too.

use std::fs::File;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use linux_loader::loader::bootparam::{boot_e820_entry, boot_params};
use linux_loader::loader::{load_cmdline, Cmdline, Elf, KernelLoader};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::memory;

/// Where the first vCPU starts once the guest is in memory: 64-bit long mode at `rip`, with
/// `rsi` holding the guest's one boot argument (Linux: its zero page).
#[derive(Debug, Clone, Copy)]
pub struct Entry {
    pub rip: u64,
    pub rsi: u64,
}

/// A kind of guest: how it is loaded into a fresh VM's memory.
pub trait Guest {
    fn load(&self, memory: &GuestMemoryMmap) -> Result<Entry>;
}

/// Guest physical layout of the boot structures (as Firecracker lays them out).
const ZERO_PAGE: u64 = 0x7000;
const CMDLINE: u64 = 0x20000;
const CMDLINE_MAX: usize = 4096;
/// Start of the BIOS data area the kernel must not use, and of high memory.
const EBDA_START: u64 = 0x9fc00;
const HIGH_MEMORY: u64 = 0x10_0000;

/// A Linux kernel booted from its ELF image with a command line.
pub struct Linux {
    pub kernel: PathBuf,
    pub cmdline: String,
}

const E820_RAM: u32 = 1;

impl Guest for Linux {
    fn load(&self, memory: &GuestMemoryMmap) -> Result<Entry> {
        let mut image = File::open(&self.kernel).with_context(|| format!("opening the guest kernel {}", self.kernel.display()))?;
        let loaded = Elf::load(memory, None, &mut image, Some(GuestAddress(HIGH_MEMORY)))
            .with_context(|| format!("loading the guest kernel {} (an uncompressed ELF vmlinux)", self.kernel.display()))?;

        let mut cmdline = Cmdline::new(CMDLINE_MAX).context("command line")?;
        cmdline.insert_str(&self.cmdline).map_err(|e| anyhow::anyhow!("guest command line {:?}: {e}", self.cmdline))?;
        load_cmdline(memory, GuestAddress(CMDLINE), &cmdline).context("writing the command line")?;

        let end = memory::size(memory);
        if end <= HIGH_MEMORY {
            bail!("guest memory ends below 1 MiB");
        }
        let mut params = boot_params::default();
        params.hdr.type_of_loader = 0xff; // an undefined boot loader
        params.hdr.boot_flag = 0xaa55;
        params.hdr.header = 0x5372_6448; // "HdrS"
        params.hdr.cmd_line_ptr = CMDLINE as u32;
        params.hdr.cmdline_size = self.cmdline.len() as u32 + 1;
        params.hdr.kernel_alignment = 0x0100_0000;
        let ram = [(0, EBDA_START), (HIGH_MEMORY, end - HIGH_MEMORY)];
        for (i, (addr, size)) in ram.into_iter().enumerate() {
            params.e820_table[i] = boot_e820_entry { addr, size, r#type: E820_RAM };
        }
        params.e820_entries = ram.len() as u8;
        memory.write_obj(params, GuestAddress(ZERO_PAGE)).context("writing the zero page")?;
        Ok(Entry { rip: loaded.kernel_load.0, rsi: ZERO_PAGE })
    }
}
