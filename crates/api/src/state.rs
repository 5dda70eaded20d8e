//! What the HTTP edge serves with ([`Api`]): the engine, the features built on it, who may
//! call (the [`Guard`]), and the limits and name it answers with.

use std::sync::Arc;

use axum::http::HeaderValue;
use sprout_engine::Engine;
use sprout_fleet::member::SharedRegistry;
use sprout_offload::{Blobs, LeaseBook};
use sprout_sites::Sites;
use sprout_triggers::KafkaTriggers;

use crate::auth::Guard;
use crate::static_files::StaticDir;

/// The app port's sites, their static directories served by [`StaticDir`].
pub type AppSites = Sites<StaticDir>;

/// The API's state, one handle cloned for each request (one reference count, where cloning
/// its parts would touch each of theirs).
#[derive(Clone)]
pub struct Api(Arc<ApiParts>);

impl Api {
    pub fn new(parts: ApiParts) -> Api {
        Api(Arc::new(parts))
    }
}

impl std::ops::Deref for Api {
    type Target = ApiParts;

    fn deref(&self) -> &ApiParts {
        &self.0
    }
}

/// What the API serves with.
pub struct ApiParts {
    pub engine: Arc<Engine>,
    /// Who may use the API, and the token lambdas must never see.
    pub auth: Arc<Guard>,
    /// Where the control plane's changes are recorded.
    pub audit: Arc<crate::audit::AuditLog>,
    /// What each tenant uses now against its quotas.
    pub usage: Arc<crate::quotas::Usage>,
    /// The user leases: sandboxes held for clients' objects.
    pub leases: Arc<LeaseBook>,
    /// Large items and results of maps, shared with the sandboxes.
    pub blobs: Arc<Blobs>,
    /// Who uploaded each client's blob.
    pub blob_owners: crate::blob_owners::BlobOwners,
    /// The largest upload: an archive, a lease's file, a blob.
    pub max_upload: usize,
    /// The lambdas' Kafka consumers.
    pub kafka: Arc<KafkaTriggers>,
    /// The app port's sites by host (None: no app port).
    pub sites: Option<Arc<AppSites>>,
    /// The fleet's shared registry, when this worker belongs to one.
    pub shared: Option<Arc<SharedRegistry>>,
    /// This worker's name, sent with every invocation's reply (`x-sprout-worker`), so a
    /// client behind a load balancer can tell which worker served it.
    pub worker_name: HeaderValue,
}
