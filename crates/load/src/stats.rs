//! Response-time statistics: per operation, an HdrHistogram (microseconds) and error counts
//! by kind, kept per time window and merged exactly (histograms add; percentiles are never
//! averaged), with the per-operation summary Faban reports: count, mean, max, p90, p99.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use hdrhistogram::serialization::{Deserializer, Serializer, V2DeflateSerializer};
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// Longest response time recorded exactly (longer ones are clamped to it): 10 minutes.
pub const MAX_US: u64 = 600_000_000;

/// One operation's responses within one window (or a whole run).
#[derive(Debug, Clone)]
pub struct OpStats {
    pub hist: Histogram<u64>,
    /// Failed operations by kind ("http 500", "timeout", "connect", "check: ..."); they are
    /// counted here and never enter the histogram.
    pub errors: BTreeMap<String, u64>,
}

impl Default for OpStats {
    fn default() -> OpStats {
        OpStats { hist: Histogram::new_with_bounds(1, MAX_US, 3).expect("valid bounds"), errors: BTreeMap::new() }
    }
}

impl OpStats {
    pub fn record(&mut self, us: u64) {
        self.hist.saturating_record(us.clamp(1, MAX_US));
    }

    pub fn error(&mut self, kind: &str) {
        *self.errors.entry(kind.to_string()).or_default() += 1;
    }

    pub fn add(&mut self, other: &OpStats) {
        self.hist.add(&other.hist).expect("histograms of equal bounds add");
        for (k, v) in &other.errors {
            *self.errors.entry(k.clone()).or_default() += v;
        }
    }

    pub fn error_count(&self) -> u64 {
        self.errors.values().sum()
    }

