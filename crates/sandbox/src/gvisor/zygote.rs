//! Talking to a new pod's Zygote over its control channel: waiting for its hello and having
//! it import the lambda's packages, the same for a pod started afresh and for a template.

use std::time::Duration;

use crate::channel::{Channel, Hello, ZygoteOrder};
use crate::error::{Doing, PlatformError};

pub(crate) async fn recv_hello(channel: &mut Channel, timeout: Duration, doing: &str) -> Result<Hello, PlatformError> {
    match tokio::time::timeout(timeout, channel.recv::<Hello>()).await {
        Ok(Ok((hello, _))) => Ok(hello),
        Ok(Err(e)) => Err(e).doing(format!("the pod's Zygote died while it was to {doing}")),
        Err(_) => Err(PlatformError::timed_out("the pod's Zygote", doing.to_string(), timeout)),
    }
}

/// Have a new pod's Zygote import `imports` from `paths` (a package that fails is only
/// logged: the handler's own import will say why).
pub(crate) async fn import_packages(
    control: &mut Channel,
    paths: &[String],
    imports: &[String],
    timeout: Duration,
) -> Result<(), PlatformError> {
    let order = ZygoteOrder { op: "zygote", paths, imports, code: None };
    control.send(&order, &[]).await.doing("sending the pod's Zygote its packages")?;
    let imported = recv_hello(control, timeout, "import the lambda's packages").await?;
    if let Some(failed) = imported.failed.filter(|f| !f.is_empty()) {
        tracing::info!(?failed, "a pod's Zygote could not import every package ahead");
    }
    Ok(())
}
