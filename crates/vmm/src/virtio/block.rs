//! A read-only virtio block device over a host file (virtio 1.2, section 5.2), serving each
//! request on the vCPU's thread when the guest notifies its queue.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use anyhow::{Context, Result};
use virtio_queue::{DescriptorChain, Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::{read_config_bytes, Interrupt, VirtioDevice, VIRTIO_F_VERSION_1};

const DEVICE_BLOCK: u32 = 2;
const FEATURE_RO: u64 = 1 << 5;
const SECTOR: u64 = 512;
const QUEUE_SIZE: u16 = 256;

const REQUEST_IN: u32 = 0;
const REQUEST_GET_ID: u32 = 8;
const STATUS_OK: u8 = 0;
const STATUS_IOERR: u8 = 1;
const STATUS_UNSUPPORTED: u8 = 2;
/// Length of a GET_ID answer.
const ID_BYTES: usize = 20;

/// A disk the guest may only read.
pub struct Block {
    file: File,
    sectors: u64,
    id: [u8; ID_BYTES],
    memory: Option<GuestMemoryMmap>,
    queue: Option<Queue>,
    interrupt: Option<Interrupt>,
}

impl Block {
    /// Open `path` read-only; its size is rounded down to whole sectors. `id` (at most 20
    /// bytes) names the disk to the guest.
    pub fn open(path: &Path, id: &str) -> Result<Block> {
        let file = File::open(path).with_context(|| format!("opening disk image {}", path.display()))?;
        let sectors = file.metadata()?.len() / SECTOR;
        let mut serial = [0u8; ID_BYTES];
        let n = id.len().min(ID_BYTES);
        serial[..n].copy_from_slice(&id.as_bytes()[..n]);
        Ok(Block { file, sectors, id: serial, memory: None, queue: None, interrupt: None })
    }

    /// Serve one request: read its header, fill its buffers, and return its status with the
    /// bytes written into the guest's buffers.
    fn serve(&self, memory: &GuestMemoryMmap, chain: DescriptorChain<&GuestMemoryMmap>) -> (u32, Option<GuestAddress>) {
        let descriptors: Vec<_> = chain.collect();
        let Some((header, rest)) = descriptors.split_first() else { return (0, None) };
        let Some((status, data)) = rest.split_last() else { return (0, None) };
        if !status.is_write_only() || status.len() < 1 || header.len() < 16 {
            return (0, None);
        }
        let status_addr = status.addr();
        let mut head = [0u8; 16];
        if memory.read_slice(&mut head, header.addr()).is_err() {
            return (0, None);
        }
        let kind = u32::from_le_bytes(head[0..4].try_into().expect("4 bytes"));
        let sector = u64::from_le_bytes(head[8..16].try_into().expect("8 bytes"));
        let mut written = 0u32;
        let result = match kind {
            REQUEST_IN => {
                let mut offset = sector.saturating_mul(SECTOR);
                let mut ok = true;
                for d in data {
                    let len = d.len() as u64;
                    if !d.is_write_only() || offset + len > self.sectors * SECTOR {
                        ok = false;
                        break;
                    }
                    let mut buf = vec![0u8; len as usize];
                    if self.file.read_exact_at(&mut buf, offset).is_err() || memory.write_slice(&buf, d.addr()).is_err() {
                        ok = false;
                        break;
                    }
                    offset += len;
                    written += len as u32;
                }
                if ok {
                    STATUS_OK
                } else {
                    STATUS_IOERR
                }
            }
            REQUEST_GET_ID => match data.first() {
                Some(d) if d.is_write_only() => {
                    let n = (d.len() as usize).min(ID_BYTES);
                    if memory.write_slice(&self.id[..n], d.addr()).is_ok() {
                        written += n as u32;
                        STATUS_OK
                    } else {
                        STATUS_IOERR
                    }
                }
                _ => STATUS_IOERR,
            },
            _ => STATUS_UNSUPPORTED, // writes and flushes: the disk is read-only
        };
        match memory.write_obj(result, status_addr) {
            Ok(()) => (written + 1, Some(status_addr)),
            Err(_) => (written, None),
        }
    }
}

impl VirtioDevice for Block {
    fn device_type(&self) -> u32 {
        DEVICE_BLOCK
    }

    fn features(&self) -> u64 {
        VIRTIO_F_VERSION_1 | FEATURE_RO
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE]
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        // The configuration's first field is the capacity in 512-byte sectors.
        read_config_bytes(&self.sectors.to_le_bytes(), offset, data);
    }

    fn activate(&mut self, memory: GuestMemoryMmap, mut queues: Vec<Queue>, interrupt: Interrupt) -> Result<()> {
        self.memory = Some(memory);
        self.queue = queues.pop();
        self.interrupt = Some(interrupt);
        Ok(())
    }

    fn notify(&mut self, _index: u16) {
        let (Some(memory), Some(mut queue), Some(interrupt)) = (self.memory.clone(), self.queue.take(), self.interrupt.clone()) else {
            return;
        };
        let mut used = false;
        while let Some(chain) = queue.pop_descriptor_chain(&memory) {
            let head = chain.head_index();
            let (len, _) = self.serve(&memory, chain);
            if queue.add_used(&memory, head, len).is_err() {
                break;
            }
            used = true;
        }
        if used && queue.needs_notification(&memory).unwrap_or(true) {
            interrupt.used_ring();
        }
        self.queue = Some(queue);
    }
}
