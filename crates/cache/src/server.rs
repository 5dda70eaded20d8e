//! The server: one runtime core per `-t`, each with its own listening socket on the shared
//! port (SO_REUSEPORT), accepting connections that then live for good on the core with the
//! fewest (`core_loads`: the kernel's hash alone leaves cores uneven). The connection limit is one shared
//! count; a connection over it is told so in memcached's words and closed.

use std::io::Write;
use std::net::{SocketAddr, TcpListener as StdListener};
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use anyhow::{Context, Result};
use socket2::{Domain, Protocol, Socket, Type};
use sprout_runtime::mio::net::TcpListener;
use sprout_runtime::{Control, EbbRef, IoHandler, Ready, Runtime, Stopper, Token};

use crate::conn::Conn;
use crate::shared::{Settings, Shared};
use crate::stats::{CoreStats, StatsRoot};

/// A running cache server.
pub struct Server {
    runtime: Option<Runtime>,
    addr: SocketAddr,
    shared: Arc<Shared>,
}

impl Server {
    /// Bind and start serving: returns once every core listens.
    pub fn start(settings: Settings) -> Result<Server> {
        let mut builder = Runtime::builder()
            .cores(settings.cores)
            .name("cache")
            .pin(settings.pin)
            .spin(std::time::Duration::from_micros(settings.spin_us))
            .lone_spin(std::time::Duration::from_micros(settings.lone_spin_us))
            .few_clients(settings.poll_clients);
        if let Some(cpus) = &settings.cpus {
            builder = builder.cpus(cpus.clone());
        }
        let ip: std::net::IpAddr = settings.listen.parse().with_context(|| format!("bad listen address {:?}", settings.listen))?;
        // The first socket picks the port (when 0 asks for any); the others share it.
        let first =
            bind(SocketAddr::new(ip, settings.port)).with_context(|| format!("listening on {}:{}", settings.listen, settings.port))?;
        let addr = first.local_addr()?;
        let mut listeners = vec![first];
        for _ in 1..settings.cores {
            listeners.push(bind(addr)?);
        }
        let stats = EbbRef::<CoreStats>::create(StatsRoot { cores: settings.cores });
        let mut settings = settings;
        settings.port = addr.port();
        let shared = Arc::new(Shared::new(settings, stats));
        let runtime = builder.build().context("starting the runtime's cores")?;
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        for (core, listener) in listeners.into_iter().enumerate() {
            let shared = shared.clone();
            let ready_tx = ready_tx.clone();
            runtime.spawn_on(core, move || {
                let fd = listener.as_raw_fd();
                shared.conn_table.open(fd, crate::conn_table::tcp_addr(addr), None, shared.clock.now());
                crawl_every_second(shared.clone(), core, shared.settings.cores);
                let acceptor = Acceptor { listener: TcpListener::from_std(listener), shared, fd };
                let _ = ready_tx.send(sprout_runtime::register(Box::new(acceptor)).map(|_| ()));
            });
        }
        for _ in 0..runtime.num_cores() {
            ready_rx.recv().context("a core stopped while starting")?.context("registering a listener")?;
        }
        Ok(Server { runtime: Some(runtime), addr, shared })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// The CPUs the cores are pinned to.
    pub fn cpus(&self) -> Vec<usize> {
        self.runtime.as_ref().map(|r| r.cpus().to_vec()).unwrap_or_default()
    }

    pub fn stopper(&self) -> Stopper {
        self.runtime.as_ref().expect("running").stopper()
    }

    /// Wait until the server is stopped (by a `Stopper`).
    pub fn wait(mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.join();
        }
    }
}

fn bind(addr: SocketAddr) -> std::io::Result<StdListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    Ok(socket.into())
}

/// Entries each crawl step looks at, per shard: bounded, so a step holds a shard's lock for
/// well under a millisecond however large the store.
const CRAWL_BUDGET: usize = 4096;

