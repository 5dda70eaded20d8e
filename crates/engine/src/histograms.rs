//! Latency histograms, shared by what counts times: Prometheus buckets for `/metrics`, and
//! HdrHistograms of microseconds with the percentiles `/stats` shows.

use hdrhistogram::Histogram as Hdr;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use serde_json::{json, Value};

/// Request and start times' Prometheus buckets: 0.2 ms to 26 s, doubling.
pub fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0002, 2.0, 18))
}

/// An HdrHistogram of microseconds up to an hour, for the percentiles of `/stats`.
pub fn microsecond_hdr() -> Hdr<u64> {
    Hdr::new_with_bounds(1, 3_600_000_000, 3).expect("histogram bounds")
}

/// A histogram of microseconds as `/stats` shows it, in milliseconds.
pub fn summary(h: &Hdr<u64>) -> Value {
    let ms = |v: u64| (v as f64) / 1000.0;
    json!({
        "count": h.len(),
        "p50_ms": ms(h.value_at_quantile(0.5)),
        "p90_ms": ms(h.value_at_quantile(0.9)),
        "p99_ms": ms(h.value_at_quantile(0.99)),
        "max_ms": ms(h.max()),
        "mean_ms": h.mean() / 1000.0,
    })
}
