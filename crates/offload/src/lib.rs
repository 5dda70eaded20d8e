//! Elastic offload on Sprout's engine (docs/offload.md): a lambda's `f(event)` over many
//! items ([`map_run`], planned by the pure [`map_plan`]), user leases of N sandboxes held for
//! a client's object ([`LeaseBook`], its pure table [`leases`], its shared directories
//! [`lease_files`]), and the blob store for items and results too large for a request
//! ([`Blobs`]); both kinds of directory are [`shared_files`]. Everything here is a call on
//! the engine's invoker and instances; the HTTP edge serves it.

mod blobs;
mod lease_book;
mod lease_files;
mod leases;
mod map_plan;
mod map_run;
mod shared_files;

pub use blobs::Blobs;
pub use lease_book::{Caller, LeaseBook, PartReply, MAX_SPEC as MAX_LEASE_SPEC};
pub use lease_files::LeaseFiles;
pub use map_plan::{Sizing, MAX_CHUNK};
pub use map_run::{check_function, parse_items, run as run_map, MapCalls, MapJob, Mapped};
pub use shared_files::{file_error, SharedDir};

/// Where every sandbox sees the leases' directories.
pub const LEASES_IN_SANDBOX: &str = lease_files::IN_SANDBOX;
/// Where every sandbox sees the blobs.
pub const BLOBS_IN_SANDBOX: &str = blobs::IN_SANDBOX;
