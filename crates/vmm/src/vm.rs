//! One microVM: its KVM VM and single vCPU, memory, interrupt controllers, and devices, built
//! from a [`VmConfig`]; [`Vm::run`] runs the vCPU until the guest stops and says why.

use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use kvm_bindings::{kvm_pit_config, KVM_MAX_CPUID_ENTRIES, KVM_PIT_SPEAKER_DUMMY};
use kvm_ioctls::{Kvm, VcpuExit, VcpuFd, VmFd};
use vm_memory::GuestMemoryMmap;
use vm_superio::Serial;
use vmm_sys_util::eventfd::EventFd;

use crate::boot::Guest;
use crate::bus::Bus;
use crate::console::{self, Console, ConsoleLog, ExitPort, IrqTrigger, NO_STATUS};
use crate::virtio::{self, mmio::MmioTransport, VirtioDevice};
use crate::{long_mode, memory};

/// The first virtio-mmio device's registers and interrupt line; each next one follows.
const VIRTIO_BASE: u64 = memory::MMIO_START;
const VIRTIO_FIRST_IRQ: u32 = 5;
/// Where KVM keeps its task state segment on Intel hosts: three pages below 4 GiB, outside RAM.
const TSS_ADDRESS: usize = 0xfffb_d000;

/// What to run.
pub struct VmConfig {
    pub memory_mib: u64,
    /// Console output; None discards it.
    pub console: Option<PathBuf>,
    /// Bytes of console output after which the guest counts as flooding and is stopped.
    pub console_limit: u64,
    /// Read-only disks, in the order the guest sees them (/dev/vda, /dev/vdb, ...).
    pub disks: Vec<PathBuf>,
    /// A vsock device: the guest's CID and the host Unix socket programs connect through.
    pub vsock: Option<(u64, PathBuf)>,
}

/// Why the guest stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GuestExit {
    /// It wrote this status to the exit port.
    Status(u8),
    /// It reset itself (a reboot, a triple fault, or a panic with `panic=-1`).
    Reset,
    /// Its console output passed the limit.
    ConsoleFlood,
}

/// A built VM, ready to run.
pub struct Vm {
    // Field order is drop order: the vCPU and VM go before the memory KVM maps.
    vcpu: VcpuFd,
    _vm: VmFd,
    _memory: GuestMemoryMmap,
    io: Bus,
    mmio: Bus,
    exit_status: Arc<AtomicU32>,
    flooded: Arc<AtomicBool>,
    /// Time to build it, for the boot figures.
    pub built_in: Duration,
}

impl Vm {
    /// Make the VM, load `guest` into it, and attach the devices. `cmdline_devices` is told
    /// the virtio-mmio devices' command-line words (Linux guests add them to their cmdline).
    pub fn build(config: &VmConfig, guest: &dyn Guest) -> Result<Vm> {
        let started = Instant::now();
        memory::check_size(config.memory_mib)?;
        if let Some(missing) = config.disks.iter().find(|d| !d.is_file()) {
            bail!("disk image {} is not a file", missing.display());
        }
        let kvm = Kvm::new().context("opening /dev/kvm")?;
        let vm = kvm.create_vm().context("KVM_CREATE_VM")?;
        vm.set_tss_address(TSS_ADDRESS).context("KVM_SET_TSS_ADDR")?;
        vm.create_irq_chip().context("KVM_CREATE_IRQCHIP")?;
        let pit = kvm_pit_config { flags: KVM_PIT_SPEAKER_DUMMY, ..Default::default() };
        vm.create_pit2(pit).context("KVM_CREATE_PIT2")?;
        let memory = memory::create(&vm, config.memory_mib)?;

        let vcpu = vm.create_vcpu(0).context("KVM_CREATE_VCPU")?;
        let cpuid = kvm.get_supported_cpuid(KVM_MAX_CPUID_ENTRIES).context("KVM_GET_SUPPORTED_CPUID")?;
        vcpu.set_cpuid2(&cpuid).context("KVM_SET_CPUID2")?;

        let entry = guest.load(&memory)?;
        long_mode::enter(&vcpu, &memory, entry)?;

        let mut io = Bus::default();
        let console_out = match &config.console {
            Some(path) => Some(File::create(path).with_context(|| format!("creating console log {}", path.display()))?),
            None => None,
        };
        let log = ConsoleLog::new(console_out, config.console_limit);
        let flooded = log.flooded.clone();
        let com1_irq = EventFd::new(libc::EFD_NONBLOCK).context("eventfd")?;
        vm.register_irqfd(&com1_irq, console::COM1_IRQ).context("KVM_IRQFD for COM1")?;
        io.insert(console::COM1_PORT, console::COM1_LEN, Arc::new(Mutex::new(Console(Serial::new(IrqTrigger(com1_irq), log)))))?;
        let exit_status = Arc::new(AtomicU32::new(NO_STATUS));
        io.insert(console::EXIT_PORT, 1, Arc::new(Mutex::new(ExitPort(exit_status.clone()))))?;

        let mut mmio = Bus::default();
        for (i, path) in config.disks.iter().enumerate() {
            let device = virtio::block::Block::open(path, &format!("sprout-disk-{i}"))?;
            attach(&vm, &memory, &mut mmio, i as u32, Box::new(device))?;
        }
        if let Some((cid, uds)) = &config.vsock {
            let device = virtio::vsock::Vsock::new(*cid, uds)?;
            attach(&vm, &memory, &mut mmio, config.disks.len() as u32, Box::new(device))?;
        }
        Ok(Vm { vcpu, _vm: vm, _memory: memory, io, mmio, exit_status, flooded, built_in: started.elapsed() })
    }

