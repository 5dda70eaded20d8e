//! Elastic Building Blocks: partitioned objects named by an `EbbId`, reached on each core
//! through that core's own representative.
//!
//! * The **Ebb allocator** hands out ids, unique in the process.
//! * The **local id map** holds each Ebb's root: the state its representatives share (and the
//!   list of cores where a representative exists: EbbRT's `replist`).
//! * Each core has a **translation table**, indexed by EbbId, caching a pointer to its
//!   representative. A miss is a **fault**: the Ebb's fault handler (`Ebb::create_rep`) builds
//!   the representative from the root, and the table caches it for every later access.
//! * A **gather** visits every representative, each on its own core (an event sent there),
//!   and hands the results to a callback back on the calling core: per-core counters need no
//!   synchronization when counted, and are summed only when someone asks.
//!
//! Representatives never leave their core, so they need not be `Send` or `Sync`: plain
//! `Cell`s and `RefCell`s are enough, because events on a core never preempt each other.

use std::any::Any;
use std::cell::RefCell;
use std::collections::HashMap;
use std::marker::PhantomData;
use std::rc::Rc;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use crate::event::{self, CoreId};

/// The system-wide name of one Ebb instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EbbId(pub u32);

/// A partitioned object: the type of its per-core representative, with the fault handler
/// that builds one.
pub trait Ebb: Sized + 'static {
    /// State shared by all representatives, kept in the local id map.
    type Root: Send + Sync + 'static;

    /// The fault handler: build the representative of `core`, on `core`, at its first access.
    fn create_rep(root: &Arc<Self::Root>, core: CoreId) -> Self;
}

/// One entry of the local id map.
struct RootEntry {
    root: Arc<dyn Any + Send + Sync>,
    /// The cores holding a representative (EbbRT's replist).
    reps: Mutex<Vec<CoreId>>,
}

static NEXT_ID: AtomicU32 = AtomicU32::new(1);

fn id_map() -> &'static RwLock<HashMap<EbbId, Arc<RootEntry>>> {
    static MAP: OnceLock<RwLock<HashMap<EbbId, Arc<RootEntry>>>> = OnceLock::new();
    MAP.get_or_init(Default::default)
}

thread_local! {
    /// This core's translation table: EbbId -> representative.
    static TABLE: RefCell<Vec<Option<Rc<dyn Any>>>> = const { RefCell::new(Vec::new()) };
    /// Gathers started on this core and waiting for replies, by number.
    static GATHERS: RefCell<HashMap<u64, Box<dyn FnOnce()>>> = RefCell::new(HashMap::new());
}

static NEXT_GATHER: AtomicU64 = AtomicU64::new(1);

/// A typed reference to an Ebb: copy it anywhere, on any core; each use reaches the
/// representative of the core it runs on.
pub struct EbbRef<E> {
    id: EbbId,
    _rep: PhantomData<fn() -> E>,
}

impl<E> Clone for EbbRef<E> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<E> Copy for EbbRef<E> {}

impl<E> std::fmt::Debug for EbbRef<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "EbbRef({})", self.id.0)
    }
}

impl<E: Ebb> EbbRef<E> {
    /// Create an Ebb: allocate its id and put its root in the local id map. No representative
    /// exists until a core uses it.
    pub fn create(root: E::Root) -> EbbRef<E> {
        let id = EbbId(NEXT_ID.fetch_add(1, Ordering::Relaxed));
        let entry = RootEntry { root: Arc::new(root), reps: Mutex::new(Vec::new()) };
        id_map().write().unwrap_or_else(|e| e.into_inner()).insert(id, Arc::new(entry));
        EbbRef { id, _rep: PhantomData }
    }

    pub fn id(&self) -> EbbId {
        self.id
    }

    /// The shared root, from the local id map.
    pub fn root(&self) -> Arc<E::Root> {
        let root = self.entry().root.clone();
        root.downcast::<E::Root>().unwrap_or_else(|_| panic!("Ebb {} has a root of another type", self.id.0))
    }

