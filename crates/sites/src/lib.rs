//! The app port's sites: which lambda (and which static directories) serves a request, chosen
//! by its `Host`. Sites come from `[app.sites]` in the configuration and from the admin API
//! (`PUT /sites/<host>`, kept in `DIR/sites.json` across restarts); `[app] lambda` is the
//! site of every other host, and without it an unknown host is 404 `site_not_found`.
//!
//! A host is matched without its port, case-insensitively (`Olio-A.example:8080` is
//! `olio-a.example`). Resolving is a read of one map; changing it swaps one entry.
//!
//! A site's static directories are opened when the site is made, by the [`OpenDir`] the HTTP
//! edge serves files with (it holds each directory open), so no HTTP is needed here.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use serde::{Deserialize, Serialize};
use sprout_engine::valid_name;

/// A static directory, opened (and checked) when its site is made.
pub trait OpenDir: Sized + Send + Sync {
    fn open(dir: &Path) -> std::io::Result<Self>;
}

/// What a site is, as configured or sent to `PUT /sites/<host>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SiteConfig {
    pub lambda: String,
    /// URL prefix (`/static/`) to the host directory served under it, before the lambda.
    #[serde(default, rename = "static", skip_serializing_if = "BTreeMap::is_empty")]
    pub statics: BTreeMap<String, PathBuf>,
}

/// A site, its directories open.
pub struct Site<D> {
    pub config: SiteConfig,
    /// Prefix and directory, longest prefix first.
    pub statics: Vec<(String, D)>,
    /// From the admin API (kept in sites.json), not the configuration file.
    pub dynamic: bool,
}

impl<D: OpenDir> Site<D> {
    /// Check `config` and open its directories.
    pub fn open(config: SiteConfig, dynamic: bool) -> Result<Site<D>, String> {
        if !valid_name(&config.lambda) {
            return Err(format!("{:?} is not a lambda name", config.lambda));
        }
        let mut statics = Vec::new();
        for (prefix, dir) in &config.statics {
            if !valid_static_prefix(prefix) {
                return Err(format!("static prefix {prefix:?} must start and end with '/' and hold plain path segments"));
            }
            if !dir.is_absolute() {
                return Err(format!("static {prefix:?} = {:?} must be an absolute path", dir.display()));
            }
            let opened = D::open(dir).map_err(|e| format!("static {prefix:?} = {:?}: {e}", dir.display()))?;
            statics.push((prefix.clone(), opened));
        }
        statics.sort_by_key(|(prefix, _)| std::cmp::Reverse(prefix.len()));
        Ok(Site { config, statics, dynamic })
    }
}

/// The host a `Host` header names: lowercased, without its port; None when it is no host.
pub fn normalize_host(header: &str) -> Option<String> {
    let header = header.trim();
    let host = if let Some(rest) = header.strip_prefix('[') {
        // An IPv6 literal: [::1]:8080
        format!("[{}]", rest.split(']').next()?)
    } else {
        header.rsplit_once(':').filter(|(_, port)| port.bytes().all(|b| b.is_ascii_digit())).map_or(header, |(h, _)| h).to_string()
    };
    let host = host.to_ascii_lowercase();
    let valid = !host.is_empty()
        && host.len() <= 253
        && host.bytes().all(|b| b.is_ascii_alphanumeric() || b".-_[]:".contains(&b))
        && !host.starts_with('.')
        && !host.starts_with('-');
    valid.then_some(host)
}

/// `/a/b/`: starts and ends with '/', at least one segment, none empty, `.` or `..`, and no
/// character a URL would encode or treat specially.
pub fn valid_static_prefix(prefix: &str) -> bool {
    let Some(inner) = prefix.strip_prefix('/').and_then(|p| p.strip_suffix('/')) else {
        return false;
    };
    !inner.is_empty()
        && inner.split('/').all(|segment| {
            !segment.is_empty()
                && segment != "."
                && segment != ".."
                && segment.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@".contains(&b))
        })
}

/// Every site of the app port.
pub struct Sites<D> {
    by_host: RwLock<HashMap<String, Arc<Site<D>>>>,
    fallback: Option<Arc<Site<D>>>,
    file: Option<PathBuf>,
}

