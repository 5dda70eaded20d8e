//! Dollars per user per month (Cloudstone section 4): a deployment's monthly cost from a
//! pricing file, divided by the users it served within the SLA, for 1, 12 and 36 months of
//! operation; and the cost of resources actually used under per-second billing.

use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

/// Hours in Cloudstone's month (30 days, 24 x 7).
pub const HOURS_PER_MONTH: f64 = 720.0;
/// The terms Cloudstone requires, in months.
pub const TERMS: [u32; 3] = [1, 12, 36];

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    pub name: String,
    #[serde(default)]
    pub description: String,
    pub usd_per_instance_hour: f64,
    /// Paid once per instance (hardware bought, a reserved term), spread over the months of
    /// operation.
    #[serde(default)]
    pub upfront_usd: f64,
    #[serde(default)]
    pub usd_per_vcpu_hour: Option<f64>,
    #[serde(default)]
    pub usd_per_gb_hour: Option<f64>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct PricingFile {
    default: String,
    price: Vec<Price>,
}

#[derive(Debug, Clone)]
pub struct Pricing {
    pub default: String,
    pub prices: Vec<Price>,
}

impl Pricing {
    pub fn load(path: &Path) -> Result<Pricing> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading the pricing file {}", path.display()))?;
        Pricing::parse(&text).with_context(|| format!("in the pricing file {}", path.display()))
    }

    pub fn parse(text: &str) -> Result<Pricing> {
        let f: PricingFile = toml::from_str(text)?;
        for p in &f.price {
            let ok = |v: f64| v.is_finite() && v >= 0.0;
            if !ok(p.usd_per_instance_hour)
                || !ok(p.upfront_usd)
                || !p.usd_per_vcpu_hour.is_none_or(ok)
                || !p.usd_per_gb_hour.is_none_or(ok)
            {
                bail!("price {}: prices are non-negative numbers of dollars", p.name);
            }
        }
        let pricing = Pricing { default: f.default, prices: f.price };
        pricing.get(&pricing.default)?;
        Ok(pricing)
    }

    pub fn get(&self, name: &str) -> Result<&Price> {
        self.prices.iter().find(|p| p.name == name).with_context(|| {
            format!(
                "no price named {name:?} (the file has: {})",
                self.prices.iter().map(|p| p.name.as_str()).collect::<Vec<_>>().join(", ")
            )
        })
    }
}

impl Price {
    /// The monthly cost of `instances` always-on instances over `months` of operation.
    pub fn monthly_usd(&self, instances: f64, months: u32) -> f64 {
        instances * (self.usd_per_instance_hour * HOURS_PER_MONTH + self.upfront_usd / months.max(1) as f64)
    }

    /// Dollars per user per month for each of Cloudstone's terms; None when no user passed.
    pub fn per_user_month(&self, instances: f64, users: u64) -> Vec<(u32, Option<f64>)> {
        TERMS.iter().map(|&m| (m, (users > 0).then(|| self.monthly_usd(instances, m) / users as f64))).collect()
    }

    /// Per-second billing of what was used: CPU-seconds and memory GB-seconds.
    pub fn used_usd(&self, cpu_seconds: f64, gb_seconds: f64) -> Option<f64> {
        Some(cpu_seconds / 3600.0 * self.usd_per_vcpu_hour? + gb_seconds / 3600.0 * self.usd_per_gb_hour?)
    }
}

/// What `seconds` of a deployment cost at each price in the pricing file `path`: what it used
/// (`cpu_seconds`, and `gb_seconds` when known) billed per second, and `instances` always-on
/// instances over the same time: {price: {"used_usd", "provisioned_usd"}}.
pub fn priced(
    path: &Path,
    instances: f64,
    seconds: f64,
    cpu_seconds: f64,
    gb_seconds: Option<f64>,
) -> Result<serde_json::Map<String, serde_json::Value>> {
    let pricing = Pricing::load(path)?;
    let mut costs = serde_json::Map::new();
    for p in &pricing.prices {
        let used = gb_seconds.and_then(|gb| p.used_usd(cpu_seconds, gb));
        let provisioned = instances * p.usd_per_instance_hour * seconds / 3600.0;
        costs.insert(p.name.clone(), serde_json::json!({"used_usd": used, "provisioned_usd": provisioned}));
    }
    Ok(costs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pricing() -> Pricing {
        Pricing::parse(include_str!("../../../bench/pricing.toml")).unwrap()
    }

    #[test]
    fn the_papers_configuration_4() {
        // Cloudstone, configuration #4: two instances (app + MySQL) at $0.80/h serve 500
        // users at SLA-1 ($2.30/user/month) and 250 at SLA-2 ($4.61).
        let paper = pricing();
        let p = paper.get("paper-2008").unwrap();
        let sla1 = p.per_user_month(2.0, 500);
        let sla2 = p.per_user_month(2.0, 250);
        for (_, usd) in &sla1 {
            assert!((usd.unwrap() - 2.30).abs() < 0.01, "{sla1:?}");
        }
        for (_, usd) in &sla2 {
            assert!((usd.unwrap() - 4.61).abs() < 0.01, "{sla2:?}");
        }
        assert_eq!(p.per_user_month(1.0, 0)[0].1, None);
    }

    #[test]
    fn upfront_costs_spread_over_the_term() {
        let p = Price {
            name: "bought".into(),
            description: String::new(),
            usd_per_instance_hour: 0.0,
            upfront_usd: 3600.0,
            usd_per_vcpu_hour: None,
            usd_per_gb_hour: None,
        };
        let by_term = p.per_user_month(1.0, 100);
        assert_eq!(by_term, vec![(1, Some(36.0)), (12, Some(3.0)), (36, Some(1.0))]);
        assert_eq!(p.used_usd(3600.0, 0.0), None);
    }

    #[test]
    fn per_second_billing() {
        let pricing = pricing();
        let p = pricing.get("m7g.medium-2026").unwrap();
        // One vCPU busy for an hour and 2 GB held for an hour.
        let usd = p.used_usd(3600.0, 7200.0).unwrap();
        assert!((usd - (0.04048 + 2.0 * 0.004445)).abs() < 1e-12);
    }

    #[test]
    fn bad_pricing_files_are_refused() {
        assert!(Pricing::parse("default = \"x\"\n[[price]]\nname = \"y\"\nusd_per_instance_hour = 1\n")
            .unwrap_err()
            .to_string()
            .contains("no price named \"x\""));
        assert!(Pricing::parse("default = \"y\"\n[[price]]\nname = \"y\"\nusd_per_instance_hour = -1\n").is_err());
    }
}
