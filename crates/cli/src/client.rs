//! `sprout deploy`, `sprout invoke` and `sprout zygotes`: a small client of the worker's HTTP API.
//!
//! Every endpoint but `/run/...` and `/status` needs the worker's token. [`find_token`] takes
//! the one given (`--token`, or `$SPROUT_TOKEN`), else the one a worker on this machine left
//! for the URL's address in `/run/sprout/api`. `/run` never gets it: the lambda would see it.

use std::io::Read;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;

use anyhow::{bail, Context, Result};

/// Pack a lambda directory as a tar.gz, leaving out caches and version control.
pub fn pack(dir: &Path) -> Result<Vec<u8>> {
    if !dir.join("f.py").is_file() {
        bail!("{} has no f.py", dir.display());
    }
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    let mut tar = tar::Builder::new(gz);
    tar.follow_symlinks(false);
    let mut stack = vec![dir.to_path_buf()];
    while let Some(current) = stack.pop() {
        let mut entries: Vec<_> = std::fs::read_dir(&current)?.collect::<std::io::Result<_>>()?;
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let name = entry.file_name();
            if matches!(name.to_str(), Some("__pycache__" | ".git" | ".pytest_cache")) {
                continue;
            }
            let path = entry.path();
            let rel = path.strip_prefix(dir)?;
            if entry.file_type()?.is_dir() {
                tar.append_dir(rel, &path)?;
                stack.push(path);
            } else {
                tar.append_path_with_name(&path, rel)?;
            }
        }
    }
    Ok(tar.into_inner()?.finish()?)
}

/// An error of the worker's API for people: `404 lambda_not_found: no lambda named "x"
/// (request 9f3a0c1d2b4e5f60)`, with a handler's traceback or pip's words under it; a worker
/// that cannot be reached, in one line naming its URL.
pub(crate) fn explain(e: ureq::Error) -> anyhow::Error {
    match e {
        ureq::Error::Status(code, response) => {
            let header_id = response.header("X-Sprout-Request-Id").map(str::to_string);
            let body = response.into_string().unwrap_or_default();
            let parsed = serde_json::from_str::<serde_json::Value>(&body).ok().filter(|v| v.get("error").is_some());
            let request_id = parsed.as_ref().and_then(|v| v.get("request_id")).and_then(|id| id.as_str()).map(str::to_string).or(header_id);
            let mut msg = match &parsed {
                Some(v) => format!("{code} {}: {}", v["error"].as_str().unwrap_or(""), v["message"].as_str().unwrap_or("")),
                None => format!("{code}: {}", body.trim_end()),
            };
            if let Some(id) = request_id.filter(|id| !id.is_empty()) {
                msg.push_str(&format!(" (request {id})"));
            }
            if let Some(v) = &parsed {
                if let Some(tb) = v.get("traceback").and_then(|t| t.as_str()) {
                    msg.push('\n');
                    msg.push_str(tb.trim_end());
                }
                if let Some(pip) = v.get("pip_output").and_then(|t| t.as_str()).filter(|t| !t.is_empty()) {
                    msg.push_str("\n--- pip said:\n");
                    msg.push_str(pip.trim_end());
                }
            }
            anyhow::anyhow!(msg)
        }
        ureq::Error::Transport(t) => {
            let what = t.to_string();
            match t.url() {
                Some(url) => {
                    let what = what.strip_prefix(&format!("{url}: ")).unwrap_or(&what);
                    anyhow::anyhow!("cannot reach the worker at {}: {}", url.origin().ascii_serialization(), what.replace('\n', " "))
                }
                None => anyhow::anyhow!("cannot reach the worker: {}", what.replace('\n', " ")),
            }
        }
    }
}

/// The token to send to `url`: `given` (`--token` or `$SPROUT_TOKEN`), else the discovery
/// file of a worker on this machine, for a loopback or `localhost` URL; files that are
/// missing or unreadable are skipped.
pub fn find_token(url: &str, given: Option<String>) -> Option<String> {
    given.filter(|t| !t.trim().is_empty()).map(|t| t.trim().to_string()).or_else(|| {
        local_addresses(url).iter().find_map(|addr| {
            let text = std::fs::read_to_string(sprout_worker::discovery_path(addr)).ok()?;
            Some(text.trim().to_string()).filter(|t| !t.is_empty())
        })
    })
}

/// The addresses a loopback or `localhost` URL reaches, in the order to try them; none for
/// any other host.
fn local_addresses(url: &str) -> Vec<SocketAddr> {
    let (rest, default_port) = match url.split_once("://") {
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("https") => (rest, 443),
        Some((_, rest)) => (rest, 80),
        None => (url, 80),
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let authority = authority.rsplit_once('@').map_or(authority, |(_, host)| host);
    let (host, port) = match authority.strip_prefix('[').and_then(|v6| v6.split_once(']')) {
        Some((host, port)) => (host, port.strip_prefix(':')),
        None => match authority.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        },
    };
    let Ok(port) = port.map_or(Ok(default_port), str::parse::<u16>) else { return Vec::new() };
    let ips: Vec<IpAddr> = if host.eq_ignore_ascii_case("localhost") {
        vec![Ipv4Addr::LOCALHOST.into(), Ipv6Addr::LOCALHOST.into()]
    } else {
        host.parse::<IpAddr>().into_iter().filter(|ip| ip.is_loopback()).collect()
    };
    ips.into_iter().map(|ip| SocketAddr::new(ip, port)).collect()
}

