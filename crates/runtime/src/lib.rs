//! `sprout-runtime`: EbbRT's execution model on Linux — one event loop per core, pinned to
//! its CPU, non-preemptive and run-to-completion, and Elastic Building Blocks (Ebbs):
//! partitioned objects whose per-core representatives are built on first use.
//!
//! An *event* is a closure. It runs to its end on the core that dispatched it; nothing
//! preempts it, so state owned by a core (its Ebb representatives, the connections it
//! accepted) is used without locks. Events come from five places, all on the same loop:
//!
//! * [`spawn`]: an event on this core, after the current one;
//! * [`spawn_on`]: an event on another core (a message to that core's loop);
//! * [`timer`]: an event after a delay;
//! * [`add_idle`]: a handler polled whenever nothing else is queued (EbbRT's device drivers
//!   poll this way under load); while one is registered the core spins instead of sleeping;
//! * [`register`]: an [`IoHandler`] called on I/O readiness (epoll, edge-triggered).
//!
//! A core sleeps in `epoll_wait` only when it has nothing queued, no idle handler and no due
//! timer; an event sent from another core wakes it through an eventfd.
//!
//! # Ebbs
//!
//! EbbRT's example is the event manager's `GetNum`: each core counts the events it dispatched
//! in its own representative, with no synchronization, and a gather sums them on demand.
//!
//! ```
//! use std::cell::Cell;
//! use std::sync::{mpsc, Arc};
//! use sprout_runtime::{Ebb, EbbRef, CoreId, Runtime};
//!
//! /// A per-core counter: each representative counts on its own core.
//! struct Counter { count: Cell<u64> }
//!
//! impl Ebb for Counter {
//!     type Root = ();                                // nothing shared
//!     fn create_rep(_root: &Arc<()>, _core: CoreId) -> Counter {
//!         Counter { count: Cell::new(0) }            // the fault handler
//!     }
//! }
//!
//! let rt = Runtime::builder().cores(2).build().unwrap();
//! let counter = EbbRef::<Counter>::create(());
//! let (done, counted) = mpsc::channel();
//! for core in 0..2 {
//!     let done = done.clone();
//!     rt.spawn_on(core, move || {
//!         for _ in 0..1000 {
//!             counter.with(|c| c.count.set(c.count.get() + 1));   // no lock, no atomic
//!         }
//!         done.send(()).unwrap();
//!     });
//! }
//! counted.recv().unwrap();
//! counted.recv().unwrap();
//! let (tx, rx) = mpsc::channel();
//! rt.spawn_on(0, move || {
//!     counter.gather(|c| c.count.get(), move |counts| {
//!         tx.send(counts.iter().map(|(_, n)| n).sum::<u64>()).unwrap();
//!     });
//! });
//! assert_eq!(rx.recv().unwrap(), 2000);
//! ```

mod ebb;
mod event;
mod runtime;

pub use ebb::{Ebb, EbbId, EbbRef};
pub use event::{Control, CoreId, IdleId, IoHandler, Ready, TimerId};
pub use mio::{self, Token};
pub use runtime::{allowed_cpus, pin_to, Builder, Runtime, Stopper};

use std::time::Duration;

/// Run `f` as an event on this core, after the current event.
pub fn spawn(f: impl FnOnce() + 'static) {
    event::with_core(|c| c.spawn(Box::new(f)));
}

/// Run `f` as an event on `core` (this core included). Panics if there is no such core.
pub fn spawn_on(core: CoreId, f: impl FnOnce() + Send + 'static) {
    event::with_core(|c| {
        if core == c.id {
            c.spawn(Box::new(f));
        } else {
            c.shared.inboxes[core].push(Box::new(f));
        }
    });
}

/// Run `f` as an event on this core once `after` has passed.
pub fn timer(after: Duration, f: impl FnOnce() + 'static) -> TimerId {
    event::with_core(|c| c.timer(after, Box::new(f)))
}

/// Cancel a timer of this core; false if it already fired (or was cancelled).
pub fn cancel_timer(id: TimerId) -> bool {
    event::with_core(|c| c.cancel_timer(id))
}

/// Poll `f` whenever this core has nothing else to do, until `remove_idle`.
pub fn add_idle(f: impl FnMut() + 'static) -> IdleId {
    event::with_core(|c| c.add_idle(Box::new(f)))
}

pub fn remove_idle(id: IdleId) {
    event::with_core(|c| c.remove_idle(id))
}

/// Register an I/O handler with this core's epoll (edge-triggered, readable and writable).
/// Its events run on this core until it returns `Control::Close`.
pub fn register(handler: Box<dyn IoHandler>) -> std::io::Result<Token> {
    event::with_core(|c| c.register(handler))
}

/// Call the I/O handler of `token` on this core with `Ready::notified`, after the current
/// event (a deferred wake-up, e.g. when a gather it waited for has finished).
pub fn notify(token: Token) {
    event::with_core(|c| c.notify(token))
}

/// The core this event runs on.
pub fn current_core() -> CoreId {
    event::with_core(|c| c.id)
}

/// Whether the calling thread is one of the runtime's cores.
pub fn on_core() -> bool {
    event::on_core()
}

/// How many cores the runtime has.
pub fn num_cores() -> usize {
    event::with_core(|c| c.shared.inboxes.len())
}

/// Events this core has dispatched (EbbRT's `GetNumCore`).
pub fn events_dispatched() -> u64 {
    event::with_core(|c| c.dispatched.get())
}

/// I/O handlers registered on this core.
pub fn io_handlers() -> usize {
    event::with_core(|c| c.io_handlers())
}

/// Stop every core after its current event.
pub fn stop() {
    event::with_core(|c| c.shared.stop())
}
