//! Each member's `config.toml`: the settings the fleet decides (address, name, CPUs, memory
//! budget, the shared registry, the app port, the services its sandboxes may reach) merged
//! into the operator's own TOML (`--worker-config`), which may set anything else. Pure.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::Path;
use std::str::FromStr;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use toml::{Table, Value};

use crate::plan::{Member, Plan, API_PORT, APP_PORT};

/// A service every member's sandboxes may reach by name (`--service NAME=[ADDR:]PORT[@LAMBDA,...]`):
/// written as the worker's `[[network.allow]]`; without an address it is on the fleet's
/// services address ([`Plan::services_addr`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Service {
    pub name: String,
    /// None: the fleet's services address.
    pub addr: Option<Ipv4Addr>,
    pub port: u16,
    /// Only these lambdas may reach it; empty: every lambda.
    pub lambdas: Vec<String>,
}

impl FromStr for Service {
    type Err = anyhow::Error;

    fn from_str(text: &str) -> Result<Service> {
        let usage = || format!("--service {text:?}: expected NAME=[ADDR:]PORT[@LAMBDA,...], e.g. olio-db=5432@olio");
        let (name, rest) = text.split_once('=').with_context(usage)?;
        let (endpoint, lambdas) = rest.split_once('@').map_or((rest, ""), |(e, l)| (e, l));
        let (addr, port) = match endpoint.rsplit_once(':') {
            Some((addr, port)) => (Some(addr.parse::<Ipv4Addr>().with_context(usage)?), port),
            None => (None, endpoint),
        };
        let port: u16 = port.parse().ok().filter(|p| *p > 0).with_context(usage)?;
        let label = |s: &str| !s.is_empty() && s.len() <= 63 && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
        if !label(name) {
            bail!("{}: the name must be letters, digits and '-' (a host name label)", usage());
        }
        let lambdas: Vec<String> = lambdas.split(',').filter(|l| !l.is_empty()).map(str::to_string).collect();
        Ok(Service { name: name.to_string(), addr, port, lambdas })
    }
}

impl Service {
    /// Where it listens in the fleet `plan`.
    pub fn endpoint(&self, plan: &Plan) -> SocketAddrV4 {
        SocketAddrV4::new(self.addr.unwrap_or(plan.services_addr()), self.port)
    }
}

/// The keys the fleet decides, which `--worker-config` may not set.
const FLEET_KEYS: [(&str, &str); 8] = [
    ("worker", "listen"),
    ("worker", "name"),
    ("sandbox", "cpuset"),
    ("instances", "memory_budget_mb"),
    ("registry", "shared"),
    ("registry", "routes_socket"),
    ("registry", "routes_map"),
    ("app", "listen"),
];

/// What every member's config gets from the fleet.
pub struct Fleetwide<'a> {
    /// The shared registry's connection string.
    pub registry: &'a str,
    /// Whether the members serve an app port.
    pub app: bool,
    /// HAProxy's runtime API socket and routes map, for package-aware routing.
    pub routes: Option<(&'a Path, &'a Path)>,
    pub services: &'a [Service],
}

/// Parse the operator's TOML and check it sets none of the fleet's own keys.
pub fn check_extra(extra: &str) -> Result<Table> {
    let table: Table = extra.parse().context("--worker-config is not valid TOML")?;
    for (section, key) in FLEET_KEYS {
        if table.get(section).and_then(Value::as_table).is_some_and(|t| t.contains_key(key)) {
            bail!("--worker-config sets {section}.{key}, which the fleet decides for each worker");
        }
    }
    if let Some(allow) = table.get("network").and_then(|n| n.get("allow")) {
        if !allow.as_array().is_some_and(|a| a.iter().all(Value::is_table)) {
            bail!("--worker-config: network.allow must be an array of tables ([[network.allow]])");
        }
    }
    Ok(table)
}

fn section<'a>(table: &'a mut Table, name: &str) -> Result<&'a mut Table> {
    table
        .entry(name)
        .or_insert_with(|| Value::Table(Table::new()))
        .as_table_mut()
        .with_context(|| format!("--worker-config: {name} is not a table"))
}

