//! The `[app]` section: the app port, a second listener serving lambdas as web sites, chosen
//! by the request's host (`[app.sites]`, and the admin API's), with URL prefixes served from
//! host directories before the lambda; `lambda` and `static` are the site of every other
//! host; and its checks.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};
use sprout_engine::valid_name;
use sprout_sites::{normalize_host, valid_static_prefix, SiteConfig};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct AppSection {
    /// Address of the app port; empty: none.
    pub listen: String,
    /// The lambda serving hosts that have no site of their own (empty: they get 404).
    pub lambda: String,
    /// URL prefix (`/static/`) to the host directory whose files are served under it, for
    /// that default site.
    #[serde(rename = "static")]
    pub statics: BTreeMap<String, PathBuf>,
    /// Sites by host name (`[app.sites."a.example"] lambda = "olio-a"`).
    pub sites: BTreeMap<String, SiteConfig>,
}

impl AppSection {
    /// Whether an app port is configured.
    pub fn enabled(&self) -> bool {
        !self.listen.is_empty()
    }

    pub fn validate(&self, worker_listen: &str) -> Result<()> {
        if !self.enabled() {
            if !self.lambda.is_empty() || !self.statics.is_empty() || !self.sites.is_empty() {
                bail!("app.lambda, app.static and app.sites need app.listen, the app port's address (empty: no app port)");
            }
            return Ok(());
        }
        let Ok(listen) = self.listen.parse::<SocketAddr>() else {
            bail!("app.listen = {:?} is not an address like 127.0.0.1:8080", self.listen);
        };
        if worker_listen.parse::<SocketAddr>().ok() == Some(listen) {
            bail!("app.listen = {:?} must differ from worker.listen", self.listen);
        }
        if self.lambda.is_empty() && !self.statics.is_empty() {
            bail!("app.static needs app.lambda: they are the site of hosts without one of their own");
        }
        if !self.lambda.is_empty() && !valid_name(&self.lambda) {
            bail!("app.lambda = {:?} is not a lambda name (1-64 letters, digits, '-', '_', '.')", self.lambda);
        }
        for (prefix, dir) in &self.statics {
            if !valid_static_prefix(prefix) {
                bail!(
                    "app.static.{prefix:?}: a prefix must start and end with '/' and hold only plain path \
                     segments, like \"/static/\""
                );
            }
            if !dir.is_absolute() {
                bail!("app.static.{prefix:?} = {:?} must be an absolute path", dir.display());
            }
            if !dir.is_dir() {
                bail!("app.static.{prefix:?} = {:?} is not a directory", dir.display());
            }
        }
        for host in self.sites.keys() {
            if normalize_host(host).is_none() {
                bail!("app.sites.{host:?} is not a host name");
            }
        }
        Ok(())
    }

    /// The default site (`lambda` and `static`), if there is one.
    pub fn default_site(&self) -> Option<SiteConfig> {
        (!self.lambda.is_empty()).then(|| SiteConfig { lambda: self.lambda.clone(), statics: self.statics.clone() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn app(listen: &str, lambda: &str, statics: &[(&str, &str)]) -> AppSection {
        AppSection {
            listen: listen.into(),
            lambda: lambda.into(),
            statics: statics.iter().map(|(p, d)| (p.to_string(), PathBuf::from(d))).collect(),
            sites: BTreeMap::new(),
        }
    }

    fn error(section: AppSection) -> String {
        format!("{:#}", section.validate("127.0.0.1:5000").unwrap_err())
    }

    #[test]
    fn errors_name_the_key() {
        assert!(app("", "", &[]).validate("127.0.0.1:5000").is_ok());
        assert!(error(app("", "olio", &[])).contains("app.listen"));
        assert!(error(app("nowhere", "olio", &[])).contains("app.listen"));
        assert!(error(app("127.0.0.1:5000", "olio", &[])).contains("worker.listen"));
        // Without a default site, every host needs one of its own (from app.sites or the API).
        assert!(app("127.0.0.1:8080", "", &[]).validate("127.0.0.1:5000").is_ok());
        assert!(error(app("127.0.0.1:8080", "", &[("/s/", "/tmp")])).contains("app.static needs app.lambda"));
        let mut bad_host = app("127.0.0.1:8080", "", &[]);
        bad_host.sites.insert("a b".into(), SiteConfig { lambda: "x".into(), statics: BTreeMap::new() });
        assert!(error(bad_host).contains("app.sites.\"a b\" is not a host name"));
        assert!(error(app("127.0.0.1:8080", "a/b", &[])).contains("app.lambda"));
        assert!(error(app("127.0.0.1:8080", "olio", &[("static", "/tmp")])).contains("app.static.\"static\""));
        assert!(error(app("127.0.0.1:8080", "olio", &[("/s/", "tmp")])).contains("absolute"));
        let missing = error(app("127.0.0.1:8080", "olio", &[("/s/", "/no/such/dir")]));
        assert!(missing.contains("app.static.\"/s/\"") && missing.contains("not a directory"), "{missing}");
        assert!(app("127.0.0.1:8080", "olio", &[("/s/", "/tmp")]).validate("127.0.0.1:5000").is_ok());
    }
}
