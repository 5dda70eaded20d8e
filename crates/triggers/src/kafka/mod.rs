//! Kafka triggers (`triggers.kafka` in a lambda's `ol.yaml`): for each trigger a consumer in
//! the trigger's group (rdkafka over Debian's librdkafka) that runs the lambda on every
//! message, as OpenLambda does: a POST with the message's value as the body and its metadata
//! in `X-Kafka-Topic`, `X-Kafka-Partition`, `X-Kafka-Offset` and `X-Kafka-Group-Id`.
//!
//! Delivery is at least once: a message's offset is stored for the next commit only after
//! the handler answered 2xx, or after its attempts ran out and it was written to the
//! failed-messages record (`DIR/kafka-failed.jsonl`, one JSON object per message, with the
//! error); a message is never dropped silently. A consumer handles its messages one at a
//! time, in order. Consumers start with the worker and when a lambda with triggers is
//! uploaded; they stop (finishing the message under way, committing, leaving the group) when
//! their lambda is deleted or replaced, and at shutdown. [`delivery`] decides each message's
//! fate.

pub mod delivery;

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::{Offset, TopicPartitionList};
use serde_json::{json, Value};
use sprout_sandbox::channel::Request;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use async_trait::async_trait;
use sprout_engine::KafkaTrigger;
use sprout_engine::Trigger;
use sprout_engine::{Call, Engine, ErrorCode, Lambda, LambdaWatcher, Origin};

use delivery::{Attempt, Delivery, Next, Policy};

/// What the consumers of one lambda counted.
#[derive(Default)]
pub struct Counts {
    pub received: AtomicU64,
    pub succeeded: AtomicU64,
    pub retried: AtomicU64,
    pub failed: AtomicU64,
}

/// The consumers of one version of a lambda.
struct Running {
    version: u64,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    counts: Arc<Counts>,
}

/// Every lambda's Kafka consumers.
pub struct KafkaTriggers {
    failed_log: PathBuf,
    policy: Policy,
    running: Mutex<HashMap<String, Running>>,
    /// Held through a sync or stop: two uploads in a row must not both start consumers.
    changing: tokio::sync::Mutex<()>,
    /// Counts of lambdas whose consumers stopped, kept for /stats and /metrics.
    finished: Mutex<HashMap<String, Arc<Counts>>>,
}

impl KafkaTriggers {
    /// Consumers that record failed messages in `failed_log`.
    pub fn new(failed_log: PathBuf, policy: Policy) -> KafkaTriggers {
        KafkaTriggers {
            failed_log,
            policy,
            running: Mutex::new(HashMap::new()),
            changing: tokio::sync::Mutex::new(()),
            finished: Mutex::new(HashMap::new()),
        }
    }

    /// Make `name`'s consumers match the registry: none when it is gone or has no triggers;
    /// those of its current version otherwise (a replaced version's are stopped first).
    pub async fn sync(&self, engine: &Arc<Engine>, name: &str) {
        let _changing = self.changing.lock().await;
        let lambda = engine.registry.get(name);
        let current = self.running.lock().unwrap().get(name).map(|r| r.version);
        if current.is_some() && current == lambda.as_ref().map(|l| l.version) {
            return;
        }
        self.stop_consumers(name).await;
        let Some(lambda) = lambda.filter(|l| !l.config.kafka.is_empty()) else { return };
        let (stop, stopped) = watch::channel(false);
        let counts = self.finished.lock().unwrap().remove(name).unwrap_or_default();
        let tasks = (lambda.config.kafka.iter().cloned())
            .map(|trigger| {
                let consumer = TriggerConsumer {
                    engine: engine.clone(),
                    lambda: lambda.clone(),
                    trigger,
                    policy: self.policy,
                    counts: counts.clone(),
                    failed_log: self.failed_log.clone(),
                };
                tokio::spawn(consumer.run(stopped.clone()))
            })
            .collect();
        tracing::info!(lambda = name, version = lambda.version, triggers = lambda.config.kafka.len(), "Kafka consumers started");
        self.running.lock().unwrap().insert(name.to_string(), Running { version: lambda.version, stop, tasks, counts });
    }

    /// Start the consumers of every lambda in the registry (at start-up).
    pub async fn sync_all(&self, engine: &Arc<Engine>) {
        for lambda in engine.registry.list() {
            self.sync(engine, &lambda.name).await;
        }
    }

