//! What isolating sandboxes costs, head to head: SOCK's lean sandbox (`sock`: the host's
//! network, no seccomp) against the isolated one (`sock-isolated`: a network namespace per
//! lambda, joined in the fork protocol, and seccomp filters), part of `sprout bench sandboxes`.
//!
//! Four workers run at once, all pinned to the worker CPU (two keep no sandbox, for cold
//! starts; two keep one, for warm invocations and service round trips). Rounds alternate
//! which variant goes first; each round measures, per variant, cold starts and warm
//! invocations of a no-op lambda at concurrency 1, and from inside a warm sandbox the round
//! trip to a TCP echo service (the benchmark's, on the load generator's CPU) on one kept
//! connection and over a new connection each time. The medians of the rounds' p50s are
//! compared, so the host's drift between rounds touches both variants alike. The same rounds
//! put the isolated lean sandbox against gVisor's ([`SECOND_KERNEL`]).

use std::time::Duration;

use anyhow::Result;
use serde_json::{json, Value};

use crate::load_loop::closed_loop;
use crate::report::median;
use crate::sandbox_worker::{Options, Worker};

pub const VARIANTS: [&str; 2] = ["sock", "sock-isolated"];
/// The default lean sandbox against a lambda's gVisor sandbox: what a second kernel costs.
pub const SECOND_KERNEL: [&str; 2] = ["sock-isolated", "gvisor"];

/// Round trips from inside the sandbox to the echo service: on one connection, and each over
/// a new connection; percentiles in microseconds.
const RTT_LAMBDA: &str = r#"import socket, time, sprout

def f(event):
    host, port = sprout.service("echo")
    msg = b"x" * 64

    def exchange(s):
        s.sendall(msg)
        got = 0
        while got < len(msg):
            got += len(s.recv(4096))

    kept = socket.create_connection((host, port))
    kept.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    rtt = []
    for _ in range(event["round_trips"]):
        t = time.perf_counter_ns()
        exchange(kept)
        rtt.append(time.perf_counter_ns() - t)
    kept.close()
    fresh = []
    for _ in range(event["connections"]):
        t = time.perf_counter_ns()
        with socket.create_connection((host, port)) as s:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            exchange(s)
        fresh.append(time.perf_counter_ns() - t)
    q = lambda xs, p: sorted(xs)[min(len(xs) - 1, int(p * len(xs)))] / 1000
    return {"rtt_p50_us": q(rtt, 0.5), "rtt_p99_us": q(rtt, 0.99), "connect_p50_us": q(fresh, 0.5), "connect_p99_us": q(fresh, 0.99)}
"#;

fn deploy_rtt(opts: &Options, worker: &Worker) -> Result<()> {
    let dir = opts.work_dir.join("rtt-lambda");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("f.py"), RTT_LAMBDA)?;
    worker.deploy(opts, &dir, "rtt")
}

fn round_trips(url: &str) -> Result<Value> {
    let reply = ureq::post(&format!("{url}/run/rtt"))
        .timeout(Duration::from_secs(120))
        .send_string(r#"{"round_trips": 2000, "connections": 200}"#)?;
    Ok(serde_json::from_str(&reply.into_string()?)?)
}

/// Run the alternating rounds of `variants`; ports from `base_port` (four in a row). The
/// ratios of the second to the first are under `ratio_key`.
pub async fn compare(opts: &Options, base_port: u16, rounds: usize, variants: [&str; 2], ratio_key: &str) -> Result<Value> {
    let seconds = Duration::from_secs_f64((opts.seconds / 2.0).max(1.0));
    let mut workers = Vec::new();
    for (i, variant) in variants.iter().enumerate() {
        let cold = Worker::start(opts, variant, false, base_port + 2 * i as u16)?;
        let warm = Worker::start(opts, variant, true, base_port + 2 * i as u16 + 1)?;
        deploy_rtt(opts, &warm)?;
        workers.push((variant.to_string(), cold, warm));
    }
    let result = async {
        let mut samples: Vec<Vec<(f64, f64, Value)>> = vec![Vec::new(); variants.len()];
        for round in 0..rounds {
            let order: Vec<usize> = if round % 2 == 0 { vec![0, 1] } else { vec![1, 0] };
            for i in order {
                let (name, cold, warm) = &workers[i];
                let c = closed_loop(cold.port, 1, Duration::from_millis(300), seconds, "cold", "/run/noop").await?;
                closed_loop(warm.port, 1, Duration::ZERO, Duration::from_millis(200), "", "/run/noop").await?;
                let w = closed_loop(warm.port, 1, Duration::from_millis(200), seconds, "warm", "/run/noop").await?;
                let url = warm.url();
                let rtt = tokio::task::spawn_blocking(move || round_trips(&url)).await??;
                eprintln!(
                    "  round {round} {name:>14}: cold p50 {:.2} ms, warm p50 {:.3} ms, service round trip p50 {} us, new connection p50 {} us",
                    c.ms(0.5),
                    w.ms(0.5),
                    rtt["rtt_p50_us"],
                    rtt["connect_p50_us"]
                );
                samples[i].push((c.ms(0.5), w.ms(0.5), rtt));
            }
        }
        anyhow::Ok(samples)
    }
    .await;
    for (_, cold, warm) in workers {
        cold.stop()?;
        warm.stop()?;
    }
    let samples = result?;
    let mut out = serde_json::Map::new();
    for (i, variant) in variants.iter().enumerate() {
        let s = &samples[i];
        let pick = |key: &str| median(s.iter().filter_map(|x| x.2[key].as_f64()).collect());
        out.insert(
            variant.to_string(),
            json!({
                "cold_p50_ms": median(s.iter().map(|x| x.0).collect()),
                "warm_p50_ms": median(s.iter().map(|x| x.1).collect()),
                "service_rtt_p50_us": pick("rtt_p50_us"),
                "service_rtt_p99_us": pick("rtt_p99_us"),
                "service_connect_p50_us": pick("connect_p50_us"),
                "service_connect_p99_us": pick("connect_p99_us"),
                "rounds": s.iter().map(|x| json!({"cold_p50_ms": x.0, "warm_p50_ms": x.1, "service": x.2})).collect::<Vec<_>>(),
            }),
        );
    }
    let ratio = |key: &str| match (out[variants[1]][key].as_f64(), out[variants[0]][key].as_f64()) {
        (Some(a), Some(b)) if b > 0.0 => json!(a / b),
        _ => Value::Null,
    };
    let ratios = json!({
        "cold_p50": ratio("cold_p50_ms"),
        "warm_p50": ratio("warm_p50_ms"),
        "service_rtt_p50": ratio("service_rtt_p50_us"),
        "service_connect_p50": ratio("service_connect_p50_us"),
    });
    out.insert(ratio_key.into(), ratios);
    out.insert("rounds".into(), json!(rounds));
    Ok(Value::Object(out))
}
