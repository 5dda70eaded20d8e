//! The fleet's PostgreSQL: Debian's server, one cluster per fleet under
//! `/var/lib/sprout/fleet-pg/<tag>` (owned by the `postgres` user, which must be able to reach
//! it), listening on the fleet's services address only; it holds the shared registry's
//! database, and may hold the applications' (one primary for the fleet). The workers' addresses
//! log in by password (SCRAM), so a lambda allowed to reach an application's database cannot
//! read or change the registry; local socket connections (the operator, as root) are trusted.
//! Started by `up`, stopped and removed by `down`.

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

    /// Make the cluster (its superuser's password `password`, asked of the fleet's subnet
    /// `10.200.<subnet>.0/24`), start it on `listen`, and make the registry's database.
    pub fn start(&self, subnet: u8, listen: std::net::Ipv4Addr, password: &str) -> Result<()> {
        self.remove();
        let parent = self.data.parent().expect("has a parent");
        fs::create_dir_all(parent)?;
        fs::create_dir_all(&self.data)?;
        let chown = Command::new("chown").arg(format!("{USER}:{USER}")).arg(&self.data).status();
        if !chown.map(|s| s.success()).unwrap_or(false) {
            bail!("could not give {} to the {USER} user", self.data.display());
        }
        let data = self.data.to_string_lossy().to_string();
        as_postgres(
            &binary("initdb")?,
            &["-D", &data, "-U", USER, "-E", "UTF8", "--locale=C", "--auth-local=trust", "--auth-host=scram-sha-256", "--no-sync"],
            "initdb",
        )?;
        let hba = self.data.join("pg_hba.conf");
        let mut rules = fs::read_to_string(&hba)?;
        rules.push_str(&format!("# The fleet's workers (and their sandboxes' connections), each from its own address.\nhost all all 10.200.{subnet}.0/24 scram-sha-256\n"));
        fs::write(&hba, rules)?;
        let options = format!("-p {} -c listen_addresses='{listen}' -c password_encryption=scram-sha-256 -k {data}", self.port);
        let log = self.data.join("server.log").to_string_lossy().to_string();
        as_postgres(&binary("pg_ctl")?, &["-D", &data, "-l", &log, "-w", "-t", "60", "-o", &options, "start"], "starting PostgreSQL")?;
        // The password is hex (checked by the caller's making of it), so it needs no quoting.
        if !password.bytes().all(|b| b.is_ascii_hexdigit()) {
            bail!("the fleet's PostgreSQL password must be hex");
        }
        self.sql(&format!("ALTER ROLE {USER} PASSWORD '{password}'"), "setting the superuser's password")?;
        self.sql(&format!("CREATE DATABASE {DATABASE}"), "creating the registry's database")?;
        Ok(())
    }

    /// Run one statement as the superuser over the cluster's Unix socket.
    pub fn sql(&self, statement: &str, what: &str) -> Result<()> {
        let out = Command::new(binary("psql")?)
            .args(["-h", &self.data.to_string_lossy(), "-p", &self.port.to_string(), "-U", USER, "-d", "postgres", "-v", "ON_ERROR_STOP=1"])
            .args(["-c", statement])
            .output()?;
        if !out.status.success() {
            bail!("{what}: {}", String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(())
    }

    /// The registry's connection string at `addr` (the fleet's services address).
    pub fn url(&self, addr: std::net::Ipv4Addr, password: &str) -> String {
        format!("postgresql://{USER}:{password}@{addr}:{}/{DATABASE}", self.port)
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
