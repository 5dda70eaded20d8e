//! The listeners and client connections `stats conns` lists, by socket (memcached's numbers
//! are its file descriptors, and so are ours): each one's address, its listener's address, its
//! state in memcached's words and the seconds since its last command. A connection writes its
//! own entry's state and time with relaxed stores; the table's lock is taken only to open,
//! close and report.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

/// A connection's state, as `stats conns` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum ConnState {
    Listening,
    /// Between commands.
    Waiting,
    /// Reading a value.
    Nread,
    Watch,
}

impl ConnState {
    fn name(self) -> &'static str {
        match self {
            ConnState::Listening => "conn_listening",
            ConnState::Waiting => "conn_waiting",
            ConnState::Nread => "conn_nread",
            ConnState::Watch => "conn_watch",
        }
    }

    fn from_u8(v: u8) -> ConnState {
        [ConnState::Listening, ConnState::Waiting, ConnState::Nread, ConnState::Watch][v as usize]
    }
}

pub struct ConnEntry {
    addr: String,
    /// The listener's address; None for a listener.
    listen_addr: Option<String>,
    state: AtomicU8,
    last_cmd: AtomicU32,
}

impl ConnEntry {
    pub fn set_state(&self, state: ConnState) {
        self.state.store(state as u8, Ordering::Relaxed);
    }

    /// A command arrived at `now` (the server clock's seconds).
    pub fn touched(&self, now: u32) {
        self.last_cmd.store(now, Ordering::Relaxed);
    }
}

/// memcached's `conn_to_str` form: `tcp:<ip>:<port>` (`[ip]` for IPv6).
pub fn tcp_addr(addr: SocketAddr) -> String {
    format!("tcp:{addr}")
}

#[derive(Default)]
pub struct ConnTable {
    entries: Mutex<BTreeMap<i32, Arc<ConnEntry>>>,
}

impl ConnTable {
    /// Add a listener (`listen_addr` None) or a connection on socket `fd`.
    pub fn open(&self, fd: i32, addr: String, listen_addr: Option<String>, now: u32) -> Arc<ConnEntry> {
        let state = if listen_addr.is_some() { ConnState::Waiting } else { ConnState::Listening };
        let entry = Arc::new(ConnEntry { addr, listen_addr, state: AtomicU8::new(state as u8), last_cmd: AtomicU32::new(now) });
        self.entries.lock().unwrap().insert(fd, entry.clone());
        entry
    }

    /// Listeners and connections open.
    pub fn len(&self) -> usize {
        self.entries.lock().unwrap().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn close(&self, fd: i32) {
        self.entries.lock().unwrap().remove(&fd);
    }

    /// `stats conns` at `now`; `asking`: the connection asking, which memcached shows
    /// processing its command.
    pub fn report(&self, asking: i32, now: u32) -> Vec<(String, String)> {
        let mut lines = Vec::new();
        for (fd, entry) in self.entries.lock().unwrap().iter() {
            lines.push((format!("{fd}:addr"), entry.addr.clone()));
            if let Some(listen) = &entry.listen_addr {
                lines.push((format!("{fd}:listen_addr"), listen.clone()));
            }
            let state = if *fd == asking { "conn_parse_cmd" } else { ConnState::from_u8(entry.state.load(Ordering::Relaxed)).name() };
            lines.push((format!("{fd}:state"), state.to_string()));
            let since = now.saturating_sub(entry.last_cmd.load(Ordering::Relaxed));
            lines.push((format!("{fd}:secs_since_last_cmd"), since.to_string()));
        }
        lines
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_listeners_and_connections_by_socket_in_memcacheds_words() {
        let table = ConnTable::default();
        let listen = tcp_addr("127.0.0.1:11211".parse().unwrap());
        table.open(5, listen.clone(), None, 100);
        let client = table.open(9, tcp_addr("127.0.0.1:40000".parse().unwrap()), Some(listen.clone()), 100);
        table.open(7, tcp_addr("[::1]:40001".parse().unwrap()), Some(listen), 100);
        client.set_state(ConnState::Nread);
        client.touched(103);
        let lines = table.report(7, 105);
        let get = |k: &str| lines.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(lines[0], ("5:addr".into(), "tcp:127.0.0.1:11211".into()));
        assert_eq!((get("5:state"), get("5:listen_addr")), (Some("conn_listening"), None));
        assert_eq!(get("7:addr"), Some("tcp:[::1]:40001"));
        assert_eq!((get("7:state"), get("9:state")), (Some("conn_parse_cmd"), Some("conn_nread")));
        assert_eq!((get("9:secs_since_last_cmd"), get("7:secs_since_last_cmd")), (Some("2"), Some("5")));
        assert_eq!(lines.last().map(|(n, _)| n.split(":").next().unwrap()), Some("9"), "ordered by socket");
        table.close(9);
        assert!(table.report(7, 105).iter().all(|(n, _)| !n.starts_with("9:")));
    }
}