/// memcached's LRU crawler, on every core: each second a core looks over its share of the
/// store's shards and frees the expired and flushed items it finds, so their memory returns
/// (and `stats` shows it) without waiting for a request to meet them.
fn crawl_every_second(shared: Arc<Shared>, core: usize, cores: usize) {
    sprout_runtime::timer(std::time::Duration::from_secs(1), move || {
        let now = shared.clock.now();
        for shard in (core..crate::store::SHARDS).step_by(cores.max(1)) {
            shared.store.crawl(shard, CRAWL_BUDGET, now);
        }
        crawl_every_second(shared, core, cores);
    });
}

/// A core's listening socket.
struct Acceptor {
    fd: i32,
    listener: TcpListener,
    shared: Arc<Shared>,
}

impl Drop for Acceptor {
    fn drop(&mut self) {
        self.shared.conn_table.close(self.fd);
    }
}

impl IoHandler for Acceptor {
    fn source(&mut self) -> &mut dyn sprout_runtime::mio::event::Source {
        &mut self.listener
    }

    fn ready(&mut self, token: Token, _ready: Ready) -> Control {
        let stats = self.shared.stats.rep_rc();
        loop {
            match self.listener.accept() {
                Ok((stream, _)) => {
                    let open = self.shared.conns.fetch_add(1, Ordering::Relaxed);
                    if open >= self.shared.settings.max_conns {
                        self.shared.conns.fetch_sub(1, Ordering::Relaxed);
                        CoreStats::bump(&stats.rejected_connections);
                        let mut stream = stream;
                        let _ = stream.write_all(b"ERROR Too many open connections\r\n");
                        continue;
                    }
                    let _ = stream.set_nodelay(true);
                    let me = sprout_runtime::current_core();
                    let core = self.shared.loads.place(me);
                    if core == me {
                        live_here(stream, self.shared.clone(), stats.clone());
                    } else {
                        let shared = self.shared.clone();
                        sprout_runtime::spawn_on(core, move || {
                            let stats = shared.stats.rep_rc();
                            live_here(stream, shared, stats);
                        });
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Control::Keep,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // Out of descriptors and the like: try again shortly (no new edge will
                    // come for connections already waiting).
                    tracing::warn!("accept failed: {e}");
                    sprout_runtime::timer(std::time::Duration::from_millis(10), move || sprout_runtime::notify(token));
                    return Control::Keep;
                }
            }
        }
    }
}

/// Start serving an accepted connection on this core.
fn live_here(stream: sprout_runtime::mio::net::TcpStream, shared: Arc<Shared>, stats: std::rc::Rc<CoreStats>) {
    let conn = Conn::new(stream, shared, stats);
    if let Err(e) = sprout_runtime::register(Box::new(conn)) {
        tracing::warn!("registering a connection: {e}");
    }
}

/// Serve until SIGINT or SIGTERM, then stop every core and return.
pub fn serve_until_signal(settings: Settings, on_ready: impl FnOnce(&Server)) -> Result<()> {
    // Block the signals before any core starts (threads inherit the mask), and wait for
    // them on this thread.
    // SAFETY: sigset_t is plain data, for which all-zero bytes are a valid value.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: plain signal-mask manipulation on `set`, a live local the calls only write and
    // read; a null old-mask pointer is allowed.
    unsafe {
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
    let server = Server::start(settings)?;
    on_ready(&server);
    let stopper = server.stopper();
    let mut signal = 0;
    // SAFETY: sigwait with the set blocked above.
    unsafe { libc::sigwait(&set, &mut signal) };
    tracing::info!("signal {signal}: stopping");
    stopper.stop();
    server.wait();
    Ok(())
}

/// A size as memcached's `-I` takes it: bytes, or with a k or m suffix.
pub fn parse_size(text: &str) -> Result<usize> {
    let t = text.trim().to_ascii_lowercase();
    let (digits, unit) = match t.strip_suffix('m') {
        Some(d) => (d, 1 << 20),
        None => match t.strip_suffix('k') {
            Some(d) => (d, 1 << 10),
            None => (t.as_str(), 1),
        },
    };
    let n: usize = digits.parse().with_context(|| format!("bad size {text:?} (bytes, or a number with k or m)"))?;
    Ok(n * unit)
}
