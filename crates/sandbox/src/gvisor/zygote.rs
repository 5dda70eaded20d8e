//! Talking to a new pod's Zygote over its control channel: waiting for its hello and having
//! it import the lambda's packages (or load the code lambdas share), the same for a pod
//! started afresh and for a template.

use std::time::Duration;

use crate::channel::{Channel, CodeOrder, Hello, ZygoteOrder};
use crate::error::{Doing, PlatformError};
use crate::spec::SharedCode;

pub(crate) async fn recv_hello(channel: &mut Channel, timeout: Duration, doing: &str) -> Result<Hello, PlatformError> {
    match tokio::time::timeout(timeout, channel.recv::<Hello>()).await {
        Ok(Ok((hello, _))) => Ok(hello),
        Ok(Err(e)) => Err(e).doing(format!("the pod's Zygote died while it was to {doing}")),
        Err(_) => Err(PlatformError::timed_out("the pod's Zygote", doing.to_string(), timeout)),
    }
}

/// Have a new pod's Zygote import `imports` from `paths` (a package that fails is only
/// logged: the handler's own import will say why), or, for lambdas that share code
/// (`ol.yaml` `preload`), load that code from its /handler: its modules imported and its
/// function called, which fails the pod if it fails.
pub(crate) async fn import_packages(
    control: &mut Channel,
    paths: &[String],
    imports: &[String],
    code: Option<&SharedCode>,
    timeout: Duration,
) -> Result<(), PlatformError> {
    let code_order = code.map(|c| CodeOrder { modules: &c.modules, call: c.call.as_deref() });
    let order = ZygoteOrder { op: "zygote", paths, imports, code: code_order };
    control.send(&order, &[]).await.doing("sending the pod's Zygote its packages")?;
    let imported = recv_hello(control, timeout, "import the lambda's packages").await?;
    if let Some(error) = imported.error {
        let said = format!(
            "{error}: {}{}",
            imported.message.unwrap_or_default(),
            imported.traceback.map(|t| format!("\n{t}")).unwrap_or_default()
        );
        return Err(PlatformError::exited("the pod's Zygote", format!("loading the shared code: {said}")));
    }
    if let Some(failed) = imported.failed.filter(|f| !f.is_empty()) {
        tracing::info!(?failed, "a pod's Zygote could not import every package ahead");
    }
    Ok(())
}
