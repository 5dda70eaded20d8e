//! The runtime's contract: events run on the core they were sent to, in order, without
//! preemption; timers, idle handlers and I/O readiness dispatch there too; Ebb
//! representatives are built once per core on first access, stay isolated, and gather.

use std::cell::{Cell, RefCell};
use std::io::{Read, Write};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use sprout_runtime::mio::net::{TcpListener, TcpStream};
use sprout_runtime::{Control, CoreId, Ebb, EbbRef, IoHandler, Ready, Runtime, Token};

fn runtime(cores: usize) -> Runtime {
    Runtime::builder().cores(cores).pin(false).build().unwrap()
}

fn recv<T>(rx: &mpsc::Receiver<T>) -> T {
    rx.recv_timeout(Duration::from_secs(10)).expect("no answer from the runtime within 10 s")
}

#[test]
fn events_run_on_their_core_in_order() {
    let rt = runtime(2);
    let (tx, rx) = mpsc::channel();
    for core in 0..2 {
        let tx = tx.clone();
        rt.spawn_on(core, move || {
            let order = std::rc::Rc::new(RefCell::new(Vec::new()));
            for i in 0..5 {
                let order = order.clone();
                sprout_runtime::spawn(move || order.borrow_mut().push(i));
            }
            let tx = tx.clone();
            sprout_runtime::spawn(move || tx.send((core, sprout_runtime::current_core(), order.borrow().clone())).unwrap());
        });
    }
    let mut got = vec![recv(&rx), recv(&rx)];
    got.sort();
    assert_eq!(got, vec![(0, 0, vec![0, 1, 2, 3, 4]), (1, 1, vec![0, 1, 2, 3, 4])]);
}

#[test]
fn spawn_on_crosses_cores_and_back() {
    let rt = runtime(2);
    let (tx, rx) = mpsc::channel();
    rt.spawn_on(0, move || {
        sprout_runtime::spawn_on(1, move || {
            let on = sprout_runtime::current_core();
            sprout_runtime::spawn_on(0, move || tx.send((on, sprout_runtime::current_core())).unwrap());
        });
    });
    assert_eq!(recv(&rx), (1, 0));
}

#[test]
fn many_cross_core_messages_all_arrive() {
    let rt = runtime(2);
    let (tx, rx) = mpsc::channel();
    let count = Arc::new(AtomicUsize::new(0));
    let c = count.clone();
    rt.spawn_on(0, move || {
        for _ in 0..100_000 {
            let c = c.clone();
            sprout_runtime::spawn_on(1, move || {
                c.fetch_add(1, Ordering::Relaxed);
            });
        }
        sprout_runtime::spawn_on(1, move || tx.send(()).unwrap());
    });
    recv(&rx);
    assert_eq!(count.load(Ordering::Relaxed), 100_000);
}

#[test]
fn timers_fire_in_deadline_order_and_cancel() {
    let rt = runtime(1);
    let (tx, rx) = mpsc::channel();
    rt.spawn_on(0, move || {
        let start = Instant::now();
        for (ms, name) in [(60u64, "c"), (20, "a"), (40, "b")] {
            let tx = tx.clone();
            sprout_runtime::timer(Duration::from_millis(ms), move || tx.send((name, start.elapsed())).unwrap());
        }
        let tx2 = tx.clone();
        let cancelled = sprout_runtime::timer(Duration::from_millis(30), move || tx2.send(("cancelled", start.elapsed())).unwrap());
        assert!(sprout_runtime::cancel_timer(cancelled));
        assert!(!sprout_runtime::cancel_timer(cancelled));
    });
    let got: Vec<_> = (0..3).map(|_| recv(&rx)).collect();
    assert_eq!(got.iter().map(|(n, _)| *n).collect::<Vec<_>>(), vec!["a", "b", "c"]);
    assert!(got[0].1 >= Duration::from_millis(20));
    assert!(rx.recv_timeout(Duration::from_millis(100)).is_err(), "a cancelled timer fired");
}

