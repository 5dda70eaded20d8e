//! SOCK figure 21, the image-resizing case study: a lambda reads an image (a 1024x768 bitmap
//! shipped with its code: the stand-in for the paper's S3 download), makes a thumbnail with
//! Pillow and returns it as a JPEG, timing its own work. Three cases, with every cache on and
//! Pillow in the install cache:
//!
//! * cold: the lambda's first request on a fresh worker (no Zygote holds Pillow yet);
//! * cold+: a newly uploaded lambda's first request after another Pillow lambda ran (its
//!   Zygote holds Pillow);
//! * warm: a request to a lambda whose handler is paused in the handler cache.
//!
//! Platform time is the request's latency less the handler's own work.

use anyhow::{bail, Result};
use serde_json::{json, Value};

use super::phase::{as_refs, Bench, Caches, PACKAGES};
use super::sample::percentile;
use crate::worker::BenchWorker;

const SOURCE: &str = r#"import base64
import io
import time

from PIL import Image


def f(event):
    started = time.perf_counter()
    image = Image.open("/handler/image.bmp")
    image.thumbnail((256, 256))
    out = io.BytesIO()
    image.convert("RGB").save(out, "JPEG", quality=85)
    return {"jpeg": base64.b64encode(out.getvalue()).decode(), "size": list(image.size),
            "compute_ms": (time.perf_counter() - started) * 1000}
"#;

/// A 1024x768 24-bit BMP with a colour gradient.
fn bitmap() -> Vec<u8> {
    let (w, h) = (1024u32, 768u32);
    let row = (w * 3).div_ceil(4) * 4;
    let size = 54 + row * h;
    let mut b = Vec::with_capacity(size as usize);
    b.extend_from_slice(b"BM");
    for v in [size, 0, 54, 40] {
        b.extend_from_slice(&v.to_le_bytes());
    }
    b.extend_from_slice(&(w as i32).to_le_bytes());
    b.extend_from_slice(&(h as i32).to_le_bytes());
    b.extend_from_slice(&1u16.to_le_bytes());
    b.extend_from_slice(&24u16.to_le_bytes());
    for v in [0u32, row * h, 2835, 2835, 0, 0] {
        b.extend_from_slice(&v.to_le_bytes());
    }
    for y in 0..h {
        for x in 0..w {
            b.extend_from_slice(&[(x % 256) as u8, (y % 256) as u8, ((x ^ y) % 256) as u8]);
        }
        b.resize(b.len() + (row - w * 3) as usize, 0);
    }
    b
}

fn call(worker: &BenchWorker, lambda: &str, body: &[u8], expect: &str) -> Result<(f64, f64)> {
    let reply = worker.invoke(lambda, body)?;
    if reply.status != 200 || reply.start != expect {
        bail!("{lambda}: {} {} {}", reply.status, reply.start, String::from_utf8_lossy(&reply.body[..reply.body.len().min(500)]));
    }
    let compute = reply.json()["compute_ms"].as_f64().unwrap_or(0.0);
    Ok((reply.ms, compute))
}

fn case(samples: &[(f64, f64)]) -> Value {
    let total: Vec<f64> = samples.iter().map(|s| s.0).collect();
    let compute: Vec<f64> = samples.iter().map(|s| s.1).collect();
    let platform: Vec<f64> = samples.iter().map(|s| s.0 - s.1).collect();
    json!({
        "samples": samples.len(),
        "p50_ms": percentile(&total, 0.5),
        "compute_p50_ms": percentile(&compute, 0.5),
        "platform_p50_ms": percentile(&platform, 0.5),
        "mean_ms": total.iter().sum::<f64>() / total.len().max(1) as f64,
        "platform_mean_ms": platform.iter().sum::<f64>() / platform.len().max(1) as f64,
    })
}

pub fn run(bench: &Bench) -> Result<Value> {
    let (_, requirement, _) = PACKAGES[4];
    bench.preinstall(requirement)?;
    let quick = bench.opts.quick;
    let body = b"null".to_vec();
    let files = vec![
        ("f.py".to_string(), SOURCE.as_bytes().to_vec()),
        ("requirements.txt".to_string(), format!("{requirement}\n").into_bytes()),
        ("image.bmp".to_string(), bitmap()),
    ];
    let config = bench.config(Caches::ALL, 1024, "");

    let mut cold = Vec::new();
    for i in 0..(if quick { 2 } else { 5 }) {
        let worker = bench.start("resize-cold", &config)?;
        let sample = worker.upload("resize", &as_refs(&files)).and_then(|_| call(&worker, "resize", &body, "cold"));
        worker.stop()?;
        cold.push(sample?);
        eprintln!("  cold {i}: {:.1} ms", cold.last().unwrap().0);
    }
    let worker = bench.start("resize-warm", &config)?;
    let result = (|| {
        worker.upload("other", &as_refs(&files))?;
        call(&worker, "other", &body, "cold")?;
        let mut cold_plus = Vec::new();
        for i in 0..(if quick { 5 } else { 20 }) {
            worker.upload(&format!("resize{i}"), &as_refs(&files))?;
            cold_plus.push(call(&worker, &format!("resize{i}"), &body, "cold")?);
        }
        let mut warm = Vec::new();
        for _ in 0..(if quick { 10 } else { 50 }) {
            warm.push(call(&worker, "resize0", &body, "warm")?);
        }
        anyhow::Ok((cold_plus, warm))
    })();
    worker.stop()?;
    let (cold_plus, warm) = result?;
    let out = json!({
        "image": "1024x768 24-bit BMP shipped with the lambda's code (2.4 MB), read by the handler; 256x192 JPEG thumbnail out, base64 in JSON",
        "requirement": requirement,
        "cold": case(&cold),
        "cold+": case(&cold_plus),
        "warm": case(&warm),
    });
    for c in ["cold", "cold+", "warm"] {
        eprintln!(
            "  {c:>5}: total p50 {:.1} ms, platform p50 {:.1} ms",
            out[c]["p50_ms"].as_f64().unwrap_or(0.0),
            out[c]["platform_p50_ms"].as_f64().unwrap_or(0.0)
        );
    }
    Ok(out)
}
