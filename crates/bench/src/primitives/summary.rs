//! The primitives' results summed up: ratios of rates, and the markdown table.

use std::fmt::Write as _;

use serde_json::{json, Value};

use super::measure::{c_key, round};
use super::namespaces::NAMESPACE_SETS;
use crate::report::get;

fn ratio(a: Option<f64>, b: Option<f64>) -> Value {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => json!(round(a / b, 2)),
        _ => Value::Null,
    }
}

/// Ratios of rates at concurrency `c`; the mount-namespace one at `c_low` (the lowest).
pub(super) fn ratios(storage: &Value, mount_ns: &Value, ns: &Value, cg: &Value, net: &Value, c: usize, c_low: usize) -> Value {
    let k = c_key(c);
    let ns_at = |name: &str| get(ns, &[name, &k]);
    let first_c1 = mount_ns.get(c_key(c_low)).and_then(Value::as_array).cloned().unwrap_or_default();
    json!({
        "bind_over_overlay": ratio(get(storage, &["bind", &k]), get(storage, &["overlay", &k])),
        "bind_over_overlay_ro": ratio(get(storage, &["bind", &k]), get(storage, &["overlay_ro", &k])),
        "reuse_over_create": ratio(get(cg, &["reuse", &k]), get(cg, &["create", &k])),
        "netns_join_over_make": ratio(get(net, &["join", &k]), get(net, &["make", &k])),
        "sock_over_all": ratio(ns_at("sock"), ns_at("all")),
        "no_net_over_net": ratio(ns_at("no_net"), ns_at("all")),
        "none_over_net": ratio(ns_at("none"), ns_at("net")),
        "none_over_sock": ratio(ns_at("none"), ns_at("sock")),
        "none_over_mnt": ratio(ns_at("none"), ns_at("mnt")),
        "mount_ns_0_over_max_mounts": ratio(
            first_c1.first().and_then(Value::as_f64),
            first_c1.last().and_then(Value::as_f64)
        ),
    })
}

pub(super) fn markdown(json: &Value, conc: &[usize]) -> String {
    let (c1, cn) = (conc[0], *conc.last().unwrap());
    let (k1, kn) = (c_key(c1), c_key(cn));
    let fmt = |v: Option<f64>| v.map(|x| format!("{x:.0}")).unwrap_or_else(|| "–".into());
    let mut md = String::new();
    let load = json["loadavg_start"][0].as_f64().map(|x| format!("{x:.2}")).unwrap_or_else(|| "?".into());
    let _ = writeln!(
        md,
        "Machine: {}; {} s per point; load average {load} before the run.\n",
        json["machine"].as_str().unwrap_or(""),
        json["seconds_per_point"],
    );
    let _ = writeln!(md, "| measurement (ops/s) | c={c1} | c={cn} |");
    let _ = writeln!(md, "|---|---:|---:|");
    let mut row = |label: &str, a: Option<f64>, b: Option<f64>| {
        let _ = writeln!(md, "| {label} | {} | {} |", fmt(a), fmt(b));
    };
    for (key, label) in [
        ("bind", "bind mount + unmount"),
        ("overlay", "overlay (writable) mount + unmount"),
        ("overlay_ro", "overlay (read-only) mount + unmount"),
    ] {
        row(label, get(json, &["storage", key, &k1]), get(json, &["storage", key, &kn]));
    }
    let mns = &json["mount_ns"];
    if let Some(counts) = mns["mounts"].as_array() {
        for (i, n) in counts.iter().enumerate() {
            let at = |k: &str| mns[k].get(i).and_then(Value::as_f64);
            row(&format!("unshare(mnt) churn, {n} extra mounts"), at(&k1), at(&kn));
        }
    }
    for (name, _) in NAMESPACE_SETS {
        let label = match name {
            "none" => "fork + exit (no namespace)".to_string(),
            "sock" => "unshare pid+ipc+uts (sock)".to_string(),
            "no_net" => "unshare pid+ipc+uts+mnt".to_string(),
            "all" => "unshare pid+ipc+uts+mnt+net (all)".to_string(),
            other => format!("unshare {other}"),
        };
        row(&label, get(json, &["namespaces", name, &k1]), get(json, &["namespaces", name, &kn]));
    }
    row("cgroup create + join + remove", get(json, &["cgroups", "create", &k1]), get(json, &["cgroups", "create", &kn]));
    row("cgroup reuse (join only)", get(json, &["cgroups", "reuse", &k1]), get(json, &["cgroups", "reuse", &kn]));
    row("network namespace made (veth, routes) + deleted", get(json, &["network", "make", &k1]), get(json, &["network", "make", &kn]));
    row("network namespace joined (setns, pooled)", get(json, &["network", "join", &k1]), get(json, &["network", "join", &kn]));
    let r = |k: &str| json["ratios"][k].as_f64().map(|x| format!("{x:.2}×")).unwrap_or_else(|| "–".into());
    let _ = writeln!(
        md,
        "\nRatios at c={cn}: bind/overlay {} (read-only overlay {}), cgroup reuse/create {}, network namespace join/make {}, \
         sock/all namespaces {}, all-but-net/all {}, fork/net {}; unshare(mnt) with 0 / {} extra mounts (c={c1}) {}.",
        r("bind_over_overlay"),
        r("bind_over_overlay_ro"),
        r("reuse_over_create"),
        r("netns_join_over_make"),
        r("sock_over_all"),
        r("no_net_over_net"),
        r("none_over_net"),
        mns["mounts"].as_array().and_then(|a| a.last()).cloned().unwrap_or(Value::Null),
        r("mount_ns_0_over_max_mounts"),
    );
    md
}
