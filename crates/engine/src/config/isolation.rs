//! `[isolation]`: the isolation classes a worker runs beside `sandbox.backend` (its default),
//! and the operator's class for particular lambdas ([`crate::isolation`] decides with them).

use std::collections::BTreeMap;

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

use super::BackendKind;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct IsolationSection {
    /// Back-ends started beside `sandbox.backend`, for the lambdas given them.
    pub classes: Vec<BackendKind>,
    /// A lambda's class by its name (the admin API's choice at upload comes first).
    pub lambdas: BTreeMap<String, BackendKind>,
}

/// The back-ends that can run beside another in one worker.
const BESIDE: [BackendKind; 4] = [BackendKind::Sock, BackendKind::SockNoZygote, BackendKind::Runc, BackendKind::Gvisor];

fn lean(kind: BackendKind) -> bool {
    matches!(kind, BackendKind::Sock | BackendKind::SockNoZygote)
}

impl IsolationSection {
    pub fn validate(&self, default: BackendKind) -> Result<()> {
        if !self.classes.is_empty() && !BESIDE.contains(&default) {
            bail!("isolation.classes needs sandbox.backend to be sock, sock-nozygote, runc or gvisor, not {}", default.name());
        }
        for kind in &self.classes {
            if !BESIDE.contains(kind) {
                bail!("isolation.classes may hold sock, sock-nozygote, runc and gvisor, not {}", kind.name());
            }
        }
        if lean(default) && self.classes.iter().any(|k| lean(*k) && *k != default)
            || self.classes.contains(&BackendKind::Sock) && self.classes.contains(&BackendKind::SockNoZygote)
        {
            bail!("a worker runs one lean back-end: sock or sock-nozygote, not both");
        }
        for (name, kind) in &self.lambdas {
            if !crate::names::valid_name(name) {
                bail!("isolation.lambdas: {name:?} is not a lambda name");
            }
            if *kind != default && !self.classes.contains(kind) {
                bail!("isolation.lambdas.{name} = {:?}, which this worker does not run: add it to isolation.classes", kind.name());
            }
        }
        Ok(())
    }
}
