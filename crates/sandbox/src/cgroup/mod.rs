//! Cgroups for sandboxes, on the v1 hierarchies (one directory per controller) or on the
//! unified v2 hierarchy, made ahead in a pool and reused after a sandbox exits.
//!
//! SOCK (section 2.3) measured reusing a cgroup at twice the speed of creating one, so a
//! worker keeps a pool: [`CgroupPool::acquire`] hands out an empty cgroup with the limits
//! already written, [`CgroupPool::release`] takes it back once its processes are gone. A
//! [`Cgroup`] hides the version: on v1 it is one directory in each of the memory, pids, cpu,
//! cpuacct and freezer hierarchies; on v2 it is one directory of the unified tree.
//!
//! * `layout`: which hierarchies the host has ([`Layout`], [`Version`]) and where a group's
//!   files are in them; `files`: reading and writing those files.
//! * `group`: one sandbox's [`Cgroup`]; `limits`: the [`Limits`] written to it; `view`:
//!   what a session reads of it after each request; `cpu`: its share of a contended CPU
//!   ([`CpuControl`]).
//! * `pool`: the [`CgroupPool`]; `tree`: parent groups and removing whole subtrees.
//! * `worker_cpu`: the worker's own group in the cpu hierarchy ([`OwnCpuGroup`]).

mod cpu;
mod files;
mod group;
mod layout;
mod limits;
mod pool;
mod tree;
mod view;
mod worker_cpu;

pub use cpu::{CpuControl, DEFAULT_WEIGHT};
pub(crate) use files::{move_pid, read_oom_kills, read_pids};
pub use group::Cgroup;
pub use layout::{Layout, Version};
pub use limits::Limits;
pub use pool::{CgroupPool, PoolStats};
pub use tree::remove_group_tree;
pub use view::{view_of, CgroupView, PeakMeter, TaskCounter};
pub use worker_cpu::OwnCpuGroup;
