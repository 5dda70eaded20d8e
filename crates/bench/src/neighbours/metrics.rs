//! The worker's `/metrics`, fetched with its token, and the counters read from it.

use std::time::Duration;

use anyhow::{Context, Result};

use crate::worker::BenchWorker;

/// The worker's /metrics text, with its token.
pub(super) fn metrics(worker: &BenchWorker) -> Result<String> {
    let token = std::fs::read_to_string(worker.dir.join("api-token")).context("reading the worker's API token")?;
    let agent = ureq::AgentBuilder::new().timeout(Duration::from_secs(20)).build();
    let text =
        agent.get(&format!("{}/metrics", worker.url())).set("Authorization", &format!("Bearer {}", token.trim())).call()?.into_string()?;
    Ok(text)
}

/// The sample of `family` (a counter, `_total` included) labelled `lambda="<lambda>"`: None when
/// the worker does not expose the family, 0 when it has no sample of the lambda yet.
pub(super) fn lambda_counter(text: &str, family: &str, lambda: &str) -> Option<f64> {
    let mut exposed = false;
    for line in text.lines() {
        if line.starts_with('#') {
            exposed |= line.split_whitespace().nth(2) == Some(family);
            continue;
        }
        let Some(rest) = line.strip_prefix(family).and_then(|r| r.strip_prefix('{')) else { continue };
        exposed = true;
        let Some((labels, value)) = rest.split_once('}') else { continue };
        if labels.split(',').any(|l| l.trim() == format!("lambda=\"{lambda}\"")) {
            return value.split_whitespace().next().and_then(|v| v.parse().ok());
        }
    }
    exposed.then_some(0.0)
}

/// A counter without labels, None when absent.
pub(super) fn counter(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')).and_then(|v| v.trim().parse().ok()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_lambdas_counter() {
        let text = "# HELP sprout_log_dropped_lines_total Lines dropped.\n# TYPE sprout_log_dropped_lines_total counter\n\
                    sprout_log_dropped_lines_total{lambda=\"printer-paced\"} 12\nsprout_log_dropped_lines_total{lambda=\"printer\"} 7\n\
                    sprout_log_writer_dropped_entries_total 3\n";
        assert_eq!(lambda_counter(text, "sprout_log_dropped_lines_total", "printer"), Some(7.0));
        assert_eq!(lambda_counter(text, "sprout_log_dropped_lines_total", "printer-paced"), Some(12.0));
        assert_eq!(lambda_counter(text, "sprout_log_dropped_lines_total", "victim"), Some(0.0));
        assert_eq!(lambda_counter(text, "sprout_log_dropped_bytes_total", "printer"), None);
        assert_eq!(counter(text, "sprout_log_writer_dropped_entries_total"), Some(3.0));
    }
}
