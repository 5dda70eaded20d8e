//! Guest memory: one region of anonymous host memory from guest address 0, registered with
//! KVM as slot 0. (Restoring a snapshot will map the region copy-on-write from a file instead.)

use anyhow::{bail, Context, Result};
use kvm_bindings::kvm_userspace_memory_region;
use kvm_ioctls::VmFd;
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

/// Guest physical addresses from here up to 4 GiB are device space (virtio-mmio), never RAM.
pub const MMIO_START: u64 = 0xd000_0000;

/// The largest guest this layout holds: RAM must end below the device space.
pub const MAX_MEMORY_MIB: u64 = MMIO_START >> 20;

/// Allocate `mib` MiB of guest memory (untouched: the host backs a page when the guest first
/// uses it) and hand it to the VM.
pub fn create(vm: &VmFd, mib: u64) -> Result<GuestMemoryMmap> {
    check_size(mib)?;
    let size = (mib << 20) as usize;
    let memory = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), size)]).context("allocating guest memory")?;
    register(vm, &memory)?;
    Ok(memory)
}

/// Whether a guest of `mib` MiB fits this layout.
pub fn check_size(mib: u64) -> Result<()> {
    if !(16..=MAX_MEMORY_MIB).contains(&mib) {
        bail!("guest memory must be 16 to {MAX_MEMORY_MIB} MiB, not {mib}");
    }
    Ok(())
}

/// Tell KVM where each region of `memory` lives in this process.
fn register(vm: &VmFd, memory: &GuestMemoryMmap) -> Result<()> {
    for (slot, region) in memory.iter().enumerate() {
        let host = region.get_host_address(vm_memory::MemoryRegionAddress(0)).context("guest memory's host address")?;
        let kvm_region = kvm_userspace_memory_region {
            slot: slot as u32,
            flags: 0,
            guest_phys_addr: region.start_addr().0,
            memory_size: region.len(),
            userspace_addr: host as u64,
        };
        // SAFETY: the region is a live mapping of exactly memory_size bytes owned by `memory`,
        // which the VM (and so KVM's use of the slot) never outlives: `Vm` drops its VmFd first.
        unsafe { vm.set_user_memory_region(kvm_region) }.context("registering guest memory with KVM")?;
    }
    Ok(())
}

/// Bytes of guest memory, for the e820 map.
pub fn size(memory: &GuestMemoryMmap) -> u64 {
    memory.iter().map(|r| r.len()).sum()
}
