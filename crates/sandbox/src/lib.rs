//! Sprout's sandbox engine: lean sandboxes in the manner of SOCK (Oakes et al., ATC '18), and
//! the general-purpose containers they are measured against, behind one [`Backend`] trait.
//!
//! * [`stage`] builds the worker's private mount tree ([`mounts`], read back through
//!   [`mountinfo`]); a sandbox root is stitched from bind mounts and entered with chroot —
//!   no mount or network namespace.
//! * [`cgroup`] keeps a pool of cgroups (v1 or v2) made ahead and reused.
//! * [`process`] clones processes straight into new PID, IPC and UTS namespaces.
//! * [`backend`] is the seam the worker uses: a [`Backend`] makes [`Sandbox`]es, each of which
//!   keeps its back-end's state and destroys itself; [`spec`] holds the types both sides share,
//!   [`error`] why the platform could not make a sandbox (typed, with its cause).
//! * [`channel`] is the Unix-socket protocol between the worker and each sandbox's helper;
//!   [`session`] is one request over it, and the health of the sandbox after it.
//! * [`sock`] provisions sandboxes by forking a Zygote (`sock`) or not (`sock-nozygote`);
//!   [`runc`] is the container baseline (the docker one, an HTTP client of the Docker
//!   Engine, is a crate of its own above this one: crates/docker), [`scratch`] the
//!   containers' writable directory.
//! * [`import_cache`] keeps the tree of Zygotes with packages pre-imported; [`zygote`] is one
//!   Zygote's fork protocol, [`userns`] the user namespace package Zygotes live in, and
//!   [`memory`] measures what they and paused handlers hold (PSS).
//! * [`network`] gives each lambda a network namespace of its own, from a pool, reaching only
//!   the services the operator allows.
//! * [`seccomp`] filters the system calls of every sandbox process.
//! * [`oneshot`] runs one program (pip) in a sandbox of its own, with limits.
//! * [`gvisor`] runs each lambda's sandboxes in a gVisor sandbox of its own (a pod), a
//!   second kernel between tenants, with the lambda's Zygote inside it.
//! * [`vm`] is the microVM back-end: each sandbox a KVM guest run by `sprout-vmm`
//!   (crates/vmm), with the guest kernel and root disk it boots.
//! * [`base`] builds the read-only Debian base image; [`cleanup`] removes what a crashed
//!   worker left behind.

pub mod backend;
pub mod base;
pub mod cgroup;
pub mod channel;
pub mod cleanup;
pub mod error;
pub mod gvisor;
pub mod import_cache;
pub mod memory;
pub mod mountinfo;
pub mod mounts;
pub mod network;
pub mod oneshot;
pub mod output;
pub mod process;
pub mod runc;
pub mod scratch;
pub mod seccomp;
pub mod session;
pub mod sock;
pub mod spec;
pub mod stage;
pub mod userns;
pub mod vm;
pub mod zygote;

pub use backend::{Backend, Sandbox};
pub use cgroup::Limits;
pub use error::PlatformError;
pub use session::Calls;
pub use spec::{BackendStats, CreateError, HandlerKind, InvokeError, Package, ParkingStats, Phase, SandboxSpec, SharedCode};
