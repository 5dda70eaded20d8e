//! Triggers on Sprout's engine: what runs a lambda besides a request to it. Today Kafka
//! ([`kafka`]): for each trigger in a lambda's `ol.yaml`, a consumer that runs the lambda on
//! every message, at least once, through the engine's one invocation path.

pub mod kafka;

pub use kafka::KafkaTriggers;