impl<D: OpenDir> Sites<D> {
    /// The configured sites, the default one, and those the admin API added before (from
    /// `file`, when given). A configured site cannot be opened: an error naming it.
    pub fn new(configured: &BTreeMap<String, SiteConfig>, fallback: Option<SiteConfig>, file: Option<PathBuf>) -> Result<Sites<D>, String> {
        let mut by_host = HashMap::new();
        for (host, config) in configured {
            let key = normalize_host(host).ok_or_else(|| format!("app.sites.{host:?} is not a host name"))?;
            let site = Site::open(config.clone(), false).map_err(|e| format!("app.sites.{host:?}: {e}"))?;
            by_host.insert(key, Arc::new(site));
        }
        let fallback = fallback.map(|c| Site::open(c, false).map(Arc::new)).transpose().map_err(|e| format!("app: {e}"))?;
        if let Some(path) = &file {
            for (host, config) in read_saved(path)? {
                match Site::open(config, true) {
                    // The configuration file wins over what the API saved for the same host.
                    Ok(site) => {
                        by_host.entry(host).or_insert_with(|| Arc::new(site));
                    }
                    Err(e) => tracing::warn!(host, "a saved site cannot be served: {e}"),
                }
            }
        }
        Ok(Sites { by_host: RwLock::new(by_host), fallback, file })
    }

    /// The site serving a request with this `Host` header (None: no site, not even a default).
    pub fn resolve(&self, host_header: Option<&str>) -> Option<Arc<Site<D>>> {
        let found = host_header.and_then(normalize_host).and_then(|h| self.by_host.read().unwrap().get(&h).cloned());
        found.or_else(|| self.fallback.clone())
    }

    /// Every site by host, and the default one as `"*"`.
    pub fn list(&self) -> BTreeMap<String, serde_json::Value> {
        let mut out: BTreeMap<String, serde_json::Value> = (self.by_host.read().unwrap().iter())
            .map(|(h, s)| (h.clone(), serde_json::json!({"site": s.config, "source": if s.dynamic { "api" } else { "config" }})))
            .collect();
        if let Some(s) = &self.fallback {
            out.insert("*".into(), serde_json::json!({"site": s.config, "source": "config"}));
        }
        out
    }

    /// Map `host` to `config` (added or replaced), and save the API's sites. Refused for a
    /// host the configuration file defines.
    pub fn put(&self, host: &str, config: SiteConfig) -> Result<bool, String> {
        let key = normalize_host(host).ok_or_else(|| format!("{host:?} is not a host name"))?;
        let site = Arc::new(Site::open(config, true)?);
        let mut table = self.by_host.write().unwrap();
        if table.get(&key).is_some_and(|s| !s.dynamic) {
            return Err(format!("{key} is defined in config.toml ([app.sites]); change it there"));
        }
        let created = table.insert(key, site).is_none();
        self.save(&table)?;
        Ok(created)
    }

    /// Remove the API's site for `host`; false when there is none.
    pub fn delete(&self, host: &str) -> Result<bool, String> {
        let Some(key) = normalize_host(host) else { return Ok(false) };
        let mut table = self.by_host.write().unwrap();
        match table.get(&key) {
            None => return Ok(false),
            Some(s) if !s.dynamic => return Err(format!("{key} is defined in config.toml ([app.sites]); change it there")),
            Some(_) => {}
        }
        table.remove(&key);
        self.save(&table)?;
        Ok(true)
    }

    /// Write the API's sites to the file, atomically (a rename).
    fn save(&self, table: &HashMap<String, Arc<Site<D>>>) -> Result<(), String> {
        let Some(path) = &self.file else { return Ok(()) };
        let saved: BTreeMap<&String, &SiteConfig> = table.iter().filter(|(_, s)| s.dynamic).map(|(h, s)| (h, &s.config)).collect();
        let text = serde_json::to_string_pretty(&saved).map_err(|e| e.to_string())?;
        let temp = path.with_extension("json.tmp");
        std::fs::write(&temp, text + "\n")
            .and_then(|()| std::fs::rename(&temp, path))
            .map_err(|e| format!("saving {}: {e}", path.display()))
    }
}

