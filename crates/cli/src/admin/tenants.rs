//! `sprout tenants ls|add|rm` and `sprout keys add|ls|revoke`: the operator's verbs over the
//! worker's `/tenants` routes.

use anyhow::Result;
use serde_json::{json, Value};

use super::{emit, now, parse, pretty, segment, Endpoint, Worker, TIMEOUT};

/// `sprout tenants ls`.
pub fn tenants_ls(endpoint: &Endpoint) -> Result<()> {
    let raw = Worker::new(endpoint, TIMEOUT).get("/tenants")?;
    if endpoint.json {
        return emit(&format!("{}\n", pretty(&raw)));
    }
    let tenants = parse(&raw)?;
    let mut out = format!("{:<24} {:>8} {:>6}\n", "TENANT", "LAMBDAS", "KEYS");
    for t in tenants.as_array().into_iter().flatten() {
        out += &format!("{:<24} {:>8} {:>6}\n", t["name"].as_str().unwrap_or("?"), t["lambdas"], t["keys"]);
    }
    emit(&out)
}

/// `sprout tenants add NAME`.
pub fn tenants_add(endpoint: &Endpoint, name: &str) -> Result<()> {
    let (_, raw) = Worker::new(endpoint, TIMEOUT).call("POST", "/tenants", Some(&json!({"name": name})))?;
    if endpoint.json {
        return emit(&format!("{}\n", pretty(&raw)));
    }
    emit(&format!("added tenant {name}; issue it a key: sprout keys add {name}\n"))
}

/// `sprout tenants rm NAME`.
pub fn tenants_rm(endpoint: &Endpoint, name: &str) -> Result<()> {
    let (_, raw) = Worker::new(endpoint, TIMEOUT).call("DELETE", &format!("/tenants/{}", segment(name)), None)?;
    if endpoint.json {
        return emit(&format!("{}\n", pretty(&raw)));
    }
    emit(&format!("removed tenant {name} and its keys\n"))
}

/// `sprout tenants show NAME`.
pub fn tenants_show(endpoint: &Endpoint, name: &str) -> Result<()> {
    let raw = Worker::new(endpoint, TIMEOUT).get(&format!("/tenants/{}", segment(name)))?;
    if endpoint.json {
        return emit(&format!("{}\n", pretty(&raw)));
    }
    let t = parse(&raw)?;
    let lambdas: Vec<&str> = t["lambdas"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    emit(&format!(
        "tenant {name}\nlambdas   {}\nkeys      {} live\nquotas    {}\nin flight {}\nrefused   {}\n",
        if lambdas.is_empty() { "(none)".to_string() } else { lambdas.join(", ") },
        t["keys"],
        describe_quotas(&t["quotas"]),
        t["usage"]["in_flight"],
        t["usage"]["refused"],
    ))
}

/// A tenant's quotas as flags (each left out: no limit), sent as `PUT /tenants/<t>/quotas`'s body.
#[derive(clap::Args, serde::Serialize, Debug)]
pub struct QuotaArgs {
    /// Lambdas it may own.
    #[arg(long)]
    lambdas: Option<u64>,
    /// Its lambdas' archives together, in MB.
    #[arg(long)]
    code_mb: Option<u64>,
    /// Invocations from outside a second (a burst of one second's worth).
    #[arg(long)]
    invocations_per_s: Option<f64>,
    /// Its invocations in flight at once.
    #[arg(long)]
    concurrent: Option<u64>,
    /// Its invocations in flight's memory, each counted at a sandbox's limit, in MB.
    #[arg(long)]
    memory_mb: Option<u64>,
    /// Its lambdas' output together, KB a second (past it: dropped and counted).
    #[arg(long)]
    log_kb_s: Option<u64>,
    /// Its blobs and leases' files together, in MB.
    #[arg(long)]
    files_mb: Option<u64>,
}

/// `sprout tenants quota NAME [--lambdas N] [--code-mb N] [--invocations-per-s R] [--concurrent N]
/// [--memory-mb N] [--log-kb-s N] [--files-mb N]`.
pub fn tenants_quota(endpoint: &Endpoint, name: &str, quotas: &Value) -> Result<()> {
    let set: serde_json::Map<String, Value> =
        quotas.as_object().into_iter().flatten().filter(|(_, v)| !v.is_null()).map(|(k, v)| (k.clone(), v.clone())).collect();
    let path = format!("/tenants/{}/quotas", segment(name));
    let (_, raw) = Worker::new(endpoint, TIMEOUT).call("PUT", &path, Some(&Value::Object(set)))?;
    if endpoint.json {
        return emit(&format!("{}\n", pretty(&raw)));
    }
    emit(&format!("tenant {name}: {}\n", describe_quotas(&parse(&raw)?["quotas"])))
}

/// A tenant's quotas in words.
fn describe_quotas(quotas: &Value) -> String {
    let set: Vec<String> = quotas.as_object().into_iter().flatten().map(|(k, v)| format!("{k} {v}")).collect();
    if set.is_empty() {
        "no limits".to_string()
    } else {
        set.join(", ")
    }
}

/// What `sprout keys add` asks for.
pub struct NewKey<'a> {
    pub read_only: bool,
    pub lambdas: &'a [String],
    pub expires_in_s: Option<u64>,
}

