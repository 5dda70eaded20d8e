//! What a lambda's new sandbox is made with: its packages (resolved and installed once, or
//! afresh with the install cache off), its network namespace and service environment, and
//! the back-end of its isolation class ([`crate::isolation`]). The
//! instance manager asks a [`Prepare`] for a [`SandboxSpec`] before every cold start; the
//! worker's is [`Provisioning`], its tests' a plain spec.

use std::sync::Arc;

use async_trait::async_trait;
use sprout_sandbox::{Limits, SandboxSpec, SharedCode};

use super::outcome::Failure;
use crate::isolation::Isolation;
use crate::networks::LambdaNetworks;
use crate::packages::Packages;
use crate::registry::Lambda;

#[async_trait]
pub trait Prepare: Send + Sync {
    /// The spec of a new sandbox for `lambda` with `limits`.
    async fn spec(&self, lambda: &Lambda, limits: Limits) -> Result<SandboxSpec, Failure>;
}

/// The worker's: packages from the install cache, a network namespace from the pool.
pub struct Provisioning {
    pub packages: Arc<Packages>,
    pub networks: Arc<LambdaNetworks>,
    pub isolation: Arc<Isolation>,
}

#[async_trait]
impl Prepare for Provisioning {
    async fn spec(&self, lambda: &Lambda, limits: Limits) -> Result<SandboxSpec, Failure> {
        let class = (self.isolation.class(&lambda.name, lambda.isolation, lambda.config.isolation))
            .map_err(|e| Failure::Platform(format!("the lambda's isolation class cannot run: {e}")))?;
        let packages = self.packages.for_sandbox(&lambda.parsed_requirements).await.map_err(Failure::Install)?;
        let network = (self.networks.for_lambda(&lambda.name).await)
            .map_err(|e| Failure::Platform(format!("no network namespace for the lambda: {e}")))?;
        Ok(SandboxSpec {
            lambda: lambda.name.clone(),
            code_dir: lambda.dir.clone(),
            limits,
            env: lambda.config.environment.clone().into_iter().chain(self.networks.env_for(&lambda.name)).collect(),
            network,
            packages: packages.packages.clone(),
            paths: packages.paths.clone(),
            attached: Some(packages),
            output: None, // the instance manager's, per sandbox
            backend: Some(class.name()),
            shared_code: shared_code(lambda),
            imports: lambda.imports.clone(),
        })
    }
}

/// What a code Zygote of `lambda`'s shared code loads (ol.yaml's `preload`), when it has one.
fn shared_code(lambda: &Lambda) -> Option<SharedCode> {
    let (preload, copy) = (lambda.config.preload.as_ref()?, lambda.shared_code.as_ref()?);
    Some(SharedCode {
        digest: copy.digest.clone(),
        dir: copy.dir.clone(),
        modules: preload.modules.clone(),
        call: preload.call.clone(),
        size_bytes: copy.size_bytes,
    })
}
