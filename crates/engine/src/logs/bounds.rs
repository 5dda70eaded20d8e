//! The bounds of one lambda's kept output: a ring of its latest entries held in memory up to
//! a size, and a token bucket for the rate its sandboxes may write at. Pure: time is given.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use super::entry::Entry;

/// The latest entries, at most `capacity` bytes of them (by [`Entry::size`]).
pub struct Ring {
    entries: VecDeque<Arc<Entry>>,
    bytes: usize,
    capacity: usize,
}

impl Ring {
    pub fn new(capacity: usize) -> Ring {
        Ring { entries: VecDeque::new(), bytes: 0, capacity }
    }

    /// Keep `entry`, letting the oldest go while over the capacity (the newest always stays).
    pub fn push(&mut self, entry: Arc<Entry>) {
        self.bytes += entry.size();
        self.entries.push_back(entry);
        while self.bytes > self.capacity && self.entries.len() > 1 {
            let gone = self.entries.pop_front().expect("not empty");
            self.bytes -= gone.size();
        }
    }

    /// The `seq` of the oldest entry held.
    pub fn first_seq(&self) -> Option<u64> {
        self.entries.front().map(|e| e.seq)
    }

    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &Arc<Entry>> {
        self.entries.iter()
    }

    #[cfg(test)]
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

/// Bytes a lambda may write: `rate` a second, up to `burst` at once.
pub struct Bucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl Bucket {
    pub fn new(rate: u64, burst: u64, now: Instant) -> Bucket {
        let burst = burst.max(rate).max(1) as f64;
        Bucket { rate: rate as f64, burst, tokens: burst, last: now }
    }

    /// Take `bytes` if the bucket holds them; false (taking nothing) if it does not.
    pub fn take(&mut self, bytes: usize, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        if (bytes as f64) <= self.tokens {
            self.tokens -= bytes as f64;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::entry::Kind;
    use super::*;

    fn entry(seq: u64, message: &str) -> Arc<Entry> {
        let mut e = Entry::now(&Arc::from("l"), 1, Kind::Out, message.to_string());
        e.seq = seq;
        Arc::new(e)
    }

    #[test]
    fn the_ring_keeps_the_latest_within_its_capacity() {
        let one = entry(0, &"x".repeat(100)).size();
        let mut ring = Ring::new(3 * one);
        for seq in 0..10 {
            ring.push(entry(seq, &"x".repeat(100)));
        }
        assert_eq!(ring.iter().map(|e| e.seq).collect::<Vec<_>>(), [7, 8, 9]);
        assert_eq!(ring.first_seq(), Some(7));
        assert!(ring.bytes() <= 3 * one);
        // One entry larger than the whole ring stays until the next comes.
        ring.push(entry(10, &"y".repeat(10 * one)));
        assert_eq!(ring.iter().map(|e| e.seq).collect::<Vec<_>>(), [10]);
        ring.push(entry(11, "z"));
        assert_eq!(ring.first_seq(), Some(11));
    }

    #[test]
    fn the_bucket_allows_a_burst_then_the_rate() {
        let t0 = Instant::now();
        let mut bucket = Bucket::new(1000, 5000, t0);
        assert!(bucket.take(5000, t0));
        assert!(!bucket.take(1, t0));
        assert!(!bucket.take(600, t0 + Duration::from_millis(500)));
        assert!(bucket.take(500, t0 + Duration::from_millis(500)));
        // Idle for long: the bucket refills to its burst, no further.
        assert!(bucket.take(5000, t0 + Duration::from_secs(60)));
        assert!(!bucket.take(1, t0 + Duration::from_secs(60)));
        // A refused take takes nothing.
        assert!(bucket.take(999, t0 + Duration::from_secs(61)));
    }
}