/// `sprout keys add TENANT [--read-only] [--lambda NAME ...] [--expires-in SECONDS]`: prints
/// the key, which is shown this once.
pub fn keys_add(endpoint: &Endpoint, tenant: &str, new: &NewKey) -> Result<()> {
    let mut body = json!({"read_only": new.read_only});
    if !new.lambdas.is_empty() {
        body["lambdas"] = json!(new.lambdas);
    }
    if let Some(s) = new.expires_in_s {
        body["expires_in_s"] = json!(s);
    }
    let (_, raw) = Worker::new(endpoint, TIMEOUT).call("POST", &format!("/tenants/{}/keys", segment(tenant)), Some(&body))?;
    if endpoint.json {
        return emit(&format!("{}\n", pretty(&raw)));
    }
    let reply = parse(&raw)?;
    emit(&format!(
        "{}\nkey {} of tenant {tenant} ({}): keep it now, it is not shown again\n",
        reply["key"].as_str().unwrap_or("?"),
        reply["id"].as_str().unwrap_or("?"),
        describe(&reply, now())
    ))
}

/// `sprout keys ls TENANT`.
pub fn keys_ls(endpoint: &Endpoint, tenant: &str) -> Result<()> {
    let raw = Worker::new(endpoint, TIMEOUT).get(&format!("/tenants/{}/keys", segment(tenant)))?;
    if endpoint.json {
        return emit(&format!("{}\n", pretty(&raw)));
    }
    let mut out = format!("{:<18} {}\n", "KEY", "SCOPE");
    for key in parse(&raw)?.as_array().into_iter().flatten() {
        out += &format!("{:<18} {}\n", key["id"].as_str().unwrap_or("?"), describe(key, now()));
    }
    emit(&out)
}

/// `sprout keys revoke TENANT ID`.
pub fn keys_revoke(endpoint: &Endpoint, tenant: &str, id: &str) -> Result<()> {
    let path = format!("/tenants/{}/keys/{}", segment(tenant), segment(id));
    let (_, raw) = Worker::new(endpoint, TIMEOUT).call("DELETE", &path, None)?;
    if endpoint.json {
        return emit(&format!("{}\n", pretty(&raw)));
    }
    emit(&format!("revoked key {id} of tenant {tenant}\n"))
}

/// A key's scope and state in words.
fn describe(key: &Value, now: u64) -> String {
    let mut words = vec![if key["read_only"].as_bool() == Some(true) { "read-only" } else { "read-write" }.to_string()];
    match key["lambdas"].as_array() {
        Some(names) => words.push(format!("lambdas {}", names.iter().filter_map(Value::as_str).collect::<Vec<_>>().join(","))),
        None => words.push("all its lambdas".to_string()),
    }
    if let Some(expires) = key["expires"].as_u64() {
        words.push(if expires <= now { "expired".to_string() } else { format!("expires in {} s", expires - now) });
    }
    if key["revoked"].as_u64().is_some() {
        words.push("revoked".to_string());
    }
    words.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotas_are_described_or_said_to_be_none() {
        assert_eq!(describe_quotas(&json!({})), "no limits");
        assert_eq!(describe_quotas(&json!({"concurrent": 2, "lambdas": 3})), "concurrent 2, lambdas 3");
    }

    #[test]
    fn a_key_is_described_by_its_scope_and_state() {
        assert_eq!(describe(&json!({"id": "k", "read_only": false}), 10), "read-write, all its lambdas");
        let narrow = json!({"read_only": true, "lambdas": ["a", "b"], "expires": 70, "revoked": 5});
        assert_eq!(describe(&narrow, 10), "read-only, lambdas a,b, expires in 60 s, revoked");
        assert_eq!(describe(&json!({"expires": 10}), 10), "read-write, all its lambdas, expired");
    }
}
