//! HAProxy's runtime API over its admin socket: one command per connection, and the few
//! answers the fleet reads (`show stat`'s per-server state and current sessions).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};

/// Send one command and return HAProxy's answer.
pub fn command(socket: &Path, command: &str) -> Result<String> {
    let mut stream = UnixStream::connect(socket).with_context(|| format!("connecting to HAProxy's runtime API at {}", socket.display()))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.write_all(format!("{command}\n").as_bytes())?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    Ok(answer)
}

/// A server's line of `show stat`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerStat {
    pub backend: String,
    pub server: String,
    /// Sessions it serves now.
    pub sessions: u64,
    /// UP, DOWN, DRAIN, MAINT, ... (with HAProxy's transition suffixes).
    pub status: String,
}

/// The servers' lines of a `show stat` CSV answer.
pub fn parse_stat(csv: &str) -> Result<Vec<ServerStat>> {
    let mut lines = csv.lines();
    let header = lines.next().unwrap_or_default().trim_start_matches("# ");
    let columns: Vec<&str> = header.split(',').collect();
    let col = |name: &str| columns.iter().position(|c| *c == name);
    let (Some(px), Some(sv), Some(scur), Some(status)) = (col("pxname"), col("svname"), col("scur"), col("status")) else {
        bail!("HAProxy's show stat answered without the expected columns: {header:?}");
    };
    Ok(lines
        .map(|l| l.split(',').collect::<Vec<_>>())
        .filter(|f| f.len() > status && f[sv] != "FRONTEND" && f[sv] != "BACKEND")
        .map(|f| ServerStat {
            backend: f[px].to_string(),
            server: f[sv].to_string(),
            sessions: f[scur].parse().unwrap_or(0),
            status: f[status].to_string(),
        })
        .collect())
}

/// Every server's state now.
pub fn servers(socket: &Path) -> Result<Vec<ServerStat>> {
    parse_stat(&command(socket, "show stat")?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn show_stat_gives_each_servers_sessions_and_status() {
        let csv = "# pxname,svname,qcur,qmax,scur,smax,slim,stot,status,weight\n\
                   api,FRONTEND,,,3,5,8192,40,OPEN,\n\
                   lambdas,w1,0,0,2,4,,30,UP,1\n\
                   lambdas,w2,0,0,0,1,,10,DRAIN,0\n\
                   lambdas,BACKEND,0,0,2,5,,40,UP,2\n";
        let stats = parse_stat(csv).unwrap();
        assert_eq!(stats.len(), 2);
        assert_eq!(stats[0], ServerStat { backend: "lambdas".into(), server: "w1".into(), sessions: 2, status: "UP".into() });
        assert_eq!((stats[1].sessions, stats[1].status.as_str()), (0, "DRAIN"));
    }

    #[test]
    fn an_answer_without_the_columns_is_an_error() {
        assert!(parse_stat("Unknown command\n").is_err());
    }
}