    /// Run the vCPU until the guest stops.
    pub fn run(&mut self) -> Result<GuestExit> {
        loop {
            let exit = self.vcpu.run();
            match exit {
                Ok(VcpuExit::IoOut(port, data)) => {
                    self.io.write(u64::from(port), data);
                    if u64::from(port) == console::EXIT_PORT {
                        let status = self.exit_status.load(Ordering::SeqCst);
                        if status != NO_STATUS {
                            return Ok(GuestExit::Status(status as u8));
                        }
                    }
                }
                Ok(VcpuExit::IoIn(port, data)) => {
                    if !self.io.read(u64::from(port), data) {
                        data.fill(0xff); // nothing there: the bus floats high
                    }
                }
                Ok(VcpuExit::MmioRead(addr, data)) => {
                    if !self.mmio.read(addr, data) {
                        data.fill(0);
                    }
                }
                Ok(VcpuExit::MmioWrite(addr, data)) => {
                    self.mmio.write(addr, data);
                }
                Ok(VcpuExit::Shutdown) | Ok(VcpuExit::SystemEvent(..)) => return Ok(GuestExit::Reset),
                Ok(VcpuExit::Hlt) => bail!("the vCPU halted with interrupts off"),
                Ok(VcpuExit::FailEntry(reason, cpu)) => bail!("KVM could not enter the guest (reason {reason:#x}, cpu {cpu})"),
                Ok(VcpuExit::InternalError) => {
                    // SAFETY: after a KVM_EXIT_INTERNAL_ERROR exit the kernel filled the union's
                    // `internal` member, which is plain integers.
                    let suberror = unsafe { self.vcpu.get_kvm_run().__bindgen_anon_1.internal.suberror };
                    let rip = self.vcpu.get_regs().map(|r| r.rip).unwrap_or(0);
                    bail!("KVM internal error running the guest (suberror {suberror}, rip {rip:#x})")
                }
                Ok(other) => bail!("unexpected vCPU exit {other:?}"),
                Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {}
                Err(e) => bail!("KVM_RUN: {e}"),
            }
            if self.flooded.load(Ordering::Relaxed) {
                return Ok(GuestExit::ConsoleFlood);
            }
        }
    }
}

/// The kernel command-line words announcing `count` virtio-mmio devices to Linux.
pub fn virtio_cmdline(count: usize) -> String {
    (0..count as u64)
        .map(|i| format!("virtio_mmio.device=4K@{:#x}:{}", VIRTIO_BASE + i * virtio::mmio::MMIO_LEN, VIRTIO_FIRST_IRQ + i as u32))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Put `device` on the MMIO bus as the `index`th virtio device, with its own interrupt line.
fn attach(vm: &VmFd, memory: &GuestMemoryMmap, mmio: &mut Bus, index: u32, device: Box<dyn VirtioDevice>) -> Result<()> {
    let irq = EventFd::new(libc::EFD_NONBLOCK).context("eventfd")?;
    vm.register_irqfd(&irq, VIRTIO_FIRST_IRQ + index).context("KVM_IRQFD for a virtio device")?;
    let transport = MmioTransport::new(device, memory.clone(), irq);
    let base = VIRTIO_BASE + u64::from(index) * virtio::mmio::MMIO_LEN;
    mmio.insert(base, virtio::mmio::MMIO_LEN, Arc::new(Mutex::new(transport)))
}