    pub fn summary(&self) -> Summary {
        let h = &self.hist;
        let ms = |us: u64| us as f64 / 1000.0;
        let empty = h.is_empty();
        Summary {
            count: h.len(),
            errors: self.error_count(),
            mean_ms: if empty { 0.0 } else { h.mean() / 1000.0 },
            max_ms: if empty { 0.0 } else { ms(h.max()) },
            p50_ms: if empty { 0.0 } else { ms(h.value_at_quantile(0.50)) },
            p90_ms: if empty { 0.0 } else { ms(h.value_at_quantile(0.90)) },
            p99_ms: if empty { 0.0 } else { ms(h.value_at_quantile(0.99)) },
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub count: u64,
    pub errors: u64,
    pub mean_ms: f64,
    pub max_ms: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
}

/// Per-operation statistics cut into windows of `window_us` from the start of steady state.
#[derive(Debug, Clone)]
pub struct Windows {
    pub window_us: u64,
    pub ops: usize,
    /// windows[w][op]
    pub windows: Vec<Vec<OpStats>>,
}

impl Windows {
    pub fn new(ops: usize, window_us: u64) -> Windows {
        assert!(window_us > 0);
        Windows { window_us, ops, windows: Vec::new() }
    }

    /// The stats of operation `op` for a response that *started* `at_us` after steady state
    /// began (Faban assigns an operation to the window it started in).
    pub fn at(&mut self, at_us: u64, op: usize) -> &mut OpStats {
        let w = (at_us / self.window_us) as usize;
        while self.windows.len() <= w {
            self.windows.push((0..self.ops).map(|_| OpStats::default()).collect());
        }
        &mut self.windows[w][op]
    }

    /// Add another agent's windows to these, window by window.
    pub fn merge(&mut self, other: &Windows) {
        assert_eq!((self.ops, self.window_us), (other.ops, other.window_us), "merging windows of different shapes");
        for (w, ops) in other.windows.iter().enumerate() {
            for (op, stats) in ops.iter().enumerate() {
                self.at(w as u64 * self.window_us, op).add(stats);
            }
        }
    }

    /// Each operation over every window.
    pub fn total(&self) -> Vec<OpStats> {
        let mut total: Vec<OpStats> = (0..self.ops).map(|_| OpStats::default()).collect();
        for ops in &self.windows {
            for (op, s) in ops.iter().enumerate() {
                total[op].add(s);
            }
        }
        total
    }

    /// A form that crosses process boundaries: each histogram in HdrHistogram's V2 deflate
    /// encoding (base64), so a controller merges agents' histograms exactly.
    pub fn to_wire(&self) -> Result<WireWindows> {
        let mut windows = Vec::with_capacity(self.windows.len());
        for ops in &self.windows {
            let mut row = Vec::with_capacity(ops.len());
            for s in ops {
                row.push(WireStats { hist: encode_histogram(&s.hist)?, errors: s.errors.clone() });
            }
            windows.push(row);
        }
        Ok(WireWindows { window_us: self.window_us, ops: self.ops, windows })
    }

    pub fn from_wire(wire: &WireWindows) -> Result<Windows> {
        let mut out = Windows::new(wire.ops, wire.window_us);
        for (w, row) in wire.windows.iter().enumerate() {
            anyhow::ensure!(row.len() == wire.ops, "window {w} has {} operations, not {}", row.len(), wire.ops);
            for (op, s) in row.iter().enumerate() {
                let h = decode_histogram(&s.hist).with_context(|| format!("window {w}, operation {op}"))?;
                let stats = out.at(w as u64 * wire.window_us, op);
                stats.hist.add(&h).map_err(|e| anyhow::anyhow!("a histogram out of bounds: {e:?}"))?;
                stats.errors = s.errors.clone();
            }
        }
        Ok(out)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WireStats {
    pub hist: String,
    pub errors: BTreeMap<String, u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WireWindows {
    pub window_us: u64,
    pub ops: usize,
    pub windows: Vec<Vec<WireStats>>,
}

/// A histogram in HdrHistogram's V2 deflate encoding, as base64 (what crosses from agents to
/// their controller).
pub fn encode_histogram(hist: &Histogram<u64>) -> Result<String> {
    let mut buf = Vec::new();
    V2DeflateSerializer::new().serialize(hist, &mut buf).map_err(|e| anyhow::anyhow!("encoding a histogram: {e:?}"))?;
    Ok(base64_encode(&buf))
}

/// The histogram [`encode_histogram`] encoded, with the bounds and precision it had.
pub fn decode_histogram(text: &str) -> Result<Histogram<u64>> {
    let bytes = base64_decode(text)?;
    Deserializer::new().deserialize(&mut &bytes[..]).map_err(|e| anyhow::anyhow!("decoding a histogram: {e:?}"))
}

fn base64_encode(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn base64_decode(text: &str) -> Result<Vec<u8>> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.decode(text).context("a histogram that is not base64")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_known_inputs() {
        let mut s = OpStats::default();
        for ms in 1..=1000u64 {
            s.record(ms * 1000);
        }
        let sum = s.summary();
        assert_eq!(sum.count, 1000);
        // 3 significant digits: within 0.1%.
        assert!((sum.p90_ms - 900.0).abs() <= 1.0, "{sum:?}");
        assert!((sum.p99_ms - 990.0).abs() <= 1.0, "{sum:?}");
        assert!((sum.mean_ms - 500.5).abs() <= 0.5, "{sum:?}");
        assert!((sum.max_ms - 1000.0).abs() <= 1.0, "{sum:?}");
    }

    #[test]
    fn responses_land_in_the_window_they_started_in() {
        let mut w = Windows::new(2, 1_000_000);
        w.at(999_999, 0).record(5);
        w.at(1_000_000, 0).record(7);
        w.at(2_500_000, 1).error("http 500");
        assert_eq!(w.windows.len(), 3);
        assert_eq!(w.windows[0][0].hist.len(), 1);
        assert_eq!(w.windows[1][0].hist.len(), 1);
        assert_eq!(w.windows[2][1].errors["http 500"], 1);
        assert_eq!(w.total()[0].hist.len(), 2);
    }

    #[test]
    fn merged_agents_equal_one_recorder_exactly() {
        // Two agents see different halves of one run: merging their histograms gives exactly
        // the percentiles of the whole, where averaging their percentiles would not.
        let (mut a, mut b, mut whole) = (Windows::new(1, 60_000_000), Windows::new(1, 60_000_000), Windows::new(1, 60_000_000));
        for i in 0..10_000u64 {
            let us = if i % 2 == 0 { 1_000 + i } else { 200_000 + 7 * i };
            let t = i * 10_000;
            if i % 2 == 0 {
                a.at(t, 0).record(us)
            } else {
                b.at(t, 0).record(us)
            }
            whole.at(t, 0).record(us);
        }
        a.at(0, 0).error("timeout");
        b.at(0, 0).error("timeout");
        let mut merged = Windows::from_wire(&a.to_wire().unwrap()).unwrap();
        merged.merge(&Windows::from_wire(&serde_json::from_str(&serde_json::to_string(&b.to_wire().unwrap()).unwrap()).unwrap()).unwrap());
        for w in 0..whole.windows.len() {
            assert_eq!(merged.windows[w][0].hist, whole.windows[w][0].hist);
        }
        assert_eq!(merged.total()[0].summary().p90_ms, whole.total()[0].summary().p90_ms);
        assert_eq!(merged.total()[0].errors["timeout"], 2);
        let averaged = (a.total()[0].summary().p90_ms + b.total()[0].summary().p90_ms) / 2.0;
        assert_ne!(averaged, whole.total()[0].summary().p90_ms);
    }

    #[test]
    fn garbage_on_the_wire_is_an_error() {
        let wire =
            WireWindows { window_us: 1, ops: 1, windows: vec![vec![WireStats { hist: "not base64!".into(), errors: BTreeMap::new() }]] };
        assert!(Windows::from_wire(&wire).is_err());
        let wire = WireWindows { window_us: 1, ops: 1, windows: vec![vec![WireStats { hist: "AAAA".into(), errors: BTreeMap::new() }]] };
        assert!(Windows::from_wire(&wire).is_err());
    }
}
