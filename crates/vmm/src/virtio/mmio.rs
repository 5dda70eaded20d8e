//! The virtio-mmio transport (virtio 1.2, section 4.2, version 2 registers): one 4 KiB page of
//! device registers per device, announced to Linux on its command line
//! (`virtio_mmio.device=4K@<base>:<irq>`).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use virtio_queue::{Queue, QueueT};
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

use super::{Interrupt, VirtioDevice};
use crate::bus::BusDevice;

/// Size of a device's register page.
pub const MMIO_LEN: u64 = 0x1000;

const MAGIC: u32 = 0x7472_6976; // "virt"
const VENDOR: u32 = 0x5350_5254; // "SPRT"
const CONFIG_SPACE: u64 = 0x100;

// Device status bits (virtio 1.2, section 2.1).
const STATUS_DRIVER_OK: u32 = 4;
const STATUS_FAILED: u32 = 128;

/// One device presented over MMIO.
pub struct MmioTransport {
    device: Box<dyn VirtioDevice>,
    memory: GuestMemoryMmap,
    interrupt: Interrupt,
    queues: Vec<Queue>,
    queue_select: u32,
    device_features_select: u32,
    driver_features_select: u32,
    driver_features: u64,
    status: u32,
    activated: bool,
}

impl MmioTransport {
    pub fn new(device: Box<dyn VirtioDevice>, memory: GuestMemoryMmap, irqfd: EventFd) -> MmioTransport {
        let queues = device.queue_max_sizes().iter().map(|&max| Queue::new(max).expect("queue sizes are powers of two")).collect();
        MmioTransport {
            device,
            memory,
            interrupt: Interrupt { status: Arc::new(AtomicU32::new(0)), irqfd: Arc::new(irqfd) },
            queues,
            queue_select: 0,
            device_features_select: 0,
            driver_features_select: 0,
            driver_features: 0,
            status: 0,
            activated: false,
        }
    }

    fn queue(&mut self) -> Option<&mut Queue> {
        self.queues.get_mut(self.queue_select as usize)
    }

    fn read32(&self, offset: u64) -> u32 {
        let selected = self.queues.get(self.queue_select as usize);
        match offset {
            0x000 => MAGIC,
            0x004 => 2,
            0x008 => self.device.device_type(),
            0x00c => VENDOR,
            0x010 => match self.device_features_select {
                0 => self.device.features() as u32,
                1 => (self.device.features() >> 32) as u32,
                _ => 0,
            },
            0x034 => selected.map_or(0, |q| u32::from(q.max_size())),
            0x044 => selected.map_or(0, |q| u32::from(q.ready())),
            0x060 => self.interrupt.status.load(Ordering::SeqCst),
            0x070 => self.status,
            0x0fc => 0, // configuration generation: the configuration never changes
            _ => 0,
        }
    }

    fn write32(&mut self, offset: u64, value: u32) {
        let before_ok = !self.activated;
        match offset {
            0x014 => self.device_features_select = value,
            0x020 => match self.driver_features_select {
                0 => self.driver_features = (self.driver_features & !0xffff_ffff) | u64::from(value),
                1 => self.driver_features = (self.driver_features & 0xffff_ffff) | (u64::from(value) << 32),
                _ => {}
            },
            0x024 => self.driver_features_select = value,
            0x030 => self.queue_select = value,
            0x038 if before_ok => {
                if let Some(q) = self.queue() {
                    q.set_size(value as u16)
                }
            }
            0x044 if before_ok => {
                if let Some(q) = self.queue() {
                    q.set_ready(value == 1)
                }
            }
            0x050 if self.activated => self.device.notify(value as u16),
            0x064 => {
                self.interrupt.status.fetch_and(!value, Ordering::SeqCst);
            }
            0x070 => self.set_status(value),
            0x080 | 0x084 | 0x090 | 0x094 | 0x0a0 | 0x0a4 if before_ok => {
                let (low, high) = if offset.is_multiple_of(8) { (Some(value), None) } else { (None, Some(value)) };
                if let Some(q) = self.queue() {
                    match offset & !0xf {
                        0x080 => q.set_desc_table_address(low, high),
                        0x090 => q.set_avail_ring_address(low, high),
                        _ => q.set_used_ring_address(low, high),
                    }
                }
            }
            _ => {}
        }
    }

    fn set_status(&mut self, value: u32) {
        if value == 0 {
            // Reset: the driver starts over. A device once activated keeps its queues; Linux
            // resets only at shutdown, so serving a second activation is not supported.
            self.status = 0;
            self.queue_select = 0;
            return;
        }
        self.status = value;
        if value & STATUS_DRIVER_OK != 0 && !self.activated {
            self.activated = true;
            let queues: Vec<Queue> = self.queues.iter().map(clone_queue).collect();
            let ok = queues.iter().all(|q| q.is_valid(&self.memory) || !q.ready());
            if !ok || self.device.activate(self.memory.clone(), queues, self.interrupt.clone()).is_err() {
                self.status |= STATUS_FAILED;
            }
        }
    }
}

/// A queue's configuration, handed to the device at activation.
fn clone_queue(q: &Queue) -> Queue {
    let mut copy = Queue::new(q.max_size()).expect("valid size");
    copy.set_size(q.size());
    copy.set_desc_table_address(Some(q.desc_table() as u32), Some((q.desc_table() >> 32) as u32));
    copy.set_avail_ring_address(Some(q.avail_ring() as u32), Some((q.avail_ring() >> 32) as u32));
    copy.set_used_ring_address(Some(q.used_ring() as u32), Some((q.used_ring() >> 32) as u32));
    copy.set_ready(q.ready());
    copy
}

impl BusDevice for MmioTransport {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        if offset >= CONFIG_SPACE {
            self.device.read_config(offset - CONFIG_SPACE, data);
        } else if data.len() == 4 {
            data.copy_from_slice(&self.read32(offset).to_le_bytes());
        } else {
            data.fill(0);
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if offset < CONFIG_SPACE && data.len() == 4 {
            self.write32(offset, u32::from_le_bytes(data.try_into().expect("4 bytes")));
        }
        // Configuration writes are ignored: no device here has a writable configuration.
    }
}