#[test]
fn idle_handlers_poll_until_removed() {
    let rt = runtime(1);
    let (tx, rx) = mpsc::channel();
    rt.spawn_on(0, move || {
        let polls = std::rc::Rc::new(Cell::new(0u32));
        let id_cell = std::rc::Rc::new(Cell::new(None));
        let (p, ids) = (polls.clone(), id_cell.clone());
        let id = sprout_runtime::add_idle(move || {
            p.set(p.get() + 1);
            if p.get() == 1000 {
                sprout_runtime::remove_idle(ids.get().unwrap());
                tx.send(p.get()).unwrap();
            }
        });
        id_cell.set(Some(id));
    });
    assert_eq!(recv(&rx), 1000);
}

/// An echo connection: reads what arrives and writes it back, on its own core.
struct Echo {
    stream: TcpStream,
    core: Arc<Mutex<Vec<CoreId>>>,
}

impl IoHandler for Echo {
    fn source(&mut self) -> &mut dyn sprout_runtime::mio::event::Source {
        &mut self.stream
    }
    fn ready(&mut self, _token: Token, ready: Ready) -> Control {
        self.core.lock().unwrap().push(sprout_runtime::current_core());
        if !ready.readable {
            return Control::Keep;
        }
        let mut buf = [0u8; 4096];
        loop {
            match self.stream.read(&mut buf) {
                Ok(0) => return Control::Close,
                Ok(n) => self.stream.write_all(&buf[..n]).unwrap(),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Control::Keep,
                Err(_) => return Control::Close,
            }
        }
    }
}

struct Acceptor {
    listener: TcpListener,
    cores: Arc<Mutex<Vec<CoreId>>>,
}

impl IoHandler for Acceptor {
    fn source(&mut self) -> &mut dyn sprout_runtime::mio::event::Source {
        &mut self.listener
    }
    fn ready(&mut self, _token: Token, _ready: Ready) -> Control {
        while let Ok((stream, _)) = self.listener.accept() {
            sprout_runtime::register(Box::new(Echo { stream, core: self.cores.clone() })).unwrap();
        }
        Control::Keep
    }
}

#[test]
fn io_readiness_dispatches_on_the_registering_core() {
    let rt = runtime(2);
    let (tx, rx) = mpsc::channel();
    let cores = Arc::new(Mutex::new(Vec::new()));
    let c = cores.clone();
    rt.spawn_on(1, move || {
        let listener = TcpListener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        tx.send(listener.local_addr().unwrap()).unwrap();
        sprout_runtime::register(Box::new(Acceptor { listener, cores: c })).unwrap();
    });
    let addr = recv(&rx);
    let mut client = std::net::TcpStream::connect(addr).unwrap();
    client.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    for round in 0..50 {
        let msg = format!("hello {round}");
        client.write_all(msg.as_bytes()).unwrap();
        let mut got = vec![0; msg.len()];
        client.read_exact(&mut got).unwrap();
        assert_eq!(got, msg.as_bytes());
    }
    drop(client);
    std::thread::sleep(Duration::from_millis(50));
    let seen = cores.lock().unwrap().clone();
    assert!(!seen.is_empty());
    assert!(seen.iter().all(|&c| c == 1), "a handler ran on another core: {seen:?}");
}

/// GetNum: events counted per core, summed by a gather.
struct Counter {
    count: Cell<u64>,
    core: CoreId,
}

static FAULTS: AtomicUsize = AtomicUsize::new(0);

struct CounterRoot {
    created_on: Mutex<Vec<CoreId>>,
}

impl Ebb for Counter {
    type Root = CounterRoot;
    fn create_rep(root: &Arc<CounterRoot>, core: CoreId) -> Counter {
        FAULTS.fetch_add(1, Ordering::SeqCst);
        root.created_on.lock().unwrap().push(core);
        assert_eq!(core, sprout_runtime::current_core(), "a representative was built off its core");
        Counter { count: Cell::new(0), core }
    }
}

