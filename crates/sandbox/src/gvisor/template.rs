//! Template checkpoints: per package set (and per codebase, for lambdas sharing code), one
//! pod whose Zygote has imported the packages (or loaded the shared code) and
//! forked its spares (held, not yet connected: a host connection cannot be saved), saved
//! once with `runsc checkpoint` under the stage's run directory; a lambda's first pod is then
//! restored from it ([`super::pod::Pod::restore`]) instead of started and importing. The
//! first lambda of a package set starts its pod afresh and has the template made meanwhile.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::background::Background;
use super::bundle::{pods_pids, Bundle, Contents};
use super::runsc::Runsc;
use super::settings::PodSettings;
use super::zygote::{import_packages, recv_hello};
use crate::error::{Doing, PlatformError};
use crate::output::{OutputPipe, TracingSink};
use crate::scratch::remove_dir;
use crate::spec::{SandboxSpec, SharedCode};
use crate::stage::Stage;

/// Spares a template's Zygote forks and holds: the first request of a restored pod binds one
/// at once; each held spare adds ~8 ms to every restore (about what forking one after it
/// costs), so the others are forked after the restore, off the request's path.
const HELD_SPARES: usize = 1;

/// A checkpoint to restore pods of one package set from.
#[derive(Debug)]
pub(crate) struct Template {
    /// The checkpoint's directory.
    pub image: PathBuf,
    /// The spares its Zygote holds.
    pub spares: usize,
    /// Pods that failed to be restored from it, in a row (at three it is given up).
    pub failures: AtomicU64,
    /// How long `runsc checkpoint` took, and the image's size on disk.
    pub checkpoint: Duration,
    pub bytes: u64,
}

/// What a template is made of: the package set of a lambda's pods, and the code it shares
/// with other lambdas (`ol.yaml` `preload`), if any.
#[derive(Clone)]
pub(crate) struct Recipe {
    pub key: String,
    pub paths: Vec<String>,
    pub imports: Vec<String>,
    pub pids: u64,
    pub networked: bool,
    /// The shared code, loaded in the template's Zygote from its /handler (that code without
    /// its settings files): every lambda of the codebase restores with it imported.
    pub code: Option<SharedCode>,
}

impl Recipe {
    /// The recipe of `spec`'s pods: its packages, their paths, the code it shares, and
    /// whether pods are networked (a template is restored with the network flag it was made
    /// with); not the lambda.
    pub fn of(spec: &SandboxSpec) -> Recipe {
        let networked = spec.network.as_ref().is_some_and(|n| n.fd() >= 0);
        let packages: Vec<&str> = spec.packages.iter().map(|p| p.key.as_str()).collect();
        let digest = spec.shared_code.as_ref().map_or("", |c| c.digest.as_str());
        let key = format!("{}\n{}\n{networked}\n{digest}", packages.join(","), spec.paths.join(":"));
        let imports = spec.packages.iter().flat_map(|p| p.modules.iter().cloned()).collect();
        Recipe { key, paths: spec.paths.clone(), imports, pids: pods_pids(spec), networked, code: spec.shared_code.clone() }
    }
}

enum State {
    Making,
    Ready(Arc<Template>),
    /// Making it failed: pods of the set start afresh (the error was logged once).
    Failed,
}

/// A worker's templates, by package set.
#[derive(Default)]
pub(crate) struct Templates {
    states: Mutex<HashMap<String, State>>,
    next: AtomicU64,
}

impl Templates {
    /// The template of `recipe`'s set when it is ready; else None, and true when the caller
    /// is to make it (the first to ask).
    pub fn lookup(&self, recipe: &Recipe) -> (Option<Arc<Template>>, bool) {
        let mut states = self.states.lock().expect("templates lock");
        match states.get(&recipe.key) {
            Some(State::Ready(t)) => (Some(t.clone()), false),
            Some(_) => (None, false),
            None => {
                states.insert(recipe.key.clone(), State::Making);
                (None, true)
            }
        }
    }

    /// The template of `recipe`'s set, if it is ready.
    pub fn lookup_ready(&self, recipe: &Recipe) -> Option<Arc<Template>> {
        match self.states.lock().expect("templates lock").get(&recipe.key) {
            Some(State::Ready(t)) => Some(t.clone()),
            _ => None,
        }
    }

