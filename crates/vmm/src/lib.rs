//! Sprout's virtual machine monitor: a KVM microVM per sandbox, built on the rust-vmm crates
//! Firecracker and Cloud Hypervisor use. One vCPU in 64-bit mode, a small memory, a serial
//! console, an exit port, and virtio-mmio devices (read-only block disks).
//!
//! The guest is behind [`boot::Guest`] (Linux today), so a guest that is not Linux — a
//! library OS — boots on the same VMM without changes to the devices or the worker.

pub mod boot;
pub mod bus;
pub mod console;
pub mod long_mode;
pub mod memory;
pub mod virtio;
pub mod vm;

pub use boot::{Guest, Linux};
pub use vm::{GuestExit, Vm, VmConfig};
