//! What the worker answers a `/map` request: one outcome per item (a result or an error
//! object), and the answers put back in the items' order.

use std::collections::BTreeMap;

use anyhow::{anyhow, Result};
use serde_json::Value;

/// One item's outcome, as the line printed for it.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The result's JSON.
    Ok(String),
    /// The error object's JSON.
    Failed(String),
}

impl Outcome {
    pub fn line(&self) -> &str {
        match self {
            Outcome::Ok(s) | Outcome::Failed(s) => s,
        }
    }
}

/// A `/map` reply's outcomes, which must be one for each of the `expected` items sent.
pub fn outcomes(reply: &str, expected: usize) -> Result<Vec<Outcome>> {
    let values: Vec<Value> = serde_json::from_str(reply).map_err(|e| anyhow!("the worker's reply is not a JSON array of outcomes: {e}"))?;
    if values.len() != expected {
        return Err(anyhow!("the worker answered {} outcomes for {expected} items", values.len()));
    }
    values
        .into_iter()
        .enumerate()
        .map(|(i, v)| match v {
            Value::Object(mut o) if o.contains_key("result") => Ok(Outcome::Ok(o.remove("result").unwrap_or(Value::Null).to_string())),
            Value::Object(o) if o.contains_key("error") => Ok(Outcome::Failed(Value::Object(o).to_string())),
            other => Err(anyhow!("the worker's outcome {i} is neither a result nor an error: {}", truncate(&other.to_string(), 200))),
        })
        .collect()
}

fn truncate(s: &str, n: usize) -> String {
    match s.char_indices().nth(n) {
        Some((at, _)) => format!("{}...", &s[..at]),
        None => s.to_string(),
    }
}

/// Puts the requests' answers back in order: what [`Reorder::push`] returns is every answer
/// whose turn has come, in order.
#[derive(Debug)]
pub struct Reorder<T> {
    next: usize,
    waiting: BTreeMap<usize, T>,
}

impl<T> Default for Reorder<T> {
    fn default() -> Self {
        Reorder { next: 0, waiting: BTreeMap::new() }
    }
}

impl<T> Reorder<T> {
    pub fn push(&mut self, index: usize, value: T) -> Vec<T> {
        self.waiting.insert(index, value);
        let mut ready = Vec::new();
        while let Some(v) = self.waiting.remove(&self.next) {
            ready.push(v);
            self.next += 1;
        }
        ready
    }

    /// Answers held back for one that has not come.
    #[cfg(test)]
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }
}
