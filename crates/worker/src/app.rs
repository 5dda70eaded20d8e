//! The app port (`[app]`): a second HTTP listener that serves one lambda as a web site, the
//! way a web server in front of a WSGI application would.
//!
//! A request whose path starts with one of the static prefixes is answered from that
//! prefix's host directory ([`StaticDir`]; the longest prefix wins). Every other request goes
//! to the lambda by the same path as `/run/<lambda>/...` ([`crate::api::forward`]): the same
//! queueing, limits, metrics and JSON errors, with the method, headers (Host and cookies
//! included), query and body passed on and the reply's status and headers (every Set-Cookie,
//! Location as given) passed back. Only the WSGI paths differ: `SCRIPT_NAME` is "" and
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

use crate::api::{count_errors, fail, forward, Api, Target};
use crate::config::AppSection;
use crate::static_files::StaticDir;

/// The app port, bound, with its directories open; [`AppPort::serve`] runs it.
pub struct AppPort {
    listener: TcpListener,
    site: Site,
}

struct Site {
    lambda: String,
    /// Prefix (`/static/`) and directory, longest prefix first.
    statics: Vec<(String, StaticDir)>,
}

impl AppPort {
    /// Open the static directories and bind the port, when `[app]` asks for one: done before
    /// the worker starts anything, so a mistake stops it at once, naming the key.
    pub async fn bind(section: &AppSection) -> Result<Option<AppPort>> {
        if !section.enabled() {
            return Ok(None);
        }
        let mut statics = Vec::new();
        for (prefix, dir) in &section.statics {
            let opened = StaticDir::open(dir).with_context(|| format!("app.static.{prefix:?} = {:?}", dir.display()))?;
            statics.push((prefix.clone(), opened));
        }
        statics.sort_by_key(|(prefix, _)| std::cmp::Reverse(prefix.len()));
        let listener =
            TcpListener::bind(&section.listen).await.with_context(|| format!("listening on app.listen = {:?}", section.listen))?;
        Ok(Some(AppPort { listener, site: Site { lambda: section.lambda.clone(), statics } }))
    }

    /// Serve until `shutdown` completes, then finish the requests under way.
    pub async fn serve(self, api: Api, shutdown: impl Future<Output = ()> + Send + 'static) -> std::io::Result<()> {
        let router = Router::new()
            .fallback(handle)
            .with_state((api.clone(), Arc::new(self.site)))
            .layer(axum::middleware::map_response_with_state(api, count_errors));
        axum::serve(self.listener, router.into_make_service_with_connect_info::<SocketAddr>()).with_graceful_shutdown(shutdown).await
    }
}

async fn handle(State((api, site)): State<(Api, Arc<Site>)>, ConnectInfo(peer): ConnectInfo<SocketAddr>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let path = parts.uri.path();
    if let Some((prefix, dir)) = site.statics.iter().find(|(prefix, _)| path.starts_with(prefix.as_str())) {
        let response = dir.serve(&parts.method, &parts.headers, &path[prefix.len() - 1..]).await;
        api.metrics.static_request(prefix, response.status().as_u16());
        return response;
    }
    let target = Target { name: site.lambda.clone(), shown: site.lambda.clone(), script_name: String::new(), path: path.to_string() };
    match forward(&api, target, peer, parts.method.clone(), &parts.uri, parts.headers, body).await {
        Ok(response) => response,
        Err(e) => fail(e),
    }
}