    fn entry(&self) -> Arc<RootEntry> {
        id_map()
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&self.id)
            .cloned()
            .unwrap_or_else(|| panic!("Ebb {} was never created", self.id.0))
    }

    /// Call `f` with this core's representative, building it first if this is the core's
    /// first access. Must run on a runtime core.
    pub fn with<R>(&self, f: impl FnOnce(&E) -> R) -> R {
        let rep = self.rep();
        f(rep.downcast_ref::<E>().expect("translation table holds a representative of another type"))
    }

    /// This core's representative as a shared pointer (to keep it across events on this core).
    pub fn rep_rc(&self) -> Rc<E> {
        self.rep().downcast::<E>().unwrap_or_else(|_| panic!("Ebb {}: representative of another type", self.id.0))
    }

    fn rep(&self) -> Rc<dyn Any> {
        let index = self.id.0 as usize;
        let cached = TABLE.with(|t| t.borrow().get(index).and_then(|r| r.clone()));
        match cached {
            Some(rep) => rep,
            None => self.fault(),
        }
    }

    /// The miss path: build this core's representative and cache it in the table.
    #[cold]
    fn fault(&self) -> Rc<dyn Any> {
        let core = event::with_core(|c| c.id);
        let entry = self.entry();
        let root = entry.root.clone().downcast::<E::Root>().unwrap_or_else(|_| panic!("Ebb {}: root of another type", self.id.0));
        // Built outside any borrow of the table: the fault handler may use other Ebbs.
        let rep: Rc<dyn Any> = Rc::new(E::create_rep(&root, core));
        TABLE.with(|t| {
            let mut table = t.borrow_mut();
            let index = self.id.0 as usize;
            if table.len() <= index {
                table.resize(index + 1, None);
            }
            table[index] = Some(rep.clone());
        });
        entry.reps.lock().unwrap_or_else(|e| e.into_inner()).push(core);
        rep
    }

    /// The cores holding a representative now.
    pub fn rep_cores(&self) -> Vec<CoreId> {
        let mut cores = self.entry().reps.lock().unwrap_or_else(|e| e.into_inner()).clone();
        cores.sort_unstable();
        cores
    }

    /// Visit every representative on its own core with `visit`, then call `done` on this
    /// core with the results, ordered by core. Cores without a representative are not
    /// visited (and none is built there). Must run on a runtime core; `done` runs later, as
    /// an event, even when there is nothing to visit.
    pub fn gather<T: Send + 'static>(
        &self,
        visit: impl Fn(&E) -> T + Send + Sync + 'static,
        done: impl FnOnce(Vec<(CoreId, T)>) + 'static,
    ) {
        let home = event::with_core(|c| c.id);
        let cores = self.rep_cores();
        let gather_id = NEXT_GATHER.fetch_add(1, Ordering::Relaxed);
        let results: Arc<Mutex<Vec<(CoreId, T)>>> = Arc::new(Mutex::new(Vec::with_capacity(cores.len())));
        let finish = {
            let results = results.clone();
            move || {
                let mut results = std::mem::take(&mut *results.lock().unwrap_or_else(|e| e.into_inner()));
                results.sort_by_key(|(core, _)| *core);
                done(results);
            }
        };
        GATHERS.with(|g| g.borrow_mut().insert(gather_id, Box::new(finish)));
        let complete = move || {
            if let Some(finish) = GATHERS.with(|g| g.borrow_mut().remove(&gather_id)) {
                finish();
            }
        };
        if cores.is_empty() {
            event::spawn(complete);
            return;
        }
        let remaining = Arc::new(AtomicUsize::new(cores.len()));
        let visit = Arc::new(visit);
        let this = *self;
        for core in cores {
            let (visit, results, remaining) = (visit.clone(), results.clone(), remaining.clone());
            event::spawn_on(core, move || {
                let value = this.with(|rep| visit(rep));
                results.lock().unwrap_or_else(|e| e.into_inner()).push((core, value));
                if remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
                    event::spawn_on(home, complete);
                }
            });
        }
    }
}
