//! Figures as the progress lines and the tables show them: ratios, milliseconds, MiB.

use serde_json::Value;

pub(super) fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

pub(super) fn f(v: &Value) -> Option<f64> {
    v.as_f64()
}

pub(super) fn fmt_ms(v: &Value) -> String {
    f(v).map(|x| format!("{x:.3}")).unwrap_or_else(|| "—".into())
}

pub(super) fn fmt_x(v: &Value) -> String {
    f(v).map(|x| format!("{x:.2}×")).unwrap_or_else(|| "—".into())
}

pub(super) fn fmt_mib(v: &Value) -> String {
    f(v).map(|x| format!("{:.1}", x / (1u64 << 20) as f64)).unwrap_or_else(|| "—".into())
}

/// A phase's progress line.
pub(super) fn progress(p: &Value) -> String {
    let v = &p["victim"];
    let mut line = format!(
        "victim: {} warm calls, p50 {} ms, p99 {} ms, {} errors, {} not warm",
        v["calls"],
        fmt_ms(&v["p50_ms"]),
        fmt_ms(&v["p99_ms"]),
        v["errors"],
        v["not_warm"]
    );
    let n = &p["neighbour_calls"];
    if !n.is_null() {
        line += &format!(" | neighbour: {} calls, p50 {} ms, {} errors", n["calls"], fmt_ms(&n["p50_ms"]), n["errors"]);
        if n["refused"].as_u64().unwrap_or(0) > 0 {
            line += &format!(", {} refused by its quota", n["refused"]);
        }
    }
    let o = &p["output"];
    if !o.is_null() {
        line += &format!(
            " | {:.1} MB/s, logs {} MiB (most {}), {} lines dropped",
            f(&o["mb_s"]).unwrap_or(f64::NAN),
            fmt_mib(&o["log_bytes_after"]),
            fmt_mib(&o["log_bytes_max"]),
            o["dropped_lines"]
        );
    }
    line
}