/// Member `m`'s config.toml.
pub fn render(plan: &Plan, m: &Member, fleet: &Fleetwide, extra: &str) -> Result<String> {
    let (registry, app, services) = (fleet.registry, fleet.app, fleet.services);
    let mut table = check_extra(extra)?;
    let set = |table: &mut Table, name: &str, key: &str, value: Value| -> Result<()> {
        section(table, name)?.insert(key.to_string(), value);
        Ok(())
    };
    set(&mut table, "worker", "listen", Value::from(SocketAddrV4::new(m.addr, API_PORT).to_string()))?;
    set(&mut table, "worker", "name", Value::from(format!("f{}{}", plan.tag, m.name)))?;
    set(&mut table, "sandbox", "cpuset", Value::from(m.cpus.clone()))?;
    set(&mut table, "instances", "memory_budget_mb", Value::Integer(m.memory_mb as i64))?;
    set(&mut table, "registry", "shared", Value::from(registry))?;
    if let Some((socket, map)) = fleet.routes {
        set(&mut table, "registry", "routes_socket", Value::from(socket.to_string_lossy().to_string()))?;
        set(&mut table, "registry", "routes_map", Value::from(map.to_string_lossy().to_string()))?;
    }
    if app {
        set(&mut table, "app", "listen", Value::from(SocketAddrV4::new(m.addr, APP_PORT).to_string()))?;
    }
    if !services.is_empty() {
        let network = section(&mut table, "network")?;
        let allow = network.entry("allow").or_insert_with(|| Value::Array(Vec::new())).as_array_mut().expect("checked above");
        for s in services {
            let mut rule = Table::new();
            rule.insert("name".into(), Value::from(s.name.clone()));
            rule.insert("address".into(), Value::from(s.endpoint(plan).to_string()));
            if !s.lambdas.is_empty() {
                rule.insert("lambdas".into(), Value::Array(s.lambdas.iter().cloned().map(Value::from).collect()));
            }
            allow.push(Value::Table(rule));
        }
    }
    let body = toml::to_string(&table).context("writing config.toml")?;
    Ok(format!(
        "# Written by `sprout fleet up`: worker {} of fleet {} (its settings merged into --worker-config's).\n{body}",
        m.name, plan.tag
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fleet<'a>(app: bool, services: &'a [Service]) -> Fleetwide<'a> {
        Fleetwide { registry: "postgresql://r", app, routes: None, services }
    }

    fn member() -> (Plan, Member) {
        let plan = Plan::for_dir(Path::new("/var/tmp/fleet-a"));
        let m = plan.member(2, "1", 384).unwrap();
        (plan, m)
    }

    #[test]
    fn services_parse_with_and_without_address_and_lambdas() {
        let s: Service = "olio-db=5432@olio,admin".parse().unwrap();
        assert_eq!((s.name.as_str(), s.addr, s.port, s.lambdas.len()), ("olio-db", None, 5432, 2));
        let s: Service = "cache=10.0.0.5:11211".parse().unwrap();
        assert_eq!((s.addr, s.port, s.lambdas.is_empty()), (Some(Ipv4Addr::new(10, 0, 0, 5)), 11211, true));
        for bad in ["olio-db", "=5432", "db=0", "db=host:5432", "db=5432x", "a b=1", "db=70000"] {
            let e = bad.parse::<Service>().unwrap_err().to_string();
            assert!(e.contains("expected NAME=[ADDR:]PORT"), "{bad}: {e}");
        }
    }

    #[test]
    fn the_fleets_settings_merge_into_the_operators_tables() {
        let (plan, m) = member();
        let extra = "[app]\nlambda = \"olio\"\n[sandbox]\nvolumes = [{ host = \"/srv/f\", path = \"/f\", writable = true }]\n\
                     [[network.allow]]\nname = \"mail\"\naddress = \"10.0.0.9:25\"\n";
        let services = ["olio-db=5432@olio".parse().unwrap()];
        let text = render(&plan, &m, &fleet(true, &services), extra).unwrap();
        let t: Table = text.parse().unwrap();
        assert_eq!(t["app"]["lambda"].as_str(), Some("olio"));
        assert_eq!(t["app"]["listen"].as_str().unwrap(), format!("{}:{APP_PORT}", m.addr));
        assert_eq!(t["sandbox"]["cpuset"].as_str(), Some("1"));
        assert!(t["sandbox"]["volumes"].is_array());
        assert_eq!(t["instances"]["memory_budget_mb"].as_integer(), Some(384));
        let allow = t["network"]["allow"].as_array().unwrap();
        assert_eq!(allow.len(), 2);
        assert_eq!(allow[1]["address"].as_str().unwrap(), format!("{}:5432", plan.services_addr()));
        assert_eq!(allow[1]["lambdas"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn package_aware_fleets_tell_workers_where_the_routes_are() {
        let (plan, m) = member();
        let (socket, map) = (Path::new("/f/haproxy.sock"), Path::new("/f/routes.map"));
        let routed = Fleetwide { registry: "r", app: false, routes: Some((socket, map)), services: &[] };
        let t: Table = render(&plan, &m, &routed, "").unwrap().parse().unwrap();
        assert_eq!(
            (t["registry"]["routes_socket"].as_str(), t["registry"]["routes_map"].as_str()),
            (Some("/f/haproxy.sock"), Some("/f/routes.map"))
        );
        let t: Table = render(&plan, &m, &fleet(false, &[]), "").unwrap().parse().unwrap();
        assert!(t["registry"].get("routes_socket").is_none());
        let e = render(&plan, &m, &routed, "[registry]\nroutes_map = \"/x\"\n").unwrap_err().to_string();
        assert!(e.contains("registry.routes_map"), "{e}");
    }

    #[test]
    fn the_operator_may_not_set_what_the_fleet_decides() {
        let (plan, m) = member();
        let e = render(&plan, &m, &fleet(false, &[]), "[registry]\nshared = \"x\"\n").unwrap_err().to_string();
        assert!(e.contains("registry.shared"), "{e}");
        let e = render(&plan, &m, &fleet(false, &[]), "[worker\n").unwrap_err();
        assert!(format!("{e:#}").contains("not valid TOML"), "{e:#}");
        let e = render(&plan, &m, &fleet(false, &[]), "network = { allow = 3 }\n").unwrap_err().to_string();
        assert!(e.contains("array of tables"), "{e}");
    }
}
