//! The worker's back-ends, one per isolation class it runs ([`crate::isolation`]), behind one
//! [`Backend`]: a sandbox is made by the back-end its spec names (its lambda's class), the
//! default's when it names none; the counters add up, and are also kept per back-end for
//! `/stats` and `/metrics`.

use std::sync::Arc;

use async_trait::async_trait;
use sprout_sandbox::import_cache::ImportCache;
use sprout_sandbox::{Backend, BackendStats, CreateError, PlatformError, Sandbox, SandboxSpec};

pub struct Backends {
    /// The default first.
    all: Vec<Arc<dyn Backend>>,
}

impl Backends {
    /// `default` serves every spec that names no back-end; names must differ.
    pub fn new(default: Arc<dyn Backend>, others: Vec<Arc<dyn Backend>>) -> Backends {
        let mut all = vec![default];
        for other in others {
            assert!(all.iter().all(|b| b.name() != other.name()), "two {} back-ends", other.name());
            all.push(other);
        }
        Backends { all }
    }

    /// Each back-end's name and counters, the default first.
    pub fn each_stats(&self) -> Vec<(&'static str, BackendStats)> {
        self.all.iter().map(|b| (b.name(), b.stats())).collect()
    }

    pub fn names(&self) -> Vec<&'static str> {
        self.all.iter().map(|b| b.name()).collect()
    }

    fn for_spec(&self, spec: &SandboxSpec) -> Option<&Arc<dyn Backend>> {
        match spec.backend {
            None => self.all.first(),
            Some(name) => self.all.iter().find(|b| b.name() == name),
        }
    }
}

#[async_trait]
impl Backend for Backends {
    /// The default's.
    fn name(&self) -> &'static str {
        self.all[0].name()
    }

    async fn create(&self, spec: &SandboxSpec) -> Result<Box<dyn Sandbox>, CreateError> {
        match self.for_spec(spec) {
            Some(backend) => backend.create(spec).await,
            None => Err(CreateError::Platform(PlatformError::Engine {
                engine: "sprout",
                doing: "choose a back-end".into(),
                message: format!("no {:?} back-end runs in this worker", spec.backend.unwrap_or_default()),
            })),
        }
    }

    fn stats(&self) -> BackendStats {
        let mut sum = BackendStats::default();
        for (_, s) in self.each_stats() {
            sum.created += s.created;
            sum.destroyed += s.destroyed;
            sum.create_failures += s.create_failures;
            sum.cgroups_created += s.cgroups_created;
            sum.cgroups_reused += s.cgroups_reused;
            sum.zygote_restarts += s.zygote_restarts;
            sum.spares_let_go += s.spares_let_go;
        }
        sum
    }

    async fn shutdown(&self) {
        for backend in &self.all {
            backend.shutdown().await;
        }
    }

    /// The first back-end's with Zygotes (only the lean `sock` has them).
    fn import_cache(&self) -> Option<Arc<ImportCache>> {
        self.all.iter().find_map(|b| b.import_cache())
    }

    /// The first back-end's with one group for everything it runs (the lean ones).
    fn memory_group(&self) -> Option<(Arc<sprout_sandbox::cgroup::Layout>, String)> {
        self.all.iter().find_map(|b| b.memory_group())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::instances::fake::{plain_spec, FakeBackend};

    fn spec(lambda: &str) -> SandboxSpec {
        plain_spec(lambda, "/nonexistent".into(), sprout_sandbox::Limits { memory_bytes: 64 << 20, pids: 16, cpus: 0.0 })
    }

    #[tokio::test]
    async fn a_spec_is_made_by_the_back_end_it_names_and_counted_there() {
        let (lean, second) = (Arc::new(FakeBackend::named("sock")), Arc::new(FakeBackend::named("gvisor")));
        let backends = Backends::new(lean.clone(), vec![second.clone()]);
        assert_eq!(backends.name(), "sock");
        let mut spec = spec("a");
        backends.create(&spec).await.ok().unwrap();
        spec.backend = Some("gvisor");
        backends.create(&spec).await.ok().unwrap();
        backends.create(&spec).await.ok().unwrap();
        let each: Vec<_> = backends.each_stats().into_iter().map(|(n, s)| (n, s.created)).collect();
        assert_eq!(each, [("sock", 1), ("gvisor", 2)]);
        assert_eq!(backends.stats().created, 3);
        spec.backend = Some("vm");
        let err = backends.create(&spec).await.err().unwrap();
        assert!(err.to_string().contains("no \"vm\" back-end"), "{err}");
    }
}
