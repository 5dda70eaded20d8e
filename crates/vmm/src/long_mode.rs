//! The state an x86-64 guest starts in: 64-bit long mode with the first GiB identity-mapped,
//! flat segments, a boot stack, and the local APIC wired for legacy interrupts — what a
//! boot loader would have left, for any guest kind that enters at a 64-bit address.

use anyhow::{Context, Result};
use kvm_bindings::{kvm_fpu, kvm_regs, kvm_segment};
use kvm_ioctls::VcpuFd;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::boot::Entry;

const GDT: u64 = 0x500;
const IDT: u64 = 0x520;
const PML4: u64 = 0x9000;
const PDPTE: u64 = 0xa000;
const PDE: u64 = 0xb000;
const BOOT_STACK: u64 = 0x8ff0;

const CR0_PE: u64 = 0x1;
const CR0_PG: u64 = 0x8000_0000;
const CR4_PAE: u64 = 0x20;
const EFER_LME: u64 = 0x100;
const EFER_LMA: u64 = 0x400;

/// A GDT descriptor from its access flags, base and limit (the x86 encoding).
fn descriptor(flags: u16, base: u32, limit: u32) -> u64 {
    let (flags, base, limit) = (u64::from(flags), u64::from(base), u64::from(limit));
    ((base & 0xff00_0000) << 32)
        | ((flags & 0xf0ff) << 40)
        | ((limit & 0x000f_0000) << 32)
        | ((base & 0x00ff_ffff) << 16)
        | (limit & 0xffff)
}

/// The segment register KVM loads for GDT entry `index`, decoded from the descriptor.
fn segment(entry: u64, index: u16) -> kvm_segment {
    let bit = |n: u32| ((entry >> n) & 1) as u8;
    let granular = bit(55) == 1;
    let raw_limit = (((entry >> 32) & 0x000f_0000) | (entry & 0xffff)) as u32;
    kvm_segment {
        base: ((entry >> 16) & 0x00ff_ffff) | (((entry >> 56) & 0xff) << 24),
        limit: if granular { (raw_limit << 12) | 0xfff } else { raw_limit },
        selector: index * 8,
        type_: ((entry >> 40) & 0xf) as u8,
        present: bit(47),
        dpl: ((entry >> 45) & 0x3) as u8,
        db: bit(54),
        s: bit(44),
        l: bit(53),
        g: bit(55),
        avl: bit(52),
        unusable: 1 - bit(47),
        padding: 0,
    }
}

/// Write the page tables and GDT into guest memory and put the vCPU at `entry` in long mode.
pub fn enter(vcpu: &VcpuFd, memory: &GuestMemoryMmap, entry: Entry) -> Result<()> {
    // Identity-map the first GiB with 2 MiB pages: PML4[0] -> PDPTE[0] -> 512 PDEs.
    memory.write_obj(PDPTE | 0x03, GuestAddress(PML4)).context("page tables")?;
    memory.write_obj(PDE | 0x03, GuestAddress(PDPTE)).context("page tables")?;
    for i in 0..512u64 {
        memory.write_obj((i << 21) | 0x83, GuestAddress(PDE + i * 8)).context("page tables")?;
    }

    let gdt = [
        descriptor(0, 0, 0),            // null
        descriptor(0xa09b, 0, 0xfffff), // code: 64-bit, execute/read, present
        descriptor(0xc093, 0, 0xfffff), // data: read/write, present
        descriptor(0x808b, 0, 0xfffff), // task state segment
    ];
    for (i, d) in gdt.iter().enumerate() {
        memory.write_obj(*d, GuestAddress(GDT + i as u64 * 8)).context("GDT")?;
    }
    memory.write_obj(0u64, GuestAddress(IDT)).context("IDT")?;

    let mut sregs = vcpu.get_sregs().context("KVM_GET_SREGS")?;
    sregs.gdt.base = GDT;
    sregs.gdt.limit = (gdt.len() * 8 - 1) as u16;
    sregs.idt.base = IDT;
    sregs.idt.limit = 7;
    let data = segment(gdt[2], 2);
    sregs.cs = segment(gdt[1], 1);
    (sregs.ds, sregs.es, sregs.fs, sregs.gs, sregs.ss) = (data, data, data, data, data);
    sregs.tr = segment(gdt[3], 3);
    sregs.cr3 = PML4;
    sregs.cr4 |= CR4_PAE;
    sregs.cr0 |= CR0_PE | CR0_PG;
    sregs.efer |= EFER_LME | EFER_LMA;
    vcpu.set_sregs(&sregs).context("KVM_SET_SREGS")?;

    let fpu = kvm_fpu { fcw: 0x37f, mxcsr: 0x1f80, ..Default::default() };
    vcpu.set_fpu(&fpu).context("KVM_SET_FPU")?;

    let regs = kvm_regs { rflags: 0x2, rip: entry.rip, rsp: BOOT_STACK, rbp: BOOT_STACK, rsi: entry.rsi, ..Default::default() };
    vcpu.set_regs(&regs).context("KVM_SET_REGS")?;
    wire_lapic(vcpu)
}

/// Local APIC vector table registers for the two local interrupt pins.
const APIC_LVT0: usize = 0x350;
const APIC_LVT1: usize = 0x360;
const DELIVERY_EXTINT: u32 = 0x7;
const DELIVERY_NMI: u32 = 0x4;

/// Route LINT0 to the legacy PIC (ExtINT) and LINT1 to NMI, as firmware leaves them: with no
/// MP or ACPI tables the kernel takes the PIC's interrupts through LINT0.
fn wire_lapic(vcpu: &VcpuFd) -> Result<()> {
    let mut lapic = vcpu.get_lapic().context("KVM_GET_LAPIC")?;
    for (offset, mode) in [(APIC_LVT0, DELIVERY_EXTINT), (APIC_LVT1, DELIVERY_NMI)] {
        let bytes: [u8; 4] = std::array::from_fn(|i| lapic.regs[offset + i] as u8);
        let value = (u32::from_le_bytes(bytes) & !0x700) | (mode << 8);
        for (i, b) in value.to_le_bytes().into_iter().enumerate() {
            lapic.regs[offset + i] = b as _;
        }
    }
    vcpu.set_lapic(&lapic).context("KVM_SET_LAPIC")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flat_code_descriptor_decodes_to_a_4_gib_64_bit_segment() {
        let code = segment(descriptor(0xa09b, 0, 0xfffff), 1);
        assert_eq!((code.base, code.limit, code.selector), (0, 0xffff_ffff, 8));
        assert_eq!((code.type_, code.present, code.l, code.db, code.s, code.g), (0xb, 1, 1, 0, 1, 1));
        assert_eq!(code.unusable, 0);
    }

    #[test]
    fn the_null_descriptor_is_unusable() {
        assert_eq!(segment(descriptor(0, 0, 0), 0).unusable, 1);
    }

    #[test]
    fn base_and_limit_survive_the_split_encoding() {
        let d = segment(descriptor(0x4093, 0x1234_5678, 0xabcde), 2);
        assert_eq!((d.base, d.limit, d.g, d.db), (0x1234_5678, 0xabcde, 0, 1));
    }
}
