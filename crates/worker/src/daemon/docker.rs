//! The docker baseline as the worker hands it to the engine ([`MakeBackend`]): its settings
//! from the configuration, and the check that the Docker Engine answers and has the base image.

use std::sync::Arc;

use anyhow::Result;
use async_trait::async_trait;
use sprout_docker::{DockerBackend, DockerConfig};
use sprout_engine::config::EngineConfig;
use sprout_engine::MakeBackend;
use sprout_sandbox::stage::Stage;
use sprout_sandbox::Backend;

/// Makes the docker back-end for the engine.
pub struct Docker;

#[async_trait]
impl MakeBackend for Docker {
    async fn make(&self, config: &EngineConfig, worker_name: &str, stage: Arc<Stage>) -> Result<Arc<dyn Backend>> {
        let backend = DockerBackend::new(docker_config(config, worker_name), stage);
        backend.prepare().await?;
        Ok(Arc::new(backend))
    }
}

/// The docker back-end's settings for worker `worker_name` (its containers' label).
pub fn docker_config(config: &EngineConfig, worker_name: &str) -> DockerConfig {
    DockerConfig {
        socket: config.docker.socket.clone(),
        image: config.docker.image.clone(),
        base_image: config.base.path.clone(),
        worker_label: worker_name.to_string(),
        uid: config.sandbox.uid,
        gid: config.sandbox.gid,
        python: config.sandbox.python.clone(),
        start_timeout: config.sandbox.start_timeout(),
        max_response: (config.limits.max_response_mb << 20) as u32,
        cpuset: config.sandbox.cpuset(),
    }
}