    /// Stop `name`'s consumers and wait for them: each finishes its message, commits and
    /// leaves its group.
    pub async fn stop(&self, name: &str) {
        let _changing = self.changing.lock().await;
        self.stop_consumers(name).await;
    }

    async fn stop_consumers(&self, name: &str) {
        let Some(running) = self.running.lock().unwrap().remove(name) else { return };
        let _ = running.stop.send(true);
        for task in running.tasks {
            let _ = task.await;
        }
        self.finished.lock().unwrap().insert(name.to_string(), running.counts);
        tracing::info!(lambda = name, version = running.version, "Kafka consumers stopped");
    }

    /// Stop every consumer (at shutdown).
    pub async fn stop_all(&self) {
        let names: Vec<String> = self.running.lock().unwrap().keys().cloned().collect();
        for name in names {
            self.stop(&name).await;
        }
    }

    /// Per lambda: its consumers (running or not) and what they counted.
    pub fn stats(&self) -> Value {
        let mut out = serde_json::Map::new();
        let running = self.running.lock().unwrap();
        let finished = self.finished.lock().unwrap();
        let all = running.iter().map(|(n, r)| (n, &r.counts, true)).chain(finished.iter().map(|(n, c)| (n, c, false)));
        for (name, c, consuming) in all {
            out.insert(
                name.clone(),
                json!({
                    "consuming": consuming,
                    "received": c.received.load(Ordering::Relaxed),
                    "succeeded": c.succeeded.load(Ordering::Relaxed),
                    "retried": c.retried.load(Ordering::Relaxed),
                    "failed": c.failed.load(Ordering::Relaxed),
                }),
            );
        }
        Value::Object(out)
    }
}

/// A lambda's consumers follow its versions: started for a new one with triggers (the
/// replaced version's stop after their message under way), stopped when it is deleted.
#[async_trait]
impl LambdaWatcher for KafkaTriggers {
    fn arrived(self: Arc<Self>, engine: &Arc<Engine>, lambda: &Arc<Lambda>, _origin: Origin) {
        let (engine, name) = (engine.clone(), lambda.name.clone());
        tokio::spawn(async move { self.sync(&engine, &name).await });
    }

    async fn removed(&self, _engine: &Arc<Engine>, name: &str, _origin: Origin) {
        self.stop(name).await;
    }
}

/// One trigger's consumer.
struct TriggerConsumer {
    engine: Arc<Engine>,
    lambda: Arc<Lambda>,
    trigger: KafkaTrigger,
    policy: Policy,
    counts: Arc<Counts>,
    failed_log: PathBuf,
}

