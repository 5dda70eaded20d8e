//! What the network pool saves a sandbox: making a lambda's network namespace as the worker
//! makes one (veth, addresses, routes) and deleting it, against a child joining one made ahead.

use std::io;
use std::path::Path;

use anyhow::{Context, Result};
use serde_json::{json, Map, Value};

use super::child::{errno_code, Child};
use super::measure::{c_key, rate, round};

pub(super) fn network(work_dir: &Path, conc: &[usize], secs: f64) -> Result<Value> {
    use sprout_sandbox::network::{host, namespace};
    let tag = "b0b0b0";
    let dir = work_dir.join("network");
    std::fs::create_dir_all(&dir)?;
    host::release(&dir, tag);
    let (block, _) = host::claim(&dir, tag, None, std::process::id(), &[], 64).context("claiming a block for the benchmark")?;
    let result = (|| {
        let cmax = *conc.last().unwrap();
        let pooled: Vec<namespace::Namespace> =
            (0..cmax).map(|t| namespace::create(tag, &block, (cmax + t) as u32, None)).collect::<io::Result<_>>()?;
        let mut make = Map::new();
        let mut join = Map::new();
        for &c in conc {
            let r = rate(c, secs, |t, _| {
                namespace::destroy(namespace::create(tag, &block, t as u32, None)?);
                Ok(())
            })?;
            eprintln!("primitives: network make c{c}: {r:>9.0} make+delete/s");
            make.insert(c_key(c), json!(round(r, 1)));
            let r = rate(c, secs, |t, _| {
                let fd = pooled[t].fd();
                // SAFETY: the child body makes only setns (integers, no memory of ours) and reads errno, as
                // Child::spawn requires; `fd` is inherited from `pooled[t]`, which stays open until after `rate`.
                Child::spawn(|| if unsafe { libc::setns(fd, libc::CLONE_NEWNET) } == 0 { 0 } else { errno_code() })?
                    .wait("joining a pooled network namespace")
            })?;
            eprintln!("primitives: network join c{c}: {r:>9.0} join+exit/s");
            join.insert(c_key(c), json!(round(r, 1)));
        }
        for ns in pooled {
            namespace::destroy(ns);
        }
        anyhow::Ok(json!({"block": block.to_string(), "make": make, "join": join}))
    })();
    host::release(&dir, tag);
    result
}
