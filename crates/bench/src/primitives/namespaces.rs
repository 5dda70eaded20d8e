//! Figures 3-4: fork, `unshare(flags)`, exit and reap, for several namespace flag sets.

use std::time::Duration;

use anyhow::Result;
use serde_json::{json, Map, Value};

use super::child::churn_once;
use super::measure::{c_key, rate, round};

/// Namespace flag sets of figures 3-4, in the order measured (network last: its teardown
/// runs on after the children are reaped).
pub(super) const NAMESPACE_SETS: [(&str, libc::c_int); 9] = [
    ("none", 0),
    ("uts", libc::CLONE_NEWUTS),
    ("ipc", libc::CLONE_NEWIPC),
    ("pid", libc::CLONE_NEWPID),
    ("mnt", libc::CLONE_NEWNS),
    ("sock", libc::CLONE_NEWPID | libc::CLONE_NEWIPC | libc::CLONE_NEWUTS),
    ("no_net", libc::CLONE_NEWPID | libc::CLONE_NEWIPC | libc::CLONE_NEWUTS | libc::CLONE_NEWNS),
    ("net", libc::CLONE_NEWNET),
    ("all", libc::CLONE_NEWPID | libc::CLONE_NEWIPC | libc::CLONE_NEWUTS | libc::CLONE_NEWNS | libc::CLONE_NEWNET),
];

pub(super) fn namespaces(conc: &[usize], secs: f64, quick: bool) -> Result<(Value, Vec<String>)> {
    let mut out = Map::new();
    let settle = Duration::from_secs_f64(if quick { 0.2 } else { 0.5 });
    for (name, flags) in NAMESPACE_SETS {
        let mut rates = Map::new();
        for &c in conc {
            let r = rate(c, secs, |_, _| churn_once(flags))?;
            eprintln!("primitives: namespaces {name:<6} c{c}: {r:>9.0} fork+unshare+exit/s");
            rates.insert(c_key(c), json!(round(r, 1)));
            if flags & libc::CLONE_NEWNET != 0 {
                // Let the kernel's cleanup_net work drain before the next point.
                std::thread::sleep(settle);
            }
        }
        out.insert(name.to_string(), Value::Object(rates));
    }
    let notes = vec![
        "namespaces: each op forks a child that calls unshare(flags) and exits; the parent reaps it \
         with waitpid. none = plain fork+exit+wait; sock = pid|ipc|uts (what Sprout uses); \
         no_net = pid|ipc|uts|mnt; all = pid|ipc|uts|mnt|net. unshare(CLONE_NEWPID) creates the \
         PID namespace for the child's future children (the child itself stays in ours)."
            .into(),
        format!(
            "namespaces: teardown of net, mnt and ipc namespaces is partly asynchronous in the \
             kernel (net: the cleanup_net workqueue, batched, under pernet_ops_rwsem; ipc: a \
             free_ipc work item after an RCU grace period; mnt: mntput of the copied mounts is \
             deferred). Rates count children until they are reaped, so work left to those \
             workers is not in them; after each point with a network namespace the benchmark \
             pauses {:.1} s to let it drain.",
            settle.as_secs_f64()
        ),
    ];
    Ok((Value::Object(out), notes))
}