impl TriggerConsumer {
    async fn run(self, mut stopped: watch::Receiver<bool>) {
        let name = self.lambda.name.clone();
        let consumer: StreamConsumer = match ClientConfig::new()
            .set("bootstrap.servers", self.trigger.bootstrap_servers.join(","))
            .set("group.id", &self.trigger.group_id)
            .set("client.id", format!("sprout-{name}"))
            .set("auto.offset.reset", self.trigger.auto_offset_reset.as_str())
            .set("enable.auto.commit", "true")
            .set("enable.auto.offset.store", "false")
            .set("auto.commit.interval.ms", "1000")
            .set("session.timeout.ms", "10000")
            .create()
        {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(lambda = %name, "cannot create a Kafka consumer: {e}");
                return;
            }
        };
        let topics: Vec<&str> = self.trigger.topics.iter().map(String::as_str).collect();
        if let Err(e) = consumer.subscribe(&topics) {
            tracing::error!(lambda = %name, ?topics, "cannot subscribe: {e}");
            return;
        }
        loop {
            let message = tokio::select! {
                _ = stopped.changed() => break,
                received = consumer.recv() => match received {
                    Ok(m) => m.detach(),
                    Err(e) => {
                        // The broker is away or a partition moved: librdkafka reconnects.
                        tracing::warn!(lambda = %name, "Kafka: {e}");
                        tokio::time::sleep(Duration::from_millis(500)).await;
                        continue;
                    }
                },
            };
            self.counts.received.fetch_add(1, Ordering::Relaxed);
            if !self.deliver(&message, &stopped).await {
                break; // stopping: the message stays uncommitted, for the group's next owner
            }
            let mut handled = TopicPartitionList::new();
            let next = Offset::Offset(message.offset() + 1);
            if let Err(e) =
                handled.add_partition_offset(message.topic(), message.partition(), next).and_then(|()| consumer.store_offsets(&handled))
            {
                tracing::warn!(lambda = %name, "storing offset {}: {e}", message.offset());
            }
        }
        if let Err(e) = consumer.commit_consumer_state(CommitMode::Sync) {
            tracing::debug!(lambda = %name, "final commit: {e}"); // nothing stored since the last one
        }
        consumer.unsubscribe();
    }

    /// Run the lambda on `message` until the policy says it is handled (true) or the consumer
    /// is stopping (false).
    async fn deliver(&self, message: &OwnedMessage, stopped: &watch::Receiver<bool>) -> bool {
        let mut delivery = Delivery::new(self.policy);
        loop {
            let attempt = if *stopped.borrow() { Attempt::Stopping } else { self.attempt(message).await };
            match delivery.after(attempt) {
                Next::Commit => {
                    self.counts.succeeded.fetch_add(1, Ordering::Relaxed);
                    return true;
                }
                Next::Leave => return false,
                Next::RetryAfter(wait) => {
                    self.counts.retried.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(wait).await;
                }
                Next::RecordFailed { attempts, error } => {
                    self.counts.failed.fetch_add(1, Ordering::Relaxed);
                    self.record_failed(message, attempts, &error);
                    return true;
                }
            }
        }
    }

    /// One run of the lambda on the message.
    async fn attempt(&self, message: &OwnedMessage) -> Attempt {
        let name = &self.lambda.name;
        let request = Request {
            method: "POST".into(),
            script_name: format!("/run/{name}"),
            path: "/".into(),
            query: String::new(),
            headers: vec![
                ("Content-Type".into(), "application/json".into()),
                ("X-Kafka-Topic".into(), message.topic().to_string()),
                ("X-Kafka-Partition".into(), message.partition().to_string()),
                ("X-Kafka-Offset".into(), message.offset().to_string()),
                ("X-Kafka-Group-Id".into(), self.trigger.group_id.clone()),
            ],
            protocol: "HTTP/1.1".into(),
            remote_addr: String::new(),
            depth: 0,
            request_id: String::new(), // the invoker's
            batch: false,
        };
        let body = message.payload().unwrap_or_default();
        let invoker = &self.engine.invoker;
        let request_id = invoker.new_id();
        let call = Call {
            lambda: self.lambda.clone(),
            request,
            body,
            request_id: request_id.clone(),
            trigger: Trigger::Kafka,
            limit: invoker.timeout(),
            depth: 0,
        };
        match invoker.invoke(call).await {
            Ok(invocation) => {
                let reply = invocation.reply;
                if let Some(code) = reply.error {
                    return Attempt::Failed(format!("{code}: {} (request {request_id})", reply.message.unwrap_or_default()));
                }
                match reply.status.unwrap_or(200) {
                    200..=299 => Attempt::Succeeded,
                    status => Attempt::Failed(format!("the handler answered {status} (request {request_id})")),
                }
            }
            Err(e) if e.code == ErrorCode::ShuttingDown => Attempt::Stopping,
            Err(e) => Attempt::Failed(format!("{}: {} (request {request_id})", e.code, e.message())),
        }
    }

    /// Append the message to the failed-messages record.
    fn record_failed(&self, message: &OwnedMessage, attempts: u32, error: &str) {
        let value = message.payload().unwrap_or_default();
        let mut record = json!({
            "at": std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
            "lambda": self.lambda.name, "version": self.lambda.version,
            "topic": message.topic(), "partition": message.partition(), "offset": message.offset(),
            "group_id": self.trigger.group_id, "attempts": attempts, "error": error,
            "key": message.key().map(|k| String::from_utf8_lossy(k).into_owned()),
        });
        match std::str::from_utf8(value) {
            Ok(text) => record["value"] = json!(text),
            Err(_) => record["value_hex"] = json!(hex::encode(value)),
        }
        tracing::warn!(lambda = %self.lambda.name, topic = message.topic(), offset = message.offset(), attempts, "Kafka message failed: {error}");
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.failed_log)
            .and_then(|mut f| f.write_all(format!("{record}\n").as_bytes()));
        if let Err(e) = written {
            tracing::error!("writing {}: {e}; the failed message was {record}", self.failed_log.display());
        }
    }
}
