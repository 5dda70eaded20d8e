//! Code Zygotes: a package Zygote's child that has also imported a lambda's own modules (and
//! run its `call`) from the lambda's code without its settings files. Many sites run one
//! codebase with different settings; forked from such a Zygote, each site's sandbox shares
//! the imported application with every other instead of importing it again, and pays only
//! for its settings and what its requests write.
//!
//! A code Zygote holds lambda code, so it serves only lambdas whose code (settings aside) and
//! packages are exactly its own: its key is both. It is made in the background, from the
//! first cold start that finds none; until it is ready (or when making it failed, for
//! [`super::state::FAILURE_BACKOFF`]) sandboxes are forked from the package Zygote and load
//! the code themselves, so no request waits for it. It is evicted like any child Zygote.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::state::{code_key, code_label, ImportCache, Node, FAILURE_BACKOFF};
use crate::spec::{Package, SharedCode};

impl ImportCache {
    /// The live code Zygote for `code` over `packages` (whose exact Zygote is `base`), if one
    /// is ready; otherwise none, and one is made in the background unless it is under way or
    /// failed recently.
    pub(super) fn code_source(self: &Arc<Self>, base: &Arc<Node>, packages: &[Package], code: &SharedCode) -> Option<Arc<Node>> {
        let want: BTreeSet<String> = packages.iter().map(|p| p.key.clone()).collect();
        let key = code_key(&want, code);
        let ready = self
            .nodes
            .lock()
            .unwrap()
            .values()
            .find(|n| {
                n.code.as_deref() == Some(key.as_str()) && {
                    let info = n.info.lock().unwrap();
                    info.alive && !info.retired
                }
            })
            .cloned();
        if ready.is_some() {
            return ready;
        }
        let failed = BTreeSet::from([key.clone()]);
        let recently_failed = self.failed_sets.lock().unwrap().get(&failed).is_some_and(|t| t.elapsed() < FAILURE_BACKOFF);
        if recently_failed || !self.code_pending.lock().unwrap().insert(key.clone()) {
            return None;
        }
        let (cache, base, packages, code) = (self.clone(), base.clone(), packages.to_vec(), code.clone());
        tokio::spawn(async move {
            let made = cache.create_child_with(&base, &packages, false, 0, Some(&code)).await;
            cache.code_pending.lock().unwrap().remove(&key);
            if let Some(node) = made {
                tracing::info!(zygote = node.id, code = %code_label(&code), ms = format!("{:.1}", node.start_ms), "code Zygote ready");
            }
        });
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(digest: &str) -> SharedCode {
        SharedCode { digest: digest.into(), dir: "/x".into(), modules: vec!["app".into()], call: None, size_bytes: 1 }
    }

    #[test]
    fn a_code_zygote_is_keyed_by_its_code_and_its_packages() {
        let flask: BTreeSet<String> = ["flask==3.1.3".to_string()].into();
        let both: BTreeSet<String> = ["flask==3.1.3".to_string(), "pillow==13.0.0".to_string()].into();
        assert_eq!(code_key(&flask, &code("abc")), code_key(&flask, &code("abc")));
        assert_ne!(code_key(&flask, &code("abc")), code_key(&flask, &code("abd")));
        assert_ne!(code_key(&flask, &code("abc")), code_key(&both, &code("abc")));
        assert_eq!(code_label(&code("0123456789abcdef")), "code:0123456789ab");
    }
}