pub(crate) fn authorized(request: ureq::Request, token: Option<&str>) -> ureq::Request {
    match token {
        Some(token) => request.set("Authorization", &format!("Bearer {token}")),
        None => request,
    }
}

/// Upload `dir` as lambda `name` (the directory's name by default), to run in the
/// `isolation` class if given.
pub fn deploy(url: &str, token: Option<&str>, dir: &Path, name: Option<&str>, isolation: Option<&str>) -> Result<serde_json::Value> {
    let dir = std::fs::canonicalize(dir).with_context(|| format!("{} does not exist", dir.display()))?;
    let name = match name {
        Some(n) => n.to_string(),
        None => dir.file_name().and_then(|n| n.to_str()).context("cannot name the lambda after its directory")?.to_string(),
    };
    let archive = pack(&dir)?;
    let mut request = ureq::post(&format!("{url}/registry/{name}"));
    if let Some(class) = isolation {
        request = request.query("isolation", class);
    }
    let response = authorized(request, token).set("Content-Type", "application/gzip").send_bytes(&archive).map_err(explain)?;
    Ok(response.into_json()?)
}

pub fn invoke(url: &str, name: &str, event: &str) -> Result<String> {
    let response = ureq::post(&format!("{url}/run/{name}")).set("Content-Type", "application/json").send_string(event).map_err(explain)?;
    let mut body = String::new();
    response.into_reader().take(1 << 30).read_to_string(&mut body)?;
    Ok(body)
}

/// The worker's Zygote tree (its import cache), drawn as text.
pub fn zygotes(url: &str, token: Option<&str>) -> Result<String> {
    let stats: serde_json::Value = authorized(ureq::get(&format!("{url}/stats")), token).call().map_err(explain)?.into_json()?;
    let cache = &stats["import_cache"];
    if cache.is_null() {
        bail!("this worker's backend ({}) has no Zygotes", stats["backend"].as_str().unwrap_or("?"));
    }
    let mut out = format!(
        "import cache: {} Zygotes, package Zygotes {:.1} MiB PSS of {} MiB; hits {}, misses {}, fallbacks {}, evictions {}, deaths {}\n",
        cache["zygotes"],
        cache["package_zygotes_pss_mb"].as_f64().unwrap_or(0.0),
        cache["memory_limit_mb"],
        cache["import_cache_hits"],
        cache["import_cache_misses"],
        cache["import_cache_fallbacks"],
        cache["zygote_evictions"],
        cache["zygote_deaths"],
    );
    fn draw(node: &serde_json::Value, prefix: &str, last: bool, root: bool, out: &mut String) {
        let adds: Vec<&str> = node["adds"].as_array().map(|a| a.iter().filter_map(|v| v.as_str()).collect()).unwrap_or_default();
        let what = if root { "root (no packages)".to_string() } else { format!("+ {}", adds.join(", ")) };
        let mut flags = Vec::new();
        if node["pinned"].as_bool() == Some(true) {
            flags.push("static");
        }
        if node["retired"].as_bool() == Some(true) {
            flags.push("retired");
        }
        let branch = if root {
            ""
        } else if last {
            "└─ "
        } else {
            "├─ "
        };
        out.push_str(&format!(
            "{prefix}{branch}#{} {what}  [{} modules, {:.1} MiB PSS, {:.1} MiB on disk, {} uses ({} recent), {} handlers{}]\n",
            node["id"],
            node["modules"],
            node["pss_mb"].as_f64().unwrap_or(0.0),
            node["benefit_mb"].as_f64().unwrap_or(0.0),
            node["uses"],
            node["recent_uses"],
            node["handlers"],
            if flags.is_empty() { String::new() } else { format!(", {}", flags.join(", ")) },
        ));
        let children = node["children"].as_array().cloned().unwrap_or_default();
        let child_prefix = if root { prefix.to_string() } else { format!("{prefix}{}", if last { "   " } else { "│  " }) };
        for (i, child) in children.iter().enumerate() {
            draw(child, &child_prefix, i + 1 == children.len(), false, out);
        }
    }
    draw(&cache["tree"], "", true, true, &mut out);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_and_localhost_urls_are_looked_up() {
        let names = |url: &str| local_addresses(url).iter().map(|a| a.to_string()).collect::<Vec<_>>();
        assert_eq!(names("http://127.0.0.1:5000"), ["127.0.0.1:5000"]);
        assert_eq!(names("http://127.0.0.1:5000/"), ["127.0.0.1:5000"]);
        assert_eq!(names("http://localhost:8000/x?y"), ["127.0.0.1:8000", "[::1]:8000"]);
        assert_eq!(names("http://LOCALHOST"), ["127.0.0.1:80", "[::1]:80"]);
        assert_eq!(names("http://[::1]:5000"), ["[::1]:5000"]);
        assert_eq!(names("http://127.0.0.2:5000"), ["127.0.0.2:5000"]);
        assert_eq!(names("https://user@127.0.0.1"), ["127.0.0.1:443"]);
        for remote in ["http://10.0.0.1:5000", "http://example.com:5000", "http://[2001:db8::1]:5000", "http://127.0.0.1:x"] {
            assert!(names(remote).is_empty(), "{remote}");
        }
    }

    #[test]
    fn a_given_token_wins() {
        assert_eq!(find_token("http://10.0.0.1:5000", Some(" abc\n".into())).as_deref(), Some("abc"));
        assert_eq!(find_token("http://10.0.0.1:5000", Some(String::new())), None);
        assert_eq!(find_token("http://10.0.0.1:5000", None), None);
    }
}