#[test]
fn ebb_reps_are_built_once_per_core_on_first_use_isolated_and_gathered() {
    let rt = runtime(3);
    let counter = EbbRef::<Counter>::create(CounterRoot { created_on: Mutex::new(Vec::new()) });
    let before = FAULTS.load(Ordering::SeqCst);
    assert!(counter.root().created_on.lock().unwrap().is_empty(), "a representative was built before any use");

    // Cores 0 and 2 use the counter (core 1 never does): 100 and 7 increments.
    let (tx, rx) = mpsc::channel();
    for (core, n) in [(0usize, 100u64), (2, 7)] {
        let tx = tx.clone();
        rt.spawn_on(core, move || {
            for _ in 0..n {
                counter.with(|c| c.count.set(c.count.get() + 1));
            }
            // Each core sees only its own count, and its own representative.
            tx.send(counter.with(|c| (c.core, c.count.get()))).unwrap();
        });
    }
    let mut seen = vec![recv(&rx), recv(&rx)];
    seen.sort();
    assert_eq!(seen, vec![(0, 100), (2, 7)]);
    assert_eq!(FAULTS.load(Ordering::SeqCst) - before, 2, "one fault per core that used the Ebb");
    assert_eq!(counter.rep_cores(), vec![0, 2]);

    // A gather from core 1 visits exactly the two representatives and sums them, without
    // building one on core 1.
    let (tx, rx) = mpsc::channel();
    rt.spawn_on(1, move || {
        counter.gather(
            |c| (sprout_runtime::current_core(), c.count.get()),
            move |results| tx.send((sprout_runtime::current_core(), results)).unwrap(),
        );
    });
    let (home, results) = recv(&rx);
    assert_eq!(home, 1, "the gather's callback runs on the core that asked");
    assert_eq!(results, vec![(0, (0, 100)), (2, (2, 7))], "each representative is visited on its own core");
    assert_eq!(counter.rep_cores(), vec![0, 2]);

    // Using it on core 1 faults once more; using it again does not.
    let (tx, rx) = mpsc::channel();
    rt.spawn_on(1, move || {
        counter.with(|c| c.count.set(1));
        counter.with(|c| c.count.set(c.count.get() + 1));
        tx.send(()).unwrap();
    });
    recv(&rx);
    assert_eq!(FAULTS.load(Ordering::SeqCst) - before, 3);
    let mut created = counter.root().created_on.lock().unwrap().clone();
    created.sort();
    assert_eq!(created, vec![0, 1, 2]);
    let (tx, rx) = mpsc::channel();
    rt.spawn_on(0, move || counter.gather(|c| c.count.get(), move |r| tx.send(r.iter().map(|(_, n)| n).sum::<u64>()).unwrap()));
    assert_eq!(recv(&rx), 109);
}

#[test]
fn gather_with_no_representatives_still_answers() {
    let rt = runtime(2);
    let counter = EbbRef::<Counter>::create(CounterRoot { created_on: Mutex::new(Vec::new()) });
    let (tx, rx) = mpsc::channel();
    rt.spawn_on(0, move || counter.gather(|c| c.count.get(), move |r| tx.send(r.len()).unwrap()));
    assert_eq!(recv(&rx), 0);
    assert!(counter.rep_cores().is_empty());
}

#[test]
fn events_dispatched_counts_per_core() {
    let rt = runtime(2);
    let (tx, rx) = mpsc::channel();
    rt.spawn_on(0, move || {
        let before = sprout_runtime::events_dispatched();
        for _ in 0..10 {
            sprout_runtime::spawn(|| {});
        }
        sprout_runtime::spawn(move || tx.send(sprout_runtime::events_dispatched() - before).unwrap());
    });
    // The ten empty events and the reporting one itself.
    assert_eq!(recv(&rx), 11);
}

#[test]
fn stop_ends_every_core() {
    let rt = runtime(2);
    rt.spawn_on(1, sprout_runtime::stop);
    let start = Instant::now();
    rt.join();
    assert!(start.elapsed() < Duration::from_secs(5));
}

#[test]
#[should_panic(expected = "not on a sprout-runtime core")]
fn runtime_functions_off_a_core_panic_clearly() {
    sprout_runtime::spawn(|| {});
}
