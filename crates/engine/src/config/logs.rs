//! `[logs]`: how much of each lambda's output the worker keeps, and how fast it may come.

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogsSection {
    /// Each lambda's latest entries held in memory, in KiB.
    pub memory_kb: u64,
    /// Each lambda's files under `DIR/logs/<lambda>` together, in MiB.
    pub max_mb: u64,
    /// Output each lambda's sandboxes may write together, in KiB a second; past it (and the
    /// burst), lines are dropped and counted.
    pub rate_kb_s: u64,
    pub burst_kb: u64,
}

impl Default for LogsSection {
    fn default() -> Self {
        LogsSection { memory_kb: 256, max_mb: 16, rate_kb_s: 1024, burst_kb: 8192 }
    }
}

impl LogsSection {
    pub fn validate(&self) -> Result<()> {
        for (key, value, least) in [
            ("memory_kb", self.memory_kb, 16),
            ("max_mb", self.max_mb, 1),
            ("rate_kb_s", self.rate_kb_s, 1),
            ("burst_kb", self.burst_kb, 1),
        ] {
            if value < least {
                bail!("logs.{key} must be at least {least}");
            }
        }
        Ok(())
    }
}
