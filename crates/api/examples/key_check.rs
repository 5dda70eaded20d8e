//! The worker's side of a key check alone, timed: `Guard::may_invoke` for a lambda that wants a
//! key, with the tenant's key in `Authorization`, among 100 tenants of 3 keys each, run
//! N times; prints nanoseconds per check as JSON. `bench/key_check.py` runs it beside its
//! end-to-end rounds. `cargo run --release -p sprout-api --example key_check [N]`.

use std::sync::Arc;
use std::time::Instant;

use axum::http::{header, HeaderMap, HeaderValue};
use sprout_api::auth::tenants::Scope;
use sprout_api::{Guard, Tenants, Token};

fn main() -> anyhow::Result<()> {
    let n: u32 = std::env::args().nth(1).map(|a| a.parse()).transpose()?.unwrap_or(200_000);
    let tenants = Arc::new(Tenants::in_memory());
    let mut key = String::new();
    for t in 0..100 {
        let name = format!("tenant-{t}");
        tenants.add(&name, 0).map_err(|e| anyhow::anyhow!("{e}"))?;
        for _ in 0..3 {
            key = tenants.issue(&name, Scope::default(), 0).map_err(|e| anyhow::anyhow!("{e}"))?.key;
        }
        tenants.claim(&format!("fn-{t}"), &name, false).map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    let guard = Guard::new(Token::generate()?, true, "127.0.0.1:5000", tenants.clone());
    let mut headers = HeaderMap::new();
    headers.insert(header::AUTHORIZATION, HeaderValue::from_str(&format!("Bearer {key}"))?);
    let check = |headers: &HeaderMap| {
        let owner = tenants.owner("fn-99");
        guard.may_invoke(headers, "fn-99", owner.as_deref()).is_ok()
    };
    assert!(check(&headers), "the last tenant's key may invoke its lambda");
    let started = Instant::now();
    let mut allowed = 0u32;
    for _ in 0..n {
        allowed += u32::from(check(std::hint::black_box(&headers)));
    }
    let ns = started.elapsed().as_nanos() as f64 / f64::from(n);
    assert_eq!(allowed, n);
    println!("{{\"checks\": {n}, \"ns_per_check\": {ns:.1}, \"tenants\": 100, \"keys_each\": 3}}");
    Ok(())
}
