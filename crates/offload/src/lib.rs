//! Elastic offload on Sprout's engine (docs/offload.md): a lambda's `f(event)` over many
//! items ([`map_run`], planned by the pure [`map_plan`]), user leases of N sandboxes held for
//! a client's object ([`LeaseBook`], its pure table [`leases`], its shared directories
//! [`lease_files`]), and the blob store for items and results too large for a request
//! ([`Blobs`]); both kinds of directory are [`shared_files`]. Everything here is a call on
//! the engine's invoker and instances; the HTTP edge serves it.

pub mod blobs;
pub mod lease_book;
pub mod lease_files;
pub mod leases;
pub mod map_plan;
pub mod map_run;
pub mod shared_files;

pub use blobs::Blobs;
pub use lease_book::{Caller, LeaseBook, PartReply};
pub use lease_files::LeaseFiles;
pub use map_run::MapCalls;
