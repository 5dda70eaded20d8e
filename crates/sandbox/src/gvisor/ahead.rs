//! Containers created ahead (`runsc create`, off the request's path) for a template's pods
//! to be restored into. A lambda's network namespace is only known when its first pod is
//! claimed, and runsc fixes a sandbox's namespace at create; so each container is created in
//! a network namespace of its own, and the lambda's link is lent to it at claim
//! ([`crate::network::LambdaNetwork::lend_link`]) and taken back when the pod stops. Its
//! /handler is an empty directory of its bundle made a shared mount point, so that the
//! lambda's code bound onto it at claim reaches runsc's gofer (whose mounts are its slaves).

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;

use nix::mount::{mount, MsFlags};

use super::bundle::{Bundle, Contents};
use super::runsc::Runsc;
use super::settings::PodSettings;
use super::template::Recipe;
use crate::error::{Doing, PlatformError};
use crate::stage::Stage;

/// A created container, waiting for a pod.
pub(crate) struct Created {
    pub id: u64,
    pub bundle: Bundle,
    /// Its network namespace.
    pub netns: OwnedFd,
    pub networked: bool,
}

impl Created {
    /// Create the container of pod `id` for `recipe`'s template.
    pub async fn make(id: u64, runsc: &Runsc, settings: &PodSettings, stage: &Stage, recipe: &Recipe) -> Result<Created, PlatformError> {
        let netns = tokio::task::spawn_blocking(new_netns).await.map_err(std::io::Error::other).and_then(|r| r);
        let netns = netns.doing("making a network namespace for a pod created ahead")?;
        let contents = Contents { handler: None, env: &[], network: Some(netns.as_raw_fd()), pids: recipe.pids };
        let bundle = Bundle::write(settings, stage, &format!("pod-{id}"), contents).await?;
        let handler = handler_dir(&bundle);
        let shared = mount(Some(&handler), &handler, None::<&str>, MsFlags::MS_BIND, None::<&str>)
            .and_then(|()| mount(None::<&str>, &handler, None::<&str>, MsFlags::MS_SHARED, None::<&str>));
        let created = Created { id, bundle, netns, networked: recipe.networked };
        if let Err(e) = shared {
            created.discard(runsc).await;
            return Err(PlatformError::Path { doing: "making a shared mount point of".into(), path: handler, error: e.into() });
        }
        if let Err(e) = runsc.create(&created.bundle.container, &created.bundle.dir, created.networked, None).await {
            created.discard(runsc).await;
            return Err(e);
        }
        runsc.join_worker_cpuset(&created.bundle.cgroup);
        Ok(created)
    }

    /// Delete the container and its bundle (its mounts first).
    pub async fn discard(self, runsc: &Runsc) {
        runsc.delete(&self.bundle.container).await;
        remove_bundle(&self.bundle.dir).await;
    }
}

/// Where a created container's /handler is bound from.
pub(crate) fn handler_dir(bundle: &Bundle) -> PathBuf {
    bundle.dir.join("handler")
}

/// Unmount what is mounted in a pod's bundle, then remove it.
pub(crate) async fn remove_bundle(dir: &std::path::Path) {
    if let Err(e) = crate::mounts::detach_all_under(dir) {
        tracing::warn!("unmounting in {}: {e}", dir.display());
    }
    crate::scratch::remove_dir(dir).await;
}

/// A new network namespace (only loopback, down), held by a descriptor: made on a thread of
/// its own, which leaves it when it ends.
fn new_netns() -> std::io::Result<OwnedFd> {
    std::thread::spawn(|| {
        // SAFETY: unshare affects only this thread, which ends right after.
        if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(OwnedFd::from(std::fs::File::open("/proc/thread-self/ns/net")?))
    })
    .join()
    .map_err(|_| std::io::Error::other("the thread making a network namespace panicked"))?
}
