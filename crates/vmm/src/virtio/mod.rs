//! Virtio devices: what a device implements ([`VirtioDevice`]), the interrupt it raises, and
//! the transport that presents it to the guest ([`mmio`]).

pub mod block;
pub mod mmio;
pub mod vsock;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use anyhow::Result;
use virtio_queue::Queue;
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

/// Feature bit every device offers: the virtio 1.x interface (no legacy layout).
pub const VIRTIO_F_VERSION_1: u64 = 1 << 32;

/// Bit of the interrupt status register: the device used buffers of a queue.
pub const INTERRUPT_USED_RING: u32 = 1;

/// A device's interrupt: its status bits, which the guest reads and acknowledges through the
/// transport, and the irqfd that raises its line.
#[derive(Clone)]
pub struct Interrupt {
    pub status: Arc<AtomicU32>,
    pub irqfd: Arc<EventFd>,
}

impl Interrupt {
    /// Tell the guest the device has put buffers in a used ring.
    pub fn used_ring(&self) {
        self.status.fetch_or(INTERRUPT_USED_RING, Ordering::SeqCst);
        // The eventfd's counter only overflows after 2^64-1 unread signals; an error here
        // means the VM is going away.
        let _ = self.irqfd.write(1);
    }
}

/// A virtio device behind a transport.
pub trait VirtioDevice: Send {
    /// The virtio device ID (2 block, 19 socket).
    fn device_type(&self) -> u32;
    /// The feature bits it offers, [`VIRTIO_F_VERSION_1`] included.
    fn features(&self) -> u64;
    /// The largest size of each of its queues.
    fn queue_max_sizes(&self) -> &[u16];
    /// Read its configuration space (out of range reads give zeros).
    fn read_config(&self, offset: u64, data: &mut [u8]);
    /// The driver is ready: start serving `queues` in `memory`.
    fn activate(&mut self, memory: GuestMemoryMmap, queues: Vec<Queue>, interrupt: Interrupt) -> Result<()>;
    /// The driver notified queue `index` of new buffers.
    fn notify(&mut self, index: u16);
}

/// Copy `value`'s bytes from `offset` into `data` (a configuration-space read).
pub fn read_config_bytes(config: &[u8], offset: u64, data: &mut [u8]) {
    data.fill(0);
    let start = offset as usize;
    if start < config.len() {
        let n = data.len().min(config.len() - start);
        data[..n].copy_from_slice(&config[start..start + n]);
    }
}
