//! One core's event manager: a non-preemptive, run-to-completion loop over local events,
//! events sent from other cores, timers, idle handlers and I/O readiness (epoll, via mio).
//!
//! Everything here is reached through its free functions (`spawn`, `spawn_on`, `timer`,
//! `register`, ..., re-exported at the crate root), which find the current core's manager in a
//! thread-local: like EbbRT's `event_mgr`, each core has its own representative and none of
//! its state is shared, so none of it is locked. The only cross-core path is the inbox, a
//! short mutex-guarded vector plus an eventfd that wakes the core when it sleeps in epoll.

use std::cell::{Cell, RefCell};
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mio::{Events, Interest, Poll, Registry, Token, Waker};
use slab::Slab;

use crate::poll_policy::PollPolicy;

/// A core of the runtime: 0 .. `num_cores()`.
pub type CoreId = usize;

type LocalEvent = Box<dyn FnOnce()>;
pub(crate) type RemoteEvent = Box<dyn FnOnce() + Send>;

/// Pause hints between two empty polls while spinning (a microsecond or two).
const SPIN_BACKOFF: u32 = 512;

/// The token of the inbox's eventfd; I/O handlers get tokens from their slab, below it.
const WAKE_TOKEN: Token = Token(usize::MAX);

/// What an I/O handler saw: the readiness epoll reported, or a wake-up from `notify`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Ready {
    pub readable: bool,
    pub writable: bool,
    /// The peer closed, or the socket has an error: read to find out which.
    pub closed: bool,
    /// `notify(token)` was called (by an event on this core, e.g. a finished gather).
    pub notified: bool,
}

/// Whether an I/O handler stays registered after handling readiness.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Control {
    Keep,
    /// Deregister and drop the handler (closing what it owns).
    Close,
}

/// Something that owns an I/O source (a socket) and handles its readiness. It is registered
/// edge-triggered for both reading and writing: it must consume what it can each time (or
/// remember that it stopped early) because the same readiness is not reported twice.
pub trait IoHandler {
    /// The source to register with epoll.
    fn source(&mut self) -> &mut dyn mio::event::Source;
    /// Readiness arrived (or a notification); runs to completion on this core.
    fn ready(&mut self, token: Token, ready: Ready) -> Control;
}

/// The part of a core other cores can reach: its inbox.
pub(crate) struct Inbox {
    queue: Mutex<Vec<RemoteEvent>>,
    /// Set by a sender that wrote the eventfd; cleared by the core before it drains. At most
    /// one eventfd write per drain, however many events are sent.
    notified: AtomicBool,
    waker: Waker,
    /// How the core's polls went, written by the core alone, read by any.
    polls: PollCounters,
}

/// The counts behind [`PollCounts`]: atomics with a single writer (its core).
#[derive(Default)]
struct PollCounters {
    slept: AtomicU64,
    spun: AtomicU64,
    spun_found: AtomicU64,
}

impl PollCounters {
    fn bump(counter: &AtomicU64) {
        counter.store(counter.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }
}

/// How a core's polls for events went: what its poll policy cost and saved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PollCounts {
    /// Polls that may have slept: nothing to run, no window open.
    pub slept: u64,
    /// Polls that returned at once only because a polling window was open (a spin).
    pub spun: u64,
    /// Of those, the ones that found an event: each a sleep and a wake-up saved.
    pub spun_found: u64,
}

impl Inbox {
    pub(crate) fn new(waker: Waker) -> Inbox {
        Inbox { queue: Mutex::new(Vec::new()), notified: AtomicBool::new(false), waker, polls: PollCounters::default() }
    }

    fn poll_counts(&self) -> PollCounts {
        let read = |c: &AtomicU64| c.load(Ordering::Relaxed);
        PollCounts { slept: read(&self.polls.slept), spun: read(&self.polls.spun), spun_found: read(&self.polls.spun_found) }
    }

    pub(crate) fn push(&self, event: RemoteEvent) {
        self.queue.lock().unwrap_or_else(|e| e.into_inner()).push(event);
        self.wake();
    }

    pub(crate) fn wake(&self) {
        if !self.notified.swap(true, Ordering::AcqRel) {
            let _ = self.waker.wake();
        }
    }