fn read_saved(path: &Path) -> Result<BTreeMap<String, SiteConfig>, String> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| format!("{}: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(BTreeMap::new()),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory as the tests open one: checked to be one.
    struct Dir;

    impl OpenDir for Dir {
        fn open(dir: &Path) -> std::io::Result<Dir> {
            std::fs::read_dir(dir).map(|_| Dir)
        }
    }

    type Sites = super::Sites<Dir>;
    type Site = super::Site<Dir>;

    fn site(lambda: &str) -> SiteConfig {
        SiteConfig { lambda: lambda.into(), statics: BTreeMap::new() }
    }

    #[test]
    fn prefixes_are_plain_directories() {
        for good in ["/static/", "/a/b-c/", "/files.v2/"] {
            assert!(valid_static_prefix(good), "{good}");
        }
        for bad in ["/", "static/", "/static", "//", "/a//b/", "/../", "/./", "/a b/", "/%2e%2e/", "/a?/"] {
            assert!(!valid_static_prefix(bad), "{bad}");
        }
    }

    #[test]
    fn hosts_are_matched_without_port_and_case() {
        assert_eq!(normalize_host("Olio-A.example:8080").as_deref(), Some("olio-a.example"));
        assert_eq!(normalize_host("olio-a.example").as_deref(), Some("olio-a.example"));
        assert_eq!(normalize_host("[::1]:8080").as_deref(), Some("[::1]"));
        assert_eq!(normalize_host("127.0.0.1:80").as_deref(), Some("127.0.0.1"));
        for bad in ["", " ", "a b", "a/b", ".example", "-x", "x\u{0}"] {
            assert_eq!(normalize_host(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_request_goes_to_its_hosts_site_or_the_default_or_nowhere() {
        let configured = BTreeMap::from([("a.example".to_string(), site("olio-a"))]);
        let sites = Sites::new(&configured, None, None).unwrap();
        assert_eq!(sites.resolve(Some("A.example:8080")).unwrap().config.lambda, "olio-a");
        assert!(sites.resolve(Some("b.example")).is_none());
        assert!(sites.resolve(None).is_none());
        let with_default = Sites::new(&configured, Some(site("home")), None).unwrap();
        assert_eq!(with_default.resolve(Some("b.example")).unwrap().config.lambda, "home");
        assert_eq!(with_default.resolve(None).unwrap().config.lambda, "home");
    }

    #[test]
    fn the_api_adds_replaces_and_removes_sites_and_they_survive_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("sites.json");
        let configured = BTreeMap::from([("fixed.example".to_string(), site("fixed"))]);
        let sites = Sites::new(&configured, None, Some(file.clone())).unwrap();
        assert_eq!(sites.put("B.example", site("olio-b")), Ok(true));
        assert_eq!(sites.put("b.example:80", site("olio-b2")), Ok(false));
        assert_eq!(sites.put("c.example", site("olio-c")), Ok(true));
        assert!(sites.put("fixed.example", site("x")).unwrap_err().contains("config.toml"));
        assert!(sites.delete("fixed.example").unwrap_err().contains("config.toml"));
        assert_eq!(sites.delete("c.example"), Ok(true));
        assert_eq!(sites.delete("c.example"), Ok(false));
        assert!(sites.put("bad host", site("x")).is_err());
        assert!(sites.put("d.example", site("not a name")).is_err());

        let again = Sites::new(&configured, None, Some(file)).unwrap();
        assert_eq!(again.resolve(Some("b.example")).unwrap().config.lambda, "olio-b2");
        assert!(again.resolve(Some("c.example")).is_none());
        assert_eq!(again.resolve(Some("fixed.example")).unwrap().config.lambda, "fixed");
        let listed = again.list();
        assert_eq!(listed["b.example"]["source"], "api");
        assert_eq!(listed["fixed.example"]["source"], "config");
    }

    #[test]
    fn a_sites_static_directory_must_exist_and_be_absolute() {
        let mut config = site("a");
        config.statics.insert("/static/".into(), PathBuf::from("relative"));
        assert!(Site::open(config.clone(), true).err().unwrap().contains("absolute"));
        config.statics.insert("/static/".into(), PathBuf::from("/nonexistent-sprout-dir"));
        assert!(Site::open(config.clone(), true).is_err());
        let mut config = site("a");
        config.statics.insert("static".into(), std::env::temp_dir());
        assert!(Site::open(config, true).err().unwrap().contains("prefix"));
    }
}
