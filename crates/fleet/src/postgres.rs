//! The fleet's PostgreSQL: Debian's server, one cluster per fleet under
//! `/var/lib/sprout/fleet-pg/<tag>` (owned by the `postgres` user, which must be able to reach
//! it), listening on the host side of every member's link; it holds the shared registry's
//! database. Started by `up`, stopped and removed by `down`.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

/// The registry's database.
pub const DATABASE: &str = "sprout_registry";
const USER: &str = "postgres";

/// A fleet's cluster.
pub struct Cluster {
    pub data: PathBuf,
    pub port: u16,
}

/// Debian's server programs (the newest installed major version).
fn binary(name: &str) -> Result<PathBuf> {
    let mut versions: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .context("no PostgreSQL server here (apt-get install postgresql, or run scripts/setup.sh)")?
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path())))
        .collect();
    versions.sort();
    let (_, dir) = versions.pop().context("no PostgreSQL server version under /usr/lib/postgresql")?;
    Ok(dir.join("bin").join(name))
}

fn as_postgres(program: &Path, args: &[&str], what: &str) -> Result<()> {
    let out = Command::new("runuser")
        .args(["-u", USER, "--"])
        .arg(program)
        .args(args)
        .current_dir("/")
        .output()
        .with_context(|| format!("{what}: running runuser"))?;
    if !out.status.success() {
        bail!("{what} failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

impl Cluster {
    pub fn for_tag(tag: &str, port: u16) -> Cluster {
        Cluster { data: PathBuf::from(format!("/var/lib/sprout/fleet-pg/{tag}")), port }
    }

    /// Make the cluster (trusting the fleet's subnet `10.200.<subnet>.0/24`), start it, and
    /// make the registry's database.
    pub fn start(&self, subnet: u8) -> Result<()> {
        self.remove();
        let parent = self.data.parent().expect("has a parent");
        fs::create_dir_all(parent)?;
        fs::create_dir_all(&self.data)?;
        let chown = Command::new("chown").arg(format!("{USER}:{USER}")).arg(&self.data).status();
        if !chown.map(|s| s.success()).unwrap_or(false) {
            bail!("could not give {} to the {USER} user", self.data.display());
        }
        let data = self.data.to_string_lossy().to_string();
        as_postgres(&binary("initdb")?, &["-D", &data, "-U", USER, "-E", "UTF8", "--locale=C", "--auth=trust", "--no-sync"], "initdb")?;
        let hba = self.data.join("pg_hba.conf");
        let mut rules = fs::read_to_string(&hba)?;
        rules.push_str(&format!("# The fleet's workers, each from its own address.\nhost all all 10.200.{subnet}.0/24 trust\n"));
        fs::write(&hba, rules)?;
        let options = format!("-p {} -c listen_addresses='*' -k {data}", self.port);
        let log = self.data.join("server.log").to_string_lossy().to_string();
        as_postgres(&binary("pg_ctl")?, &["-D", &data, "-l", &log, "-w", "-t", "60", "-o", &options, "start"], "starting PostgreSQL")?;
        let out = Command::new(binary("psql")?)
            .args(["-h", &data, "-p", &self.port.to_string(), "-U", USER, "-d", "postgres", "-c", &format!("CREATE DATABASE {DATABASE}")])
            .output()?;
        if !out.status.success() {
            bail!("creating the registry's database: {}", String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(())
    }

    /// The registry's connection string as a worker at the far end of `host_addr` sees it.
    pub fn url(&self, host_addr: std::net::Ipv4Addr) -> String {
        format!("postgresql://{USER}@{host_addr}:{}/{DATABASE}", self.port)
    }

    /// Stop the server (if it runs) and remove the cluster.
    pub fn remove(&self) {
        if self.data.join("postmaster.pid").exists() {
            if let Ok(pg_ctl) = binary("pg_ctl") {
                let _ = as_postgres(
                    &pg_ctl,
                    &["-D", &self.data.to_string_lossy(), "-m", "fast", "-w", "-t", "60", "stop"],
                    "stopping PostgreSQL",
                );
            }
        }
        let _ = fs::remove_dir_all(&self.data);
    }
}
