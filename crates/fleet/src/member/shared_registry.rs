//! A fleet's one registry: every lambda's archive in one PostgreSQL table, which each worker
//! of the fleet writes its uploads and deletions to and follows, applying every change to its
//! own engine's registry (which stays its local copy). A change is seen through
//! LISTEN/NOTIFY at once, and by a poll every `poll` if a notification is lost; so code
//! replaced through any worker reaches every worker within `poll` plus the time to unpack it.
//!
//! Each change takes the next number of one sequence; a worker remembers the last it applied
//! and asks for the ones after it, so a worker that was down catches up when it starts.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use futures_util::StreamExt;
use tokio_postgres::{AsyncMessage, Client, NoTls};

use sprout_engine::{Engine, Origin};

const CHANNEL: &str = "sprout_lambdas";

const SCHEMA: &str = "
CREATE SEQUENCE IF NOT EXISTS sprout_lambda_changes;
CREATE TABLE IF NOT EXISTS sprout_lambdas (
    name text PRIMARY KEY,
    change bigint NOT NULL,
    sha256 text NOT NULL,
    archive bytea,
    updated timestamptz NOT NULL DEFAULT now()
);
ALTER TABLE sprout_lambdas ADD COLUMN IF NOT EXISTS isolation text;";

/// One lambda's latest change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub name: String,
    pub change: i64,
    /// Of the archive; empty when deleted.
    pub sha256: String,
    pub deleted: bool,
    /// The operator's isolation class for it, if one was ever given (an upload naming none
    /// keeps it).
    pub isolation: Option<String>,
}

/// The connection to the fleet's registry.
pub struct SharedRegistry {
    client: Client,
}

impl SharedRegistry {
    /// Connect (a second connection LISTENs for changes: see [`follow`]) and make the table if
    /// this is the first worker of the fleet.
    pub async fn connect(url: &str) -> Result<SharedRegistry> {
        let (mut client, connection) =
            tokio_postgres::connect(url, NoTls).await.with_context(|| format!("connecting to the shared registry {}", redact(url)))?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::warn!("the shared registry's connection ended: {e}");
            }
        });
        // Workers starting together must not race to create the table.
        let tx = client.transaction().await?;
        tx.execute("SELECT pg_advisory_xact_lock(7242017)", &[]).await?;
        tx.batch_execute(SCHEMA).await.context("making the shared registry's table")?;
        tx.commit().await?;
        Ok(SharedRegistry { client })
    }

    /// Record an upload and the operator's isolation class for it; returns its change number.
    pub async fn publish(&self, name: &str, sha256: &str, archive: &[u8], isolation: Option<&str>) -> Result<i64> {
        let row = self
            .client
            .query_one(
                "INSERT INTO sprout_lambdas (name, change, sha256, archive, isolation) VALUES ($1, nextval('sprout_lambda_changes'), $2, $3, $4)
                 ON CONFLICT (name) DO UPDATE SET change = EXCLUDED.change, sha256 = EXCLUDED.sha256, archive = EXCLUDED.archive,
                   isolation = COALESCE(EXCLUDED.isolation, sprout_lambdas.isolation), updated = now()
                 RETURNING change",
                &[&name, &sha256, &archive, &isolation],
            )
            .await
            .context("storing the lambda in the shared registry")?;
        self.notify().await;
        Ok(row.get(0))
    }

    /// Record a deletion.
    pub async fn delete(&self, name: &str) -> Result<()> {
        self.client
            .execute(
                "UPDATE sprout_lambdas SET change = nextval('sprout_lambda_changes'), sha256 = '', archive = NULL, updated = now() WHERE name = $1",
                &[&name],
            )
            .await
            .context("deleting the lambda from the shared registry")?;
        self.notify().await;
        Ok(())
    }

    async fn notify(&self) {
        // A lost notification costs only a poll interval.
        let _ = self.client.execute(&format!("NOTIFY {CHANNEL}"), &[]).await;
    }

    /// Every lambda's change after `after`, oldest first.
    pub async fn changes_since(&self, after: i64) -> Result<Vec<Change>> {
        let rows = self
            .client
            .query(
                "SELECT name, change, sha256, archive IS NULL, isolation FROM sprout_lambdas WHERE change > $1 ORDER BY change",
                &[&after],
            )
            .await?;
        let change =
            |r: &tokio_postgres::Row| Change { name: r.get(0), change: r.get(1), sha256: r.get(2), deleted: r.get(3), isolation: r.get(4) };
        Ok(rows.iter().map(change).collect())
    }

    /// The archive of `name` as of change `change` (None if it changed again since).
    pub async fn archive(&self, name: &str, change: i64) -> Result<Option<Vec<u8>>> {
        let row = self.client.query_opt("SELECT archive FROM sprout_lambdas WHERE name = $1 AND change = $2", &[&name, &change]).await?;
        Ok(row.and_then(|r| r.get::<_, Option<Vec<u8>>>(0)))
    }
}

