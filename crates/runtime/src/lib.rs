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
//! A core sleeps in `epoll_wait` only when it has nothing queued, no idle handler, no due
//! timer and its polling policy (`Builder::spin`, `Builder::lone_spin`) says not to poll; an
//! event sent from another core wakes it through an eventfd.
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
mod poll_policy;
mod runtime;

pub use ebb::{Ebb, EbbId, EbbRef};
pub use event::{
    add_idle, cancel_timer, current_core, events_dispatched, io_handlers, notify, num_cores, on_core, poll_counts, register, remove_idle,
    spawn, spawn_on, stop, timer, Control, CoreId, IdleId, IoHandler, PollCounts, Ready, TimerId,
};
pub use mio::{self, Token};
pub use runtime::{allowed_cpus, pin_to, Builder, Runtime, Stopper};
