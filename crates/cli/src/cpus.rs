//! CPU lists as the command line gives them: "0", "0,1", "0-3".

use anyhow::{bail, Result};

/// "0", "0,1", "0-3" as CPU numbers.
pub fn parse_cpus(text: &str) -> Result<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in text.split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => cpus.extend(a.trim().parse::<usize>()?..=b.trim().parse::<usize>()?),
            None => cpus.push(part.trim().parse()?),
        }
    }
    if cpus.is_empty() {
        bail!("no CPUs in {text:?}");
    }
    Ok(cpus)
}
