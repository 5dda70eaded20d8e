//! Who uploaded each client's blob, and so who may use it.
//!
//! A blob's name is its capability (the SDK names them with 128 random bits). A blob uploaded
//! with a tenant's key is that tenant's, one uploaded with the operator's token the
//! operator's: another tenant's key reading, replacing or deleting it is answered as a
//! missing blob (404), so names are not disclosed. A blob a sandbox wrote (a map's result) has
//! no owner here: whoever holds its name reads it, as before tenants. Owners live in memory:
//! the blobs themselves go when the worker stops or starts.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;

use crate::auth::Principal;

/// Past this many owners, those of blobs gone (expired or removed) are forgotten.
const PRUNE_PAST: usize = 4096;

/// Each client-uploaded blob's owner: Some(tenant), or None for the operator.
#[derive(Default)]
pub struct BlobOwners(Mutex<HashMap<String, Option<String>>>);

impl BlobOwners {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Option<String>>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `principal` may use blob `name`: the operator any, a tenant its own and those
    /// no client uploaded (a sandbox's, or none yet).
    pub fn may_use(&self, principal: &Principal, name: &str) -> bool {
        match principal {
            Principal::Operator => true,
            Principal::Tenant(grant) => self.lock().get(name).is_none_or(|owner| owner.as_deref() == Some(grant.tenant.as_str())),
        }
    }

    /// Blob `name` was uploaded by `owner` (None: the operator); `dir` is the blob store, to
    /// forget owners of blobs gone once there are many.
    pub fn uploaded(&self, name: &str, owner: Option<&str>, dir: &Path) {
        let mut owners = self.lock();
        owners.insert(name.to_string(), owner.map(String::from));
        if owners.len() > PRUNE_PAST {
            owners.retain(|name, _| dir.join(name).exists());
        }
    }

    /// Blob `name` was deleted.
    pub fn deleted(&self, name: &str) {
        self.lock().remove(name);
    }

    /// The blobs `tenant` uploaded.
    pub fn of(&self, tenant: &str) -> Vec<String> {
        self.lock().iter().filter(|(_, owner)| owner.as_deref() == Some(tenant)).map(|(name, _)| name.clone()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::tenants::Scope;
    use crate::auth::Grant;

    fn tenant(name: &str) -> Principal {
        Principal::Tenant(Grant { tenant: name.into(), key_id: "k".into(), scope: Scope::default() })
    }

    #[test]
    fn a_tenant_uses_its_own_blobs_and_sandboxes_but_no_other_principals() {
        let dir = tempfile::tempdir().unwrap();
        let owners = BlobOwners::default();
        owners.uploaded("mine", Some("a"), dir.path());
        owners.uploaded("theirs", Some("b"), dir.path());
        owners.uploaded("operators", None, dir.path());
        let a = tenant("a");
        assert!(owners.may_use(&a, "mine") && owners.may_use(&a, "from-a-sandbox"));
        assert!(!owners.may_use(&a, "theirs") && !owners.may_use(&a, "operators"));
        assert!(["mine", "theirs", "operators"].iter().all(|n| owners.may_use(&Principal::Operator, n)));
        assert_eq!(owners.of("a"), ["mine"]);
        owners.deleted("theirs");
        assert!(owners.may_use(&a, "theirs"), "gone, it is nobody's: a new upload makes it the uploader's");
    }
}