/// A connection string without its password, for messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => match url[scheme + 3..at].find(':') {
            Some(colon) => format!("{}:***{}", &url[..scheme + 3 + colon], &url[at..]),
            None => url.to_string(),
        },
        _ => url.to_string(),
    }
}

/// Apply every change after `applied` now; returns the last change applied. The worker does
/// this once before it answers /status, so a worker that joins a fleet (or restarts) takes
/// no request for a lambda the fleet has and it has not yet unpacked.
pub async fn catch_up(engine: &Arc<Engine>, shared: &SharedRegistry, applied: i64) -> Result<i64> {
    let mut last = applied;
    for change in shared.changes_since(applied).await? {
        if let Err(e) = apply(engine, shared, &change).await {
            tracing::warn!(lambda = %change.name, "applying the shared registry's change {}: {e:#}", change.change);
        }
        last = last.max(change.change);
    }
    Ok(last)
}

/// Apply the fleet's changes after `applied` to this worker's registry, for as long as the
/// worker runs.
pub async fn follow(engine: Arc<Engine>, shared: Arc<SharedRegistry>, url: String, poll: Duration, mut applied: i64) {
    let wake = Arc::new(tokio::sync::Notify::new());
    tokio::spawn(listen(url, wake.clone()));
    loop {
        match catch_up(&engine, &shared, applied).await {
            Ok(last) => applied = last,
            Err(e) => tracing::warn!("reading the shared registry: {e:#}"),
        }
        let _ = tokio::time::timeout(poll, wake.notified()).await;
    }
}

/// LISTEN on a connection of its own and wake the follower at each notification (reconnecting
/// after a failure; the poll covers the gap).
async fn listen(url: String, wake: Arc<tokio::sync::Notify>) {
    loop {
        if let Ok((client, mut connection)) = tokio_postgres::connect(&url, NoTls).await {
            let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
            let listening = async {
                client.batch_execute(&format!("LISTEN {CHANNEL}")).await?;
                std::future::pending::<Result<(), tokio_postgres::Error>>().await
            };
            let receiving = async {
                while let Some(Ok(message)) = messages.next().await {
                    if let AsyncMessage::Notification(_) = message {
                        wake.notify_one();
                    }
                }
            };
            tokio::select! {
                _ = listening => {}
                _ = receiving => {}
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Bring this worker's copy of one lambda to the change.
async fn apply(engine: &Arc<Engine>, shared: &SharedRegistry, change: &Change) -> Result<()> {
    let local = engine.registry.get(&change.name);
    if change.deleted {
        if local.is_some() {
            engine.delete(&change.name, Origin::Fleet).await;
        }
        return Ok(());
    }
    // The class the operator gave it through any worker; one this worker does not run
    // leaves the lambda as it was here, never served in a weaker class.
    let chosen = match &change.isolation {
        Some(class) => Some(engine.registry.isolation().parse(class).with_context(|| format!("applying {}", change.name))?),
        None => None,
    };
    if local.is_some_and(|l| l.sha256 == change.sha256 && l.isolation == chosen) {
        return Ok(()); // uploaded here, or already applied
    }
    let Some(archive) = shared.archive(&change.name, change.change).await? else {
        return Ok(()); // changed again since: the next change brings it
    };
    let registry = engine.registry.clone();
    let name = change.name.clone();
    let lambda = tokio::task::spawn_blocking(move || registry.upload(&name, &archive, chosen)).await??;
    tracing::info!(lambda = %lambda.name, change = change.change, "lambda updated from the shared registry");
    engine.arrived(&lambda, Origin::Fleet);
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_password_is_kept_out_of_messages() {
        assert_eq!(super::redact("postgresql://sprout:secret@10.0.0.1:5432/reg"), "postgresql://sprout:***@10.0.0.1:5432/reg");
        assert_eq!(super::redact("postgresql://sprout@h/reg"), "postgresql://sprout@h/reg");
        assert_eq!(super::redact("host=/run/postgresql dbname=reg"), "host=/run/postgresql dbname=reg");
    }
}
