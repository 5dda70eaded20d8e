//! Preemption ticks while long requests run: one thread per CPU the worker may use, each
//! pinned to its CPU, waking every `limits.preempt_tick_us` while any request yields the CPU
//! as a long one ([`crate::instances`]), and asleep otherwise.
//!
//! Why: a request arriving wakes a worker thread, and this kernel (lazy preemption of the
//! fair class) makes a task that computes in user space give way to a woken fair task only at
//! the scheduler tick — every 4 ms at HZ=250 — even when the running task idles (`cpu.idle`).
//! A task of a higher class preempts at once, so the tick threads run as SCHED_FIFO: each
//! wake-up takes the CPU, and when the tick thread sleeps again the scheduler picks the woken
//! worker thread over the idling long request. They sit in the cpu hierarchy's root group,
//! where real-time tasks may run (cgroup v1 gives a child group no real-time time unless told
//! to); where they cannot be real-time they tick as ordinary threads (weaker: they wait for the
//! kernel's own tick too). A tick costs a few microseconds, only while long requests run.

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// The tick threads and how many long requests are running.
pub struct Ticker {
    shared: Arc<Shared>,
}

struct Shared {
    /// Long requests running now; closed when the worker stops.
    state: Mutex<(usize, bool)>,
    changed: Condvar,
    period: Duration,
    /// The `tasks` file of the cpu hierarchy's root group (cgroup v1), where real-time
    /// threads may run.
    rt_home: Option<std::path::PathBuf>,
}

impl Ticker {
    /// Start a tick thread on each CPU this process may run on (they sleep until needed).
    pub fn start(period: Duration, rt_home: Option<std::path::PathBuf>) -> std::io::Result<Ticker> {
        let shared = Arc::new(Shared { state: Mutex::new((0, false)), changed: Condvar::new(), period, rt_home });
        for cpu in allowed_cpus()? {
            let shared = shared.clone();
            std::thread::Builder::new().name(format!("sprout-tick-{cpu}")).spawn(move || {
                if let Err(e) = pin_to(cpu) {
                    tracing::debug!(cpu, "a tick thread stays unpinned: {e}");
                }
                shared.run();
            })?;
        }
        Ok(Ticker { shared })
    }

    /// A long request starts yielding: tick until it ends ([`LongRun`] dropped).
    pub fn long_request(&self) -> LongRun {
        let mut state = self.shared.state.lock().unwrap();
        state.0 += 1;
        if state.0 == 1 {
            self.shared.changed.notify_all();
        }
        LongRun { shared: self.shared.clone() }
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.shared.state.lock().unwrap().1 = true;
        self.shared.changed.notify_all();
    }
}

/// A long request under way; the ticks stop when none is left.
pub struct LongRun {
    shared: Arc<Shared>,
}

impl Drop for LongRun {
    fn drop(&mut self) {
        self.shared.state.lock().unwrap().0 -= 1;
    }
}

impl Shared {
    fn run(&self) {
        loop {
            {
                let mut state = self.state.lock().unwrap();
                if state.0 == 0 && !state.1 {
                    while state.0 == 0 && !state.1 {
                        state = self.changed.wait(state).unwrap();
                    }
                    // Ticking again: make sure of where it runs (the worker may have moved all
                    // its threads into a group of its own meanwhile) and how.
                    self.become_real_time();
                }
                if state.1 {
                    return;
                }
            }
            std::thread::sleep(self.period);
        }
    }

    /// Join the root cpu group and run as SCHED_FIFO at the lowest priority; failing, tick
    /// as an ordinary thread.
    fn become_real_time(&self) {
        // SAFETY: gettid takes nothing and returns this thread's id.
        let tid = unsafe { libc::gettid() };
        if let Some(tasks) = &self.rt_home {
            if let Err(e) = std::fs::write(tasks, tid.to_string()) {
                tracing::debug!("a tick thread stays in the worker's cpu group: {e}");
            }
        }
        let param = libc::sched_param { sched_priority: 1 };
        // SAFETY: `param` is a live, initialized sched_param the kernel only reads; 0 is this
        // thread.
        if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) } != 0 {
            tracing::debug!("a tick thread is not real-time: {}", std::io::Error::last_os_error());
        }
    }
}

fn allowed_cpus() -> std::io::Result<Vec<usize>> {
    let set = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)).map_err(std::io::Error::from)?;
    Ok((0..nix::sched::CpuSet::count()).filter(|cpu| set.is_set(*cpu).unwrap_or(false)).collect())
}

fn pin_to(cpu: usize) -> std::io::Result<()> {
    let mut set = nix::sched::CpuSet::new();
    set.set(cpu).map_err(std::io::Error::from)?;
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set).map_err(std::io::Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_run_only_while_a_long_request_does() {
        let ticker = Ticker::start(Duration::from_micros(250), None).unwrap();
        assert_eq!(ticker.shared.state.lock().unwrap().0, 0);
        let first = ticker.long_request();
        let second = ticker.long_request();
        assert_eq!(ticker.shared.state.lock().unwrap().0, 2);
        drop(first);
        drop(second);
        assert_eq!(ticker.shared.state.lock().unwrap().0, 0);
        assert!(!allowed_cpus().unwrap().is_empty());
    }
}
