//! Package-aware routing in a fleet: the worker that takes a lambda's upload names, in the
//! fleet HAProxy's routes map, what the lambda is routed by — its largest installed
//! requirement (the costliest import a Zygote can hold for it), else its package set — once
//! its packages are installed; a deleted lambda's entry goes (`[registry] routes_socket`,
//! `routes_map`: HAProxy's runtime API and the map's file, set by `sprout fleet up --policy
//! package-aware`).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

use std::sync::Arc;

use async_trait::async_trait;
use sprout_engine::InstalledPackage;
use sprout_engine::Requirement;
use sprout_engine::{Engine, Lambda, LambdaWatcher, Origin};

/// What a lambda needing `requirements` is routed by, given what the install cache holds;
/// None for a lambda without packages (HAProxy then hashes its name).
pub fn route_key(requirements: &[Requirement], installed: &[InstalledPackage]) -> Option<String> {
    if requirements.is_empty() {
        return None;
    }
    let keys: Vec<String> = requirements.iter().map(cache_key).collect();
    let largest = keys.iter().filter_map(|k| installed.iter().find(|p| &p.key == k).map(|p| (p.size_bytes, k))).max();
    Some(match largest {
        Some((_, key)) => key.clone(),
        None => keys.join(","),
    })
}

/// The install cache's key of a pinned requirement (`<normalized>==<version>`), else the
/// requirement as normalized, without spaces (a map key is one word).
fn cache_key(r: &Requirement) -> String {
    let spec: String = r.specifier.split_whitespace().collect();
    format!("{}{spec}", r.normalized)
}

/// The fleet HAProxy's routes map, changed through its runtime API.
#[derive(Debug, Clone)]
pub struct FleetRoutes {
    pub socket: PathBuf,
    pub map: PathBuf,
}

impl FleetRoutes {
    /// Route `lambda` by `key` (None: remove its entry, so its name is hashed). Blocking.
    pub fn set(&self, lambda: &str, key: Option<&str>) -> std::io::Result<()> {
        let map = self.map.display();
        self.command(&format!("del map {map} {lambda}"))?; // nothing to delete is no error
        if let Some(key) = key {
            let answer = self.command(&format!("add map {map} {lambda} {key}"))?;
            if !answer.trim().is_empty() {
                return Err(std::io::Error::other(format!("HAProxy did not take the route: {}", answer.trim())));
            }
        }
        Ok(())
    }

    fn command(&self, line: &str) -> std::io::Result<String> {
        let mut stream = UnixStream::connect(&self.socket)?;
        stream.set_read_timeout(Some(Duration::from_secs(2)))?;
        stream.set_write_timeout(Some(Duration::from_secs(2)))?;
        stream.write_all(format!("{line}\n").as_bytes())?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer)?;
        Ok(answer)
    }
}

/// The routes of the lambdas this worker took: a lambda uploaded here is routed by its
/// packages once they are installed (a failed install still routes it, by its package set);
/// one deleted here loses its route.
#[async_trait]
impl LambdaWatcher for FleetRoutes {
    fn arrived(self: Arc<Self>, engine: &Arc<Engine>, lambda: &Arc<Lambda>, origin: Origin) {
        if origin != Origin::Api {
            return; // the worker that took it keeps its route
        }
        let (packages, reqs, name) = (engine.packages.clone(), lambda.parsed_requirements.clone(), lambda.name.clone());
        tokio::spawn(async move {
            let _ = packages.prefetch(&reqs).await; // the engine's own prefetch: shared, and reported there
            let done = tokio::task::spawn_blocking(move || {
                let key = route_key(&reqs, &packages.cache().list());
                self.set(&name, key.as_deref()).map_err(|e| (name, e))
            })
            .await;
            if let Ok(Err((name, e))) = done {
                tracing::warn!(lambda = %name, "keeping the lambda's route in the fleet's HAProxy: {e}");
            }
        });
    }

    async fn removed(&self, _engine: &Arc<Engine>, name: &str, origin: Origin) {
        if origin != Origin::Api {
            return;
        }
        let (routes, lambda) = (self.clone(), name.to_string());
        if let Ok(Err(e)) = tokio::task::spawn_blocking(move || routes.set(&lambda, None)).await {
            tracing::warn!(lambda = %name, "removing the lambda's route from the fleet's HAProxy: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sprout_engine::parse_requirements as parse;

    fn installed(key: &str, size_bytes: u64) -> InstalledPackage {
        serde_json::from_value(serde_json::json!({
            "key": key, "name": key.split("==").next().unwrap(), "version": key.split("==").nth(1).unwrap(),
            "top_level": [], "requires_dist": [], "size_bytes": size_bytes, "files": 1, "installed_at": 0, "install_ms": 0
        }))
        .unwrap()
    }

    #[test]
    fn a_lambda_is_routed_by_its_largest_installed_requirement() {
        let reqs = parse("Small_Pkg==1.0\nbig.pkg==2.0\n", false).unwrap();
        let cache = [installed("small-pkg==1.0", 10), installed("big-pkg==2.0", 3 << 20), installed("other==1.0", 9 << 20)];
        assert_eq!(route_key(&reqs, &cache).as_deref(), Some("big-pkg==2.0"));
    }

    #[test]
    fn before_its_packages_are_installed_it_is_routed_by_its_package_set() {
        let reqs = parse("b==2.0\na==1.0\n", false).unwrap();
        assert_eq!(route_key(&reqs, &[]).as_deref(), Some("a==1.0,b==2.0"), "the set, in its canonical order");
        assert_eq!(route_key(&[], &[installed("a==1.0", 1)]), None, "no packages: the name is hashed");
    }
}
