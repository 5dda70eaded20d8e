//! Address decoding for the vCPU's port I/O and MMIO exits: each device owns a range, and an
//! access goes to the device whose range holds it, with the offset into that range.

use std::sync::{Arc, Mutex};

use anyhow::{bail, Result};

/// A device on a bus. Accesses are 1-8 bytes, as the guest made them.
pub trait BusDevice: Send {
    fn read(&mut self, offset: u64, data: &mut [u8]);
    fn write(&mut self, offset: u64, data: &[u8]);
}

struct Range {
    base: u64,
    len: u64,
    device: Arc<Mutex<dyn BusDevice>>,
}

/// The devices of one address space (port I/O or memory).
#[derive(Default)]
pub struct Bus {
    ranges: Vec<Range>,
}

impl Bus {
    /// Give `device` the addresses `base..base+len`, which no other device may overlap.
    pub fn insert(&mut self, base: u64, len: u64, device: Arc<Mutex<dyn BusDevice>>) -> Result<()> {
        if len == 0 || base.checked_add(len).is_none() {
            bail!("bad bus range {base:#x}+{len:#x}");
        }
        if let Some(r) = self.ranges.iter().find(|r| base < r.base + r.len && r.base < base + len) {
            bail!("bus range {base:#x}+{len:#x} overlaps {:#x}+{:#x}", r.base, r.len);
        }
        self.ranges.push(Range { base, len, device });
        Ok(())
    }

    fn find(&self, addr: u64) -> Option<(&Range, u64)> {
        self.ranges.iter().find(|r| addr >= r.base && addr - r.base < r.len).map(|r| (r, addr - r.base))
    }

    /// Read from the device at `addr`; false (and `data` untouched) where there is none.
    pub fn read(&self, addr: u64, data: &mut [u8]) -> bool {
        match self.find(addr) {
            Some((r, offset)) => {
                r.device.lock().unwrap_or_else(|e| e.into_inner()).read(offset, data);
                true
            }
            None => false,
        }
    }

    /// Write to the device at `addr`; false where there is none.
    pub fn write(&self, addr: u64, data: &[u8]) -> bool {
        match self.find(addr) {
            Some((r, offset)) => {
                r.device.lock().unwrap_or_else(|e| e.into_inner()).write(offset, data);
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Echo(Vec<(u64, u8)>);

    impl BusDevice for Echo {
        fn read(&mut self, offset: u64, data: &mut [u8]) {
            data.fill(offset as u8);
        }
        fn write(&mut self, offset: u64, data: &[u8]) {
            self.0.push((offset, data[0]));
        }
    }

    #[test]
    fn accesses_reach_the_device_owning_the_address_with_its_offset() {
        let mut bus = Bus::default();
        let a = Arc::new(Mutex::new(Echo(vec![])));
        bus.insert(0x3f8, 8, a.clone()).unwrap();
        let mut byte = [0u8];
        assert!(bus.read(0x3fa, &mut byte));
        assert_eq!(byte[0], 2);
        assert!(bus.write(0x3ff, &[9]));
        assert_eq!(a.lock().unwrap().0, vec![(7, 9)]);
        assert!(!bus.read(0x400, &mut byte));
        assert!(!bus.write(0x3f7, &[1]));
    }

    #[test]
    fn overlapping_and_empty_ranges_are_refused() {
        let mut bus = Bus::default();
        bus.insert(0x1000, 0x1000, Arc::new(Mutex::new(Echo(vec![])))).unwrap();
        assert!(bus.insert(0x1fff, 2, Arc::new(Mutex::new(Echo(vec![])))).is_err());
        assert!(bus.insert(0x0fff, 2, Arc::new(Mutex::new(Echo(vec![])))).is_err());
        assert!(bus.insert(0x3000, 0, Arc::new(Mutex::new(Echo(vec![])))).is_err());
        bus.insert(0x2000, 1, Arc::new(Mutex::new(Echo(vec![])))).unwrap();
    }
}
