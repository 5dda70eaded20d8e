//! Starting and stopping the runtime: one thread per core, each pinned to its own CPU and
//! running its event loop until `stop`.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::thread::JoinHandle;

use mio::{Poll, Waker};

use crate::event::{self, CoreId, Inbox, Shared};
use crate::poll_policy::PollPolicy;

/// Configures a runtime: how many cores, and which CPUs they are pinned to.
#[derive(Clone, Debug, Default)]
pub struct Builder {
    cores: Option<usize>,
    cpus: Option<Vec<usize>>,
    pin: bool,
    name: Option<String>,
    spin: std::time::Duration,
    lone_spin: std::time::Duration,
    few_clients: usize,
}

impl Builder {
    pub fn new() -> Builder {
        Builder { pin: true, few_clients: 1, ..Default::default() }
    }

    /// Number of cores (event loops). Default: one per CPU this process may run on.
    pub fn cores(mut self, n: usize) -> Builder {
        self.cores = Some(n.max(1));
        self
    }

    /// The CPUs to pin cores to, in order (core i on `cpus[i % len]`). Default: the CPUs in
    /// this process's affinity mask, so `taskset -c 2,3 ...` confines the runtime.
    pub fn cpus(mut self, cpus: Vec<usize>) -> Builder {
        self.cpus = Some(cpus);
        self
    }

    /// Whether to pin each core's thread to its CPU (default true).
    pub fn pin(mut self, pin: bool) -> Builder {
        self.pin = pin;
        self
    }

    /// Keep polling for this long after the last event before sleeping (default: not at all).
    /// Saves a sleep and a wake-up per request under load, at the price of a busy CPU for
    /// `spin` after each burst.
    pub fn spin(mut self, spin: std::time::Duration) -> Builder {
        self.spin = spin;
        self
    }

    /// Keep polling up to this long for the next request while at most `few_clients` clients
    /// keep a core busy (default: not at all). Saves their wake-ups without costing many
    /// clients their gathering; see `PollPolicy`.
    pub fn lone_spin(mut self, window: std::time::Duration) -> Builder {
        self.lone_spin = window;
        self
    }

    /// The most clients (sockets found ready within 2 ms) a core polls for under `lone_spin`
    /// (default 1: a lone client; 0 counts as 1).
    pub fn few_clients(mut self, n: usize) -> Builder {
        self.few_clients = n;
        self
    }

    /// Thread name prefix (default "core").
    pub fn name(mut self, name: &str) -> Builder {
        self.name = Some(name.to_string());
        self
    }

    /// Start the cores. Each runs its loop until `Runtime::stop` (or `crate::stop` from an
    /// event); events can be sent to them at once.
    pub fn build(self) -> std::io::Result<Runtime> {
        let cpus = match self.cpus {
            Some(c) if !c.is_empty() => c,
            _ => allowed_cpus()?,
        };
        let cores = self.cores.unwrap_or(cpus.len()).max(1);
        let mut polls = Vec::with_capacity(cores);
        let mut inboxes = Vec::with_capacity(cores);
        for _ in 0..cores {
            let poll = Poll::new()?;
            let waker = Waker::new(poll.registry(), event::wake_token())?;
            inboxes.push(Arc::new(Inbox::new(waker)));
            polls.push(poll);
        }
        let shared = Arc::new(Shared { inboxes, stop: AtomicBool::new(false) });
        let prefix = self.name.unwrap_or_else(|| "core".into());
        let mut threads = Vec::with_capacity(cores);
        for (id, poll) in polls.into_iter().enumerate() {
            let shared = shared.clone();
            let cpu = cpus[id % cpus.len()];
            let pin = self.pin;
            let policy = PollPolicy::new(self.spin, self.lone_spin, self.few_clients);
            let handle = std::thread::Builder::new().name(format!("{prefix}-{id}")).spawn(move || {
                if pin {
                    if let Err(e) = pin_to(cpu) {
                        tracing::warn!(core = id, cpu, "could not pin the core's thread: {e}");
                    }
                }
                event::run_loop(id, shared, poll, policy);
            })?;
            threads.push(handle);
        }
        let pinned = if self.pin { cpus.iter().take(cores).copied().collect() } else { Vec::new() };
        Ok(Runtime { shared, threads, cpus: pinned })
    }
}

/// A running runtime. Dropping it stops the cores and waits for them.
pub struct Runtime {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    cpus: Vec<usize>,
}

impl Runtime {
    pub fn builder() -> Builder {
        Builder::new()
    }

    pub fn num_cores(&self) -> usize {
        self.shared.inboxes.len()
    }

    /// The CPU each core is pinned to (empty when not pinned).
    pub fn cpus(&self) -> &[usize] {
        &self.cpus
    }

    /// Run `f` as an event on `core`.
    pub fn spawn_on(&self, core: CoreId, f: impl FnOnce() + Send + 'static) {
        self.shared.inboxes[core].push(Box::new(f));
    }

    /// Run `f(core)` as an event on every core.
    pub fn spawn_on_all(&self, f: impl Fn(CoreId) + Send + Sync + 'static) {
        let f = Arc::new(f);
        for core in 0..self.num_cores() {
            let f = f.clone();
            self.spawn_on(core, move || f(core));
        }
    }

    /// Ask every core to stop after the event it is running.
    pub fn stop(&self) {
        self.shared.stop();
    }

    /// Wait for every core's loop to end (after `stop`).
    pub fn join(mut self) {
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }

    /// A handle that can stop the runtime from another thread (a signal handler's thread).
    pub fn stopper(&self) -> Stopper {
        Stopper(self.shared.clone())
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        self.shared.stop();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Stops a runtime from any thread.
#[derive(Clone)]
pub struct Stopper(Arc<Shared>);

impl Stopper {
    pub fn stop(&self) {
        self.0.stop();
    }
}

/// The CPUs this process may run on, in order.
pub fn allowed_cpus() -> std::io::Result<Vec<usize>> {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity fills it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok((0..libc::CPU_SETSIZE as usize).filter(|&c| libc::CPU_ISSET(c, &set)).collect())
    }
}

/// Pin the calling thread to one CPU.
pub fn pin_to(cpu: usize) -> std::io::Result<()> {
    // SAFETY: as above; sched_setaffinity(0) applies to the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}