    /// Make `recipe`'s template and keep it (or remember that it failed).
    /// Made after the worker stops, it is removed at once.
    pub async fn make(&self, recipe: Recipe, runsc: &Runsc, settings: &PodSettings, stage: &Stage, background: &Background) {
        let Some(_busy) = background.start() else { return };
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let started = Instant::now();
        let made = make(id, &recipe, runsc, settings, stage).await;
        let name = format!("pod-t{id}");
        runsc.delete(&super::bundle::container(&name)).await;
        remove_dir(&stage.run.join("gvisor").join(&name)).await;
        let state = match made {
            Ok(template) if background.is_closed() => {
                remove_dir(&template.image).await;
                return;
            }
            Ok(template) => {
                tracing::info!(
                    packages = %recipe.key.lines().next().unwrap_or(""), spares = template.spares,
                    checkpoint_ms = template.checkpoint.as_millis() as u64, image_mb = template.bytes >> 20,
                    took_ms = started.elapsed().as_millis() as u64, "gVisor template made"
                );
                State::Ready(Arc::new(template))
            }
            Err(e) if background.is_closed() => {
                tracing::debug!("making a gVisor template while the worker stops: {e}");
                return;
            }
            Err(e) => {
                tracing::warn!(packages = %recipe.key.lines().next().unwrap_or(""), "making a gVisor template: {e}");
                State::Failed
            }
        };
        self.states.lock().expect("templates lock").insert(recipe.key, state);
    }

    /// A pod failed to be restored from `template` (its lambda's link may have been held by
    /// another pod, say); at the third in a row the template is given up.
    pub fn failed(&self, recipe: &Recipe, template: &Template) {
        if template.failures.fetch_add(1, Ordering::Relaxed) >= 2 {
            self.states.lock().expect("templates lock").insert(recipe.key.clone(), State::Failed);
        }
    }
}

/// Start a template pod for `recipe` (its /handler an empty directory, a network namespace
/// of its own), have its Zygote import the packages and become a template, and checkpoint it
/// into `run/gvisor/image-<id>`.
async fn make(id: u64, recipe: &Recipe, runsc: &Runsc, settings: &PodSettings, stage: &Stage) -> Result<Template, PlatformError> {
    let shared = recipe.code.as_ref().map(|c| stage.code_view(&c.dir));
    let contents = Contents { handler: shared.as_deref(), env: &[], network: None, pids: recipe.pids };
    let bundle = Bundle::write(settings, stage, &format!("pod-t{id}"), contents).await?;
    let sink = Arc::new(TracingSink(format!("gvisor-template-{id}")));
    let (_output, log) = OutputPipe::new(id, sink).doing("making the template's log pipe")?;
    runsc.run(&bundle.container, &bundle.dir, recipe.networked, log).await?;
    runsc.join_worker_cpuset(&bundle.cgroup);
    let timeout = settings.cfg.start_timeout;
    let (mut control, _) = bundle.endpoint.accept_next(timeout, settings.cfg.max_response).await?;
    // Nothing else is to connect here: the Zygote, restored, is to reach its new pod's socket.
    let socket = bundle.scratch.join(crate::channel::SOCKET_NAME);
    std::fs::remove_file(&socket).at("removing", &socket)?;
    recv_hello(&mut control, timeout, "start").await?;
    import_packages(&mut control, &recipe.paths, &recipe.imports, recipe.code.as_ref(), timeout).await?;
    let cfg = &settings.cfg;
    let order = json!({"op": "template", "count": HELD_SPARES, "uid": cfg.uid, "gid": cfg.gid, "seccomp": settings.seccomp});
    control.send(&order, &[]).await.doing("making the pod a template")?;
    let (reply, _) = tokio::time::timeout(timeout, control.recv::<Value>())
        .await
        .map_err(|_| PlatformError::timed_out("the template's Zygote", "fork its spares", timeout))?
        .doing("making the pod a template")?;
    let spares = reply["ready"].as_u64().unwrap_or(0) as usize;
    // The Zygote hangs up once it has answered; it must have let go of the connection before
    // the checkpoint.
    let hung_up = tokio::time::timeout(Duration::from_secs(10), control.recv::<Value>()).await;
    if !matches!(hung_up, Ok(Err(_))) {
        return Err(PlatformError::Protocol { process: "the template's Zygote".into(), said: "no hang-up after its spares".into() });
    }
    let image = stage.run.join("gvisor").join(format!("image-{id}"));
    tokio::fs::create_dir_all(&image).await.at("making", &image)?;
    let started = Instant::now();
    runsc.checkpoint(&bundle.container, &bundle.dir, &image, recipe.networked, "checkpoint the template").await?;
    let checkpoint = started.elapsed();
    let bytes = du(&image);
    Ok(Template { image, spares, failures: AtomicU64::new(0), checkpoint, bytes })
}

/// The bytes a directory's files hold on disk.
pub(crate) fn du(dir: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let entries = std::fs::read_dir(dir).into_iter().flatten().flatten();
    entries.filter_map(|e| e.metadata().ok()).map(|m| m.blocks() * 512).sum()
}
