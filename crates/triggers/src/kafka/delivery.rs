//! What to do with one Kafka message after each attempt to deliver it: a pure state machine,
//! so the policy (retry with backoff, then record it as failed, and only then move past it)
//! is tested without a broker.

use std::time::Duration;

/// How an attempt to run the lambda on a message ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    /// The handler answered with a 2xx status.
    Succeeded,
    /// It failed: an error reply, a non-2xx status, a crash, a timeout. The text says how.
    Failed(String),
    /// The worker is stopping the consumer: leave the message for the group's next owner.
    Stopping,
}

/// The decision after an attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Store the message's offset for the next commit: it is handled.
    Commit,
    /// Run it again after this long.
    RetryAfter(Duration),
    /// Give up: write it to the failed-messages record, then store its offset.
    RecordFailed { attempts: u32, error: String },
    /// Neither commit nor retry: at-least-once delivery redelivers it later.
    Leave,
}

/// The retry policy of a consumer.
#[derive(Debug, Clone, Copy)]
pub struct Policy {
    /// Attempts in all, the first included.
    pub max_attempts: u32,
    /// Wait before the second attempt; doubled before each next one.
    pub first_backoff: Duration,
}

impl Default for Policy {
    fn default() -> Policy {
        Policy { max_attempts: 3, first_backoff: Duration::from_millis(200) }
    }
}

/// One message's deliveries so far.
#[derive(Debug)]
pub struct Delivery {
    policy: Policy,
    attempts: u32,
}

impl Delivery {
    pub fn new(policy: Policy) -> Delivery {
        Delivery { policy, attempts: 0 }
    }

    #[cfg(test)]
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Record an attempt's end and decide what follows.
    pub fn after(&mut self, attempt: Attempt) -> Next {
        match attempt {
            Attempt::Stopping => Next::Leave,
            Attempt::Succeeded => {
                self.attempts += 1;
                Next::Commit
            }
            Attempt::Failed(error) => {
                self.attempts += 1;
                if self.attempts >= self.policy.max_attempts.max(1) {
                    Next::RecordFailed { attempts: self.attempts, error }
                } else {
                    Next::RetryAfter(self.policy.first_backoff * 2u32.pow(self.attempts - 1))
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> Policy {
        Policy { max_attempts: 3, first_backoff: Duration::from_millis(100) }
    }

    #[test]
    fn a_success_is_committed_at_once() {
        let mut d = Delivery::new(policy());
        assert_eq!(d.after(Attempt::Succeeded), Next::Commit);
        assert_eq!(d.attempts(), 1);
    }

    #[test]
    fn failures_are_retried_with_doubling_backoff_then_recorded_never_dropped() {
        let mut d = Delivery::new(policy());
        assert_eq!(d.after(Attempt::Failed("500".into())), Next::RetryAfter(Duration::from_millis(100)));
        assert_eq!(d.after(Attempt::Failed("500".into())), Next::RetryAfter(Duration::from_millis(200)));
        assert_eq!(d.after(Attempt::Failed("timeout".into())), Next::RecordFailed { attempts: 3, error: "timeout".into() });
    }

    #[test]
    fn a_retry_that_succeeds_is_committed() {
        let mut d = Delivery::new(policy());
        d.after(Attempt::Failed("crash".into()));
        assert_eq!(d.after(Attempt::Succeeded), Next::Commit);
        assert_eq!(d.attempts(), 2);
    }

    #[test]
    fn a_consumer_stopping_mid_delivery_leaves_the_message_uncommitted() {
        let mut d = Delivery::new(policy());
        d.after(Attempt::Failed("crash".into()));
        assert_eq!(d.after(Attempt::Stopping), Next::Leave);
    }

    #[test]
    fn one_attempt_policies_record_the_first_failure() {
        let mut d = Delivery::new(Policy { max_attempts: 0, first_backoff: Duration::ZERO });
        assert!(matches!(d.after(Attempt::Failed("x".into())), Next::RecordFailed { attempts: 1, .. }));
    }
}
