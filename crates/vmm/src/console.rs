//! The guest's console, a 16550 UART (vm-superio) at COM1 whose output goes to a log file
//! of bounded size, and the exit port through which the guest's init reports its status.

use std::fs::File;
use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

use vm_superio::{Serial, Trigger};
use vmm_sys_util::eventfd::EventFd;

use crate::bus::BusDevice;

/// COM1's ports and interrupt line.
pub const COM1_PORT: u64 = 0x3f8;
pub const COM1_LEN: u64 = 8;
pub const COM1_IRQ: u32 = 4;

/// The port a guest writes its exit status to (the isa-debug-exit convention); the VM stops.
pub const EXIT_PORT: u64 = 0x501;

/// An interrupt line raised by writing an eventfd registered with KVM (an irqfd).
pub struct IrqTrigger(pub EventFd);

impl Trigger for IrqTrigger {
    type E = io::Error;
    fn trigger(&self) -> io::Result<()> {
        self.0.write(1)
    }
}

/// Console output: appended to a file until `limit` bytes, after which the guest is flooding
/// and the VM is stopped (`flooded` is set; the run loop checks it).
pub struct ConsoleLog {
    out: Option<File>,
    written: u64,
    limit: u64,
    pub flooded: Arc<AtomicBool>,
}

impl ConsoleLog {
    pub fn new(out: Option<File>, limit: u64) -> ConsoleLog {
        ConsoleLog { out, written: 0, limit, flooded: Arc::new(AtomicBool::new(false)) }
    }
}

impl Write for ConsoleLog {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let room = self.limit.saturating_sub(self.written) as usize;
        if buf.len() > room {
            self.flooded.store(true, Ordering::Relaxed);
        }
        let kept = &buf[..buf.len().min(room)];
        self.written += kept.len() as u64;
        if let (Some(out), false) = (self.out.as_mut(), kept.is_empty()) {
            out.write_all(kept)?;
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.as_mut().map_or(Ok(()), |f| f.flush())
    }
}

/// COM1 on the port bus.
pub struct Console(pub Serial<IrqTrigger, vm_superio::serial::NoEvents, ConsoleLog>);

impl BusDevice for Console {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        if let Some(first) = data.first_mut() {
            *first = self.0.read(offset as u8);
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if let Some(&value) = data.first() {
            // A failed interrupt (the eventfd is full) only delays the guest's read of the FIFO.
            let _ = self.0.write(offset as u8, value);
        }
    }
}

/// Status values of [`ExitPort`]: none written yet, else the byte the guest wrote.
pub const NO_STATUS: u32 = u32::MAX;

/// The exit port: the guest writes one status byte and the VM stops.
pub struct ExitPort(pub Arc<AtomicU32>);

impl BusDevice for ExitPort {
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }

    fn write(&mut self, _offset: u64, data: &[u8]) {
        if let Some(&status) = data.first() {
            self.0.store(u32::from(status), Ordering::SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn console_output_past_its_limit_is_dropped_and_marks_a_flood() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("console.log");
        let mut log = ConsoleLog::new(Some(File::create(&path).unwrap()), 10);
        log.write_all(b"boot ok\n").unwrap();
        assert!(!log.flooded.load(Ordering::Relaxed));
        log.write_all(b"flood flood").unwrap();
        assert!(log.flooded.load(Ordering::Relaxed));
        assert_eq!(std::fs::read(&path).unwrap(), b"boot ok\nfl");
    }
}