    fn take(&self) -> Vec<RemoteEvent> {
        self.notified.store(false, Ordering::Release);
        std::mem::take(&mut *self.queue.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// What every core shares: the inboxes of all cores and the stop flag.
pub(crate) struct Shared {
    pub(crate) inboxes: Vec<Arc<Inbox>>,
    pub(crate) stop: AtomicBool,
}

impl Shared {
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        for inbox in &self.inboxes {
            inbox.wake();
        }
    }
}

/// A timer's handle, for `cancel_timer`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TimerId(u64);

/// An idle handler: run whenever the core has nothing else to do.
type IdleHandler = Box<dyn FnMut()>;

/// An idle handler's handle, for `remove_idle`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdleId(usize);

#[derive(Default)]
struct Timers {
    heap: BinaryHeap<std::cmp::Reverse<(Instant, u64)>>,
    callbacks: HashMap<u64, LocalEvent>,
    next: u64,
}

/// One core's event manager. Lives on its thread's stack for the life of the loop.
pub(crate) struct Core {
    pub(crate) id: CoreId,
    pub(crate) shared: Arc<Shared>,
    queue: RefCell<VecDeque<LocalEvent>>,
    timers: RefCell<Timers>,
    idle: RefCell<Slab<Option<IdleHandler>>>,
    io: RefCell<Slab<Option<Box<dyn IoHandler>>>>,
    /// Handlers notified while they were running (or before their turn): run after this
    /// round of readiness.
    notified: RefCell<Vec<Token>>,
    registry: Registry,
    /// Events dispatched on this core (EbbRT's GetNumCore).
    pub(crate) dispatched: Cell<u64>,
}

thread_local! {
    static CURRENT: Cell<*const Core> = const { Cell::new(std::ptr::null()) };
}

/// Run `f` with this thread's core. Panics off the runtime: the crate's free functions are
/// only meaningful inside an event.
pub(crate) fn with_core<R>(f: impl FnOnce(&Core) -> R) -> R {
    let ptr = CURRENT.with(|c| c.get());
    assert!(!ptr.is_null(), "not on a sprout-runtime core (call this from inside an event)");
    // SAFETY: the pointer is set by `run_loop` to a Core on its stack and cleared before that
    // Core is dropped; Core is neither Send nor Sync, so no reference leaves this thread.
    f(unsafe { &*ptr })
}

/// Whether the calling thread is one of the runtime's cores.
pub fn on_core() -> bool {
    !CURRENT.with(|c| c.get()).is_null()
}

/// Run `f` as an event on this core, after the current event.
pub fn spawn(f: impl FnOnce() + 'static) {
    with_core(|c| c.spawn(Box::new(f)));
}

/// Run `f` as an event on `core` (this core included). Panics if there is no such core.
pub fn spawn_on(core: CoreId, f: impl FnOnce() + Send + 'static) {
    with_core(|c| {
        if core == c.id {
            c.spawn(Box::new(f));
        } else {
            c.shared.inboxes[core].push(Box::new(f));
        }
    });
}

/// Run `f` as an event on this core once `after` has passed.
pub fn timer(after: Duration, f: impl FnOnce() + 'static) -> TimerId {
    with_core(|c| c.timer(after, Box::new(f)))
}

/// Cancel a timer of this core; false if it already fired (or was cancelled).
pub fn cancel_timer(id: TimerId) -> bool {
    with_core(|c| c.cancel_timer(id))
}

/// Poll `f` whenever this core has nothing else to do, until `remove_idle`.
pub fn add_idle(f: impl FnMut() + 'static) -> IdleId {
    with_core(|c| c.add_idle(Box::new(f)))
}

pub fn remove_idle(id: IdleId) {
    with_core(|c| c.remove_idle(id))
}

/// Register an I/O handler with this core's epoll (edge-triggered, readable and writable).
/// Its events run on this core until it returns `Control::Close`.
pub fn register(handler: Box<dyn IoHandler>) -> std::io::Result<Token> {
    with_core(|c| c.register(handler))
}

/// Call the I/O handler of `token` on this core with `Ready::notified`, after the current
/// event (a deferred wake-up, e.g. when a gather it waited for has finished).
pub fn notify(token: Token) {
    with_core(|c| c.notify(token))
}

/// The core this event runs on.
pub fn current_core() -> CoreId {
    with_core(|c| c.id)
}

/// How many cores the runtime has.
pub fn num_cores() -> usize {
    with_core(|c| c.shared.inboxes.len())
}

/// Events this core has dispatched (EbbRT's `GetNumCore`).
pub fn events_dispatched() -> u64 {
    with_core(|c| c.dispatched.get())
}

/// How each core's polls went, by core.
pub fn poll_counts() -> Vec<PollCounts> {
    with_core(|c| c.shared.inboxes.iter().map(|inbox| inbox.poll_counts()).collect())
}

/// I/O handlers registered on this core.
pub fn io_handlers() -> usize {
    with_core(|c| c.io_handlers())
}

/// Stop every core after its current event.
pub fn stop() {
    with_core(|c| c.shared.stop())
}

impl Core {
    pub(crate) fn spawn(&self, event: LocalEvent) {
        self.queue.borrow_mut().push_back(event);
    }

    pub(crate) fn timer(&self, after: Duration, event: LocalEvent) -> TimerId {
        let mut timers = self.timers.borrow_mut();
        let id = timers.next;
        timers.next += 1;
        timers.heap.push(std::cmp::Reverse((Instant::now() + after, id)));
        timers.callbacks.insert(id, event);
        TimerId(id)
    }

    pub(crate) fn cancel_timer(&self, id: TimerId) -> bool {
        self.timers.borrow_mut().callbacks.remove(&id.0).is_some()
    }

    pub(crate) fn add_idle(&self, handler: Box<dyn FnMut()>) -> IdleId {
        IdleId(self.idle.borrow_mut().insert(Some(handler)))
    }

    pub(crate) fn remove_idle(&self, id: IdleId) {
        let mut idle = self.idle.borrow_mut();
        if idle.contains(id.0) {
            idle.remove(id.0);
        }
    }

    pub(crate) fn register(&self, mut handler: Box<dyn IoHandler>) -> std::io::Result<Token> {
        let key = self.io.borrow_mut().insert(None);
        let token = Token(key);
        if let Err(e) = self.registry.register(handler.source(), token, Interest::READABLE | Interest::WRITABLE) {
            self.io.borrow_mut().remove(key);
            return Err(e);
        }
        self.io.borrow_mut()[key] = Some(handler);
        Ok(token)
    }

    pub(crate) fn notify(&self, token: Token) {
        self.notified.borrow_mut().push(token);
    }

    pub(crate) fn io_handlers(&self) -> usize {
        self.io.borrow().len()
    }

    /// Hand `ready` to the handler of `token`, then put it back, or drop it on `Close`. The
    /// handler is taken out of the slab while it runs, so it may register others.
    fn dispatch_io(&self, token: Token, ready: Ready) {
        let handler = match self.io.borrow_mut().get_mut(token.0) {
            Some(slot) => slot.take(),
            None => return,
        };
        let Some(mut handler) = handler else { return };
        self.dispatched.set(self.dispatched.get() + 1);
        match handler.ready(token, ready) {
            Control::Keep => {
                if let Some(slot) = self.io.borrow_mut().get_mut(token.0) {
                    *slot = Some(handler);
                }
            }
            Control::Close => {
                let _ = self.registry.deregister(handler.source());
                self.io.borrow_mut().remove(token.0);
                drop(handler);
            }
        }
    }

    /// Run the events queued now (not those they queue: I/O gets its turn in between).
    fn run_events(&self) -> usize {
        let n = self.queue.borrow().len();
        for _ in 0..n {
            let event = self.queue.borrow_mut().pop_front();
            match event {
                Some(event) => {
                    self.dispatched.set(self.dispatched.get() + 1);
                    event();
                }
                None => break,
            }
        }
        n
    }

    fn drain_inbox(&self) {
        let events = self.shared.inboxes[self.id].take();
        if !events.is_empty() {
            let mut queue = self.queue.borrow_mut();
            for event in events {
                queue.push_back(event);
            }
        }
    }

    /// Fire due timers; returns how long until the next one.
    fn run_timers(&self) -> Option<Duration> {
        loop {
            let now = Instant::now();
            let due = {
                let mut timers = self.timers.borrow_mut();
                match timers.heap.peek() {
                    Some(std::cmp::Reverse((at, id))) if *at <= now => {
                        let id = *id;
                        timers.heap.pop();
                        timers.callbacks.remove(&id)
                    }
                    Some(std::cmp::Reverse((at, _))) => return Some(*at - now),
                    None => return None,
                }
            };
            if let Some(event) = due {
                self.dispatched.set(self.dispatched.get() + 1);
                event();
            }
        }
    }

    fn run_idle(&self) {
        let keys: Vec<usize> = self.idle.borrow().iter().map(|(k, _)| k).collect();
        for key in keys {
            let handler = self.idle.borrow_mut().get_mut(key).and_then(Option::take);
            if let Some(mut handler) = handler {
                handler();
                if let Some(slot) = self.idle.borrow_mut().get_mut(key) {
                    *slot = Some(handler);
                }
            }
        }
    }

    fn run_notified(&self) {
        loop {
            let tokens = std::mem::take(&mut *self.notified.borrow_mut());
            if tokens.is_empty() {
                return;
            }
            for token in tokens {
                self.dispatch_io(token, Ready { notified: true, ..Ready::default() });
            }
        }
    }
}

/// The event loop of one core, run on its own (pinned) thread until the runtime stops.
///
/// `policy` says when to keep polling rather than block in epoll_wait (see `poll_policy`):
/// polling saves the sleep and wake-up of a request, which in a virtual machine cost an exit
/// and an interrupt each (EbbRT polls its device the same way while busy).
pub(crate) fn run_loop(id: CoreId, shared: Arc<Shared>, mut poll: Poll, mut policy: PollPolicy) {
    let registry = poll.registry().try_clone().expect("cloning the epoll registry");
    let core = Core {
        id,
        shared,
        queue: RefCell::new(VecDeque::new()),
        timers: RefCell::new(Timers::default()),
        idle: RefCell::new(Slab::new()),
        io: RefCell::new(Slab::new()),
        notified: RefCell::new(Vec::new()),
        registry,
        dispatched: Cell::new(0),
    };
    CURRENT.with(|c| c.set(&core));
    let mut events = Events::with_capacity(1024);
    let timed = policy.enabled();
    loop {
        core.drain_inbox();
        core.run_events();
        core.run_notified();
        let next_timer = core.run_timers();
        if core.shared.stop.load(Ordering::Acquire) {
            break;
        }
        let busy = !core.queue.borrow().is_empty() || !core.notified.borrow().is_empty();
        let idling = !core.idle.borrow().is_empty();
        let spinning = timed && policy.poll(Instant::now());
        if spinning && !busy && !idling {
            // Back off between empty polls: each epoll_wait takes the epoll lock that the
            // peers' wake-ups take too, so polling flat out slows the very senders it waits on.
            for _ in 0..SPIN_BACKOFF {
                std::hint::spin_loop();
            }
        }
        let timeout = if busy || idling || spinning { Some(Duration::ZERO) } else { next_timer };
        let polls = &core.shared.inboxes[id].polls;
        let spun = spinning && !busy && !idling;
        if spun {
            PollCounters::bump(&polls.spun);
        } else if timeout != Some(Duration::ZERO) {
            PollCounters::bump(&polls.slept);
        }
        if let Err(e) = poll.poll(&mut events, timeout) {
            if e.kind() != std::io::ErrorKind::Interrupted {
                tracing::error!(core = id, "epoll failed: {e}");
                break;
            }
        }
        let returned = timed.then(Instant::now);
        let mut io_events = 0;
        if spun && !events.is_empty() {
            PollCounters::bump(&polls.spun_found);
        }
        for event in events.iter() {
            if event.token() == WAKE_TOKEN {
                continue;
            }
            io_events += 1;
            if let Some(returned) = returned {
                policy.ready(returned, event.token());
            }
            let ready = Ready {
                readable: event.is_readable() || event.is_read_closed(),
                writable: event.is_writable(),
                closed: event.is_read_closed() || event.is_write_closed() || event.is_error(),
                notified: false,
            };
            core.dispatch_io(event.token(), ready);
        }
        if let Some(returned) = returned {
            policy.arrived(returned, io_events);
            if io_events > 0 || busy {
                policy.finished(Instant::now());
            }
        }
        if io_events == 0 && idling && core.queue.borrow().is_empty() {
            core.run_idle();
        }
    }
    // Drop handlers (closing their sockets) and pending events while CURRENT still points
    // here, so their destructors may use the runtime's functions.
    let handlers: Vec<_> = core.io.borrow_mut().drain().flatten().collect();
    drop(handlers);
    core.queue.borrow_mut().clear();
    core.timers.borrow_mut().callbacks.clear();
    CURRENT.with(|c| c.set(std::ptr::null()));
}

pub(crate) const fn wake_token() -> Token {
    WAKE_TOKEN
}
