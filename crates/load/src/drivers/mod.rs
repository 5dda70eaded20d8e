//! The built-in drivers: what each operation of a workload does over HTTP.

pub mod http;
pub mod olio;
