//! The app port (`[app]`): a second HTTP listener that serves lambdas as web sites, the way a
//! web server in front of WSGI applications would, one site per host name ([`Sites`]: the
//! request's `Host` chooses the site; a host without one goes to `[app] lambda`, or gets 404
//! `site_not_found`).
//!
//! A request whose path starts with one of its site's static prefixes is answered from that
//! prefix's host directory ([`StaticDir`]; the longest prefix wins). Every other request goes
//! to the lambda by the same path as `/run/<lambda>/...` ([`crate::run::forward`]): the same
//! queueing, limits, metrics and JSON errors, with the method, headers (Host and cookies
//! included), query and body passed on and the reply's status and headers (every Set-Cookie,
//! Location as given) passed back, with its request id (`X-Sprout-Request-Id`). Only the WSGI paths differ: `SCRIPT_NAME` is "" and
//! `PATH_INFO` the whole path, so the app makes the links it would make behind nginx.
//! Connections are kept alive (HTTP/1.1).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context, Result};
use axum::extract::{ConnectInfo, Request, State};
use axum::response::Response;
use axum::Router;
use tokio::net::TcpListener;

use sprout_engine::ErrorCode;
use sprout_engine::Trigger;

use crate::app_config::AppSection;
use crate::http::{count_errors, fail, tag_request, ApiError, RequestId};
use crate::run::{forward, Target};
use crate::state::{Api, AppSites};

/// The app port, bound, with its sites' directories open; [`AppPort::serve`] runs it.
pub struct AppPort {
    listener: TcpListener,
    sites: Arc<AppSites>,
}

impl AppPort {
    /// Open the sites and bind the port, when `[app]` asks for one: done before the worker
    /// starts anything, so a mistake stops it at once, naming the key. The sites the admin
    /// API added before are read from `saved`.
    pub async fn bind(section: &AppSection, saved: std::path::PathBuf) -> Result<Option<AppPort>> {
        if !section.enabled() {
            return Ok(None);
        }
        let sites = AppSites::new(&section.sites, section.default_site(), Some(saved)).map_err(anyhow::Error::msg)?;
        let listener =
            TcpListener::bind(&section.listen).await.with_context(|| format!("listening on app.listen = {:?}", section.listen))?;
        Ok(Some(AppPort { listener, sites: Arc::new(sites) }))
    }

    /// The sites, which the admin API changes.
    pub fn sites(&self) -> Arc<AppSites> {
        self.sites.clone()
    }

    /// Serve until `shutdown` completes, then finish the requests under way.
    pub async fn serve(self, api: Api, shutdown: impl Future<Output = ()> + Send + 'static) -> std::io::Result<()> {
        let router = Router::new()
            .fallback(handle)
            .with_state((api.clone(), self.sites))
            .layer(axum::middleware::map_response_with_state(api.engine.metrics.clone(), count_errors))
            .layer(axum::middleware::from_fn_with_state(api.engine.invoker.clone(), tag_request));
        axum::serve(self.listener, router.into_make_service_with_connect_info::<SocketAddr>()).with_graceful_shutdown(shutdown).await
    }
}

async fn handle(
    State((api, sites)): State<(Api, Arc<AppSites>)>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    request: Request,
) -> Response {
    let (parts, body) = request.into_parts();
    let id = parts.extensions.get::<RequestId>().map(|r| r.0.clone()).unwrap_or_else(|| api.engine.invoker.new_id());
    let host = parts.headers.get(axum::http::header::HOST).and_then(|h| h.to_str().ok()).or(parts.uri.host());
    let Some(site) = sites.resolve(host) else {
        let shown = host.unwrap_or("");
        return fail(ApiError::new(ErrorCode::SiteNotFound, format!("no site for host {shown:?}")));
    };
    let path = parts.uri.path();
    if let Some((prefix, dir)) = site.statics.iter().find(|(prefix, _)| path.starts_with(prefix.as_str())) {
        let response = dir.serve(&parts.method, &parts.headers, &path[prefix.len() - 1..]).await;
        api.engine.metrics.static_request(prefix, response.status().as_u16());
        return response;
    }
    let lambda = &site.config.lambda;
    let target =
        Target { name: lambda.clone(), shown: lambda.clone(), script_name: String::new(), path: path.to_string(), trigger: Trigger::App };
    match forward(&api, target, id, peer, parts.method.clone(), &parts.uri, parts.headers, body).await {
        Ok(response) => response,
        Err(e) => fail(e),
    }
}
