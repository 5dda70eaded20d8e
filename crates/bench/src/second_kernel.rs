//! gVisor's column of `sprout bench sandboxes` judged: its head-to-head rounds against the
//! isolated lean sandbox ([`crate::isolation::SECOND_KERNEL`]) and its targets (a cold start in
//! a running pod, a lambda's first, warm invocations, an idle lambda's memory).

use serde_json::{json, Value};

use crate::report::get;

/// Add the head-to-head results (if run) and gVisor's targets (if it was measured).
pub fn add(results: &mut Value, head_to_head: Value) {
    let b = results["backends"].clone();
    if b.get("gvisor").is_none_or(|g| g.get("skipped").is_some()) {
        return;
    }
    let ratio = |x: Option<f64>, y: Option<f64>| match (x, y) {
        (Some(x), Some(y)) if y > 0.0 => Some(x / y),
        _ => None,
    };
    let warm_ratio = head_to_head["gvisor_over_isolated"]["warm_p50"]
        .as_f64()
        .or_else(|| ratio(get(&b, &["gvisor", "warm_p50_ms"]), get(&b, &["sock-isolated", "warm_p50_ms"])));
    let lean_idle = get(&b, &["sock-isolated", "idle_pss_mib"]).or_else(|| get(&b, &["sock", "idle_pss_mib"]));
    let extra_idle = get(&b, &["gvisor", "idle_pss_mib"]).zip(lean_idle).map(|(g, l)| g - l);
    let paced_rate = get(&b, &["gvisor", "paced", "per_s"]).unwrap_or(0.0);
    let targets = [
        (
            format!("gvisor: cold start in a running pod p50 <= 5 ms at {paced_rate:.0}/s paced"),
            get(&b, &["gvisor", "paced", "cold_p50_ms"]),
            Box::new(|x: f64| x <= 5.0) as Box<dyn Fn(f64) -> bool>,
        ),
        (
            "gvisor: cold start in a running pod p50 <= 20 ms at concurrency 1".into(),
            get(&b, &["gvisor", "c1", "cold_p50_ms"]),
            Box::new(|x| x <= 20.0),
        ),
        (
            "gvisor: >= 60 cold starts/s at concurrency 10 on one core".into(),
            get(&b, &["gvisor", "c10", "cold_per_s"]),
            Box::new(|x| x >= 60.0),
        ),
        ("gvisor: a lambda's first cold start p50 <= 60 ms".into(), get(&b, &["gvisor", "first_cold_p50_ms"]), Box::new(|x| x <= 60.0)),
        ("gvisor: warm invocation p50 <= 2x the isolated lean sandbox's".into(), warm_ratio, Box::new(|x| x <= 2.0)),
        ("gvisor: an idle lambda costs <= 32 MiB PSS more than a lean one (MiB more)".into(), extra_idle, Box::new(|x| x <= 32.0)),
        (
            "gvisor: a parked pod's next request (its restore) p99 <= 300 ms".into(),
            get(&b, &["gvisor", "park", "restore_parked_p99_ms"]),
            Box::new(|x| x <= 300.0),
        ),
        (
            "gvisor: a parked pod holds no memory (MiB PSS one more parked pod adds)".into(),
            get(&b, &["gvisor", "park", "parked_pss_mib"]),
            Box::new(|x| x <= 1.0),
        ),
    ];
    let list = results["targets"].as_array_mut().expect("targets");
    for (name, measured, met) in targets {
        list.push(json!({"target": name, "measured": measured, "met": measured.map(met)}));
    }
    if !head_to_head.is_null() {
        results["second_kernel"] = head_to_head;
    }
}
