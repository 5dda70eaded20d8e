//! Planning a map (`/map/<name>`), a pure state machine: which items each invocation takes,
//! and what becomes of the items of one whose sandbox failed.
//!
//! Items go out in chunks, contiguous runs of them, one chunk one invocation. A chunk's size
//! is fixed (the query's `chunk`) or adapts: it aims at [`TARGET`] per chunk from the time
//! items took so far (a weighted mean of the latest chunks' time per item, in their
//! sandboxes), between 1 and [`MAX_CHUNK`] items, starting at one item while nothing is known
//! yet, and never more than the runners' fair share of what is left, so all of them stay busy
//! to the end (guided self-scheduling).
//!
//! A chunk that ran settles its items with the outcomes it returned, whatever they are (an
//! item's own failure is its outcome). A chunk whose sandbox failed ([`SandboxFailure`]) is
//! split: each of its items runs again alone. An item whose sandbox failed while it ran alone
//! is settled with that failure — unless the sandbox crashed, when it runs again, up to
//! [`CRASH_RETRIES`] times: running out of memory or time alone is the item's own doing, and
//! running it again blindly would do the same.

use std::collections::VecDeque;
use std::ops::Range;
use std::time::Duration;

/// How long an adaptive chunk aims to take in its sandbox.
pub const TARGET: Duration = Duration::from_millis(20);
/// The most items one chunk takes.
pub const MAX_CHUNK: usize = 1024;
/// How many times an item alone is run again after its sandbox crashed.
pub const CRASH_RETRIES: u32 = 2;
/// How much the time per item seen so far weighs against the next chunk's (its weight is one).
const DECAY: f64 = 0.5;

/// How chunks are sized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sizing {
    /// From the time items took so far.
    Adaptive,
    /// This many items a chunk (the last may have fewer).
    Fixed(usize),
}

/// A sandbox's failure during a chunk: how it ended without its outcomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SandboxFailure {
    /// It died mid-chunk.
    Crashed,
    /// The kernel killed it at its memory limit.
    OutOfMemory,
    /// It ran past its time limit.
    Timeout,
}

/// Items to run in one invocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    /// The items' indexes.
    pub items: Range<usize>,
    /// How many times the sandbox of this item, running alone, crashed before.
    crashes: u32,
}

impl Chunk {
    pub fn len(&self) -> usize {
        self.items.len()
    }
}

/// What became of a chunk whose sandbox failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// Its items run again ([`Planner::next`] hands them out, each alone).
    RunAgain,
    /// Its one item's outcome is this failure.
    Failed(SandboxFailure),
}

/// One map's plan: the items not yet handed out, those to run again, and how long items take.
#[derive(Debug)]
pub struct Planner {
    total: usize,
    runners: usize,
    sizing: Sizing,
    /// The first item never handed out.
    fresh: usize,
    /// Items to run again, each alone.
    again: VecDeque<Chunk>,
    settled: usize,
    /// Seconds and items of the chunks that ran, each chunk weighing `DECAY` times less than
    /// the next: their ratio is the time per item.
    seconds: f64,
    weighed_items: f64,
    chunks: u64,
    retries: u64,
}

impl Planner {
    /// A plan for `total` items run by up to `runners` invocations at once.
    pub fn new(total: usize, runners: usize, sizing: Sizing) -> Planner {
        Planner {
            total,
            runners: runners.max(1),
            sizing,
            fresh: 0,
            again: VecDeque::new(),
            settled: 0,
            seconds: 0.0,
            weighed_items: 0.0,
            chunks: 0,
            retries: 0,
        }
    }

    /// The next chunk to run, if any is waiting: items to run again first, then new ones.
    pub fn next(&mut self) -> Option<Chunk> {
        let chunk = match self.again.pop_front() {
            Some(chunk) => chunk,
            None if self.fresh < self.total => {
                let start = self.fresh;
                self.fresh += self.size();
                Chunk { items: start..self.fresh, crashes: 0 }
            }
            None => return None,
        };
        self.chunks += 1;
        Some(chunk)
    }

    /// How many new items the next chunk takes.
    fn size(&self) -> usize {
        let left = self.total - self.fresh;
        let wanted = match self.sizing {
            Sizing::Fixed(n) => return n.clamp(1, left),
            Sizing::Adaptive => match self.per_item() {
                None => 1,
                Some(seconds) if seconds <= 0.0 => MAX_CHUNK,
                Some(seconds) => (TARGET.as_secs_f64() / seconds).round().clamp(1.0, MAX_CHUNK as f64) as usize,
            },
        };
        wanted.min(left.div_ceil(self.runners)).max(1)
    }

    /// Seconds an item takes, from the chunks that ran; None before any did.
    pub fn per_item(&self) -> Option<f64> {
        (self.weighed_items > 0.0).then(|| self.seconds / self.weighed_items)
    }

    /// `chunk` ran in `took` and returned an outcome for each of its items.
    pub fn ran(&mut self, chunk: &Chunk, took: Duration) {
        self.seconds = self.seconds * DECAY + took.as_secs_f64();
        self.weighed_items = self.weighed_items * DECAY + chunk.len() as f64;
        self.settled += chunk.len();
    }

    /// `chunk`'s sandbox failed: its items run again, or its one item is settled with the
    /// failure.
    pub fn failed(&mut self, chunk: Chunk, failure: SandboxFailure) -> Settled {
        if chunk.len() > 1 {
            self.retries += chunk.len() as u64;
            self.again.extend(chunk.items.map(|i| Chunk { items: i..i + 1, crashes: 0 }));
            return Settled::RunAgain;
        }
        if failure == SandboxFailure::Crashed && chunk.crashes < CRASH_RETRIES {
            self.retries += 1;
            self.again.push_back(Chunk { crashes: chunk.crashes + 1, ..chunk });
            return Settled::RunAgain;
        }
        self.settled += chunk.len();
        Settled::Failed(failure)
    }

    /// Whether every item is settled.
    pub fn is_done(&self) -> bool {
        self.settled == self.total
    }

    /// Chunks handed out so far (invocations made).
    pub fn chunks(&self) -> u64 {
        self.chunks
    }

    /// Items run again so far.
    pub fn retries(&self) -> u64 {
        self.retries
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake lambda: how long each item takes, and which items make their sandbox fail
    /// (`fails(item, crashes so far)`); runs a plan to the end with `runners` at once, as the
    /// map's loop does, in simulated time. Returns each item's outcome (`Ok(())` or its
    /// failure), how many times each item ran, and the chunks' sizes in order.
    struct FakeLambda {
        per_item: Vec<Duration>,
        fails: Box<dyn Fn(usize, u32) -> Option<SandboxFailure>>,
    }

    /// A chunk under way in the simulation: when it ends, and the item that failed and how.
    type Running = (Duration, Chunk, Option<(usize, SandboxFailure)>);

    struct Run {
        outcomes: Vec<Option<Result<(), SandboxFailure>>>,
        runs: Vec<u32>,
        sizes: Vec<usize>,
        planner: Planner,
    }

    impl FakeLambda {
        fn uniform(n: usize, per_item: Duration) -> FakeLambda {
            FakeLambda { per_item: vec![per_item; n], fails: Box::new(|_, _| None) }
        }

        fn run(&self, runners: usize, sizing: Sizing) -> Run {
            let n = self.per_item.len();
            let mut planner = Planner::new(n, runners, sizing);
            let mut outcomes = vec![None; n];
            let mut runs = vec![0u32; n];
            let mut crashes = vec![0u32; n];
            let mut sizes = Vec::new();
            let mut running: Vec<Running> = Vec::new();
            let mut now = Duration::ZERO;
            loop {
                while running.len() < runners {
                    let Some(chunk) = planner.next() else { break };
                    sizes.push(chunk.len());
                    let mut took = Duration::ZERO;
                    let mut failure = None;
                    for i in chunk.items.clone() {
                        runs[i] += 1;
                        took += self.per_item[i];
                        if let Some(f) = (self.fails)(i, crashes[i]) {
                            failure = Some((i, f));
                            break;
                        }
                    }
                    running.push((now + took, chunk, failure));
                }
                running.sort_by_key(|(end, ..)| std::cmp::Reverse(*end));
                let Some((end, chunk, failure)) = running.pop() else { break };
                now = end;
                match failure {
                    None => {
                        planner.ran(&chunk, chunk.items.clone().map(|i| self.per_item[i]).sum());
                        for i in chunk.items {
                            assert!(outcomes[i].is_none(), "item {i} settled twice");
                            outcomes[i] = Some(Ok(()));
                        }
                    }
                    Some((culprit, f)) => {
                        let item = chunk.items.start;
                        if f == SandboxFailure::Crashed {
                            crashes[culprit] += 1;
                        }
                        if let Settled::Failed(f) = planner.failed(chunk, f) {
                            assert!(outcomes[item].is_none(), "item {item} settled twice");
                            outcomes[item] = Some(Err(f));
                        }
                    }
                }
            }
            assert!(planner.is_done());
            Run { outcomes, runs, sizes, planner }
        }
    }

    #[test]
    fn every_item_is_handed_out_once_in_order_when_all_goes_well() {
        for (n, runners, sizing) in
            [(500, 4, Sizing::Adaptive), (500, 16, Sizing::Fixed(1)), (7, 3, Sizing::Fixed(3)), (1, 16, Sizing::Adaptive)]
        {
            let run = FakeLambda::uniform(n, Duration::from_micros(50)).run(runners, sizing);
            assert!(run.outcomes.iter().all(|o| *o == Some(Ok(()))));
            assert!(run.runs.iter().all(|r| *r == 1));
            assert_eq!(run.sizes.iter().sum::<usize>(), n);
            assert_eq!(run.planner.chunks(), run.sizes.len() as u64);
            assert_eq!(run.planner.retries(), 0);
        }
    }

    #[test]
    fn an_empty_map_hands_out_nothing() {
        let mut planner = Planner::new(0, 4, Sizing::Adaptive);
        assert_eq!(planner.next(), None);
        assert!(planner.is_done());
    }

    #[test]
    fn fixed_chunks_take_as_many_items_as_asked() {
        let run = FakeLambda::uniform(10, Duration::from_millis(1)).run(2, Sizing::Fixed(4));
        assert_eq!(run.sizes, [4, 4, 2]);
        let run = FakeLambda::uniform(500, Duration::from_millis(1)).run(16, Sizing::Fixed(1));
        assert_eq!(run.sizes, [1; 500]);
    }

    #[test]
    fn adaptive_chunks_start_at_one_item_and_grow_to_about_twenty_milliseconds() {
        let run = FakeLambda::uniform(100_000, Duration::from_micros(100)).run(4, Sizing::Adaptive);
        assert_eq!(run.sizes[..4], [1; 4]);
        let aimed = (TARGET.as_secs_f64() / 100e-6) as usize; // 200 items of 100 µs
        let middle = &run.sizes[run.sizes.len() / 4..run.sizes.len() / 2];
        assert!(middle.iter().all(|s| *s == aimed), "{middle:?}");
    }

    #[test]
    fn adaptive_chunks_stay_between_one_and_the_most_items() {
        let fast = FakeLambda::uniform(100_000, Duration::from_nanos(100)).run(2, Sizing::Adaptive);
        assert!(fast.sizes.iter().all(|s| (1..=MAX_CHUNK).contains(s)));
        assert!(fast.sizes.contains(&MAX_CHUNK));
        let slow = FakeLambda::uniform(50, Duration::from_millis(300)).run(2, Sizing::Adaptive);
        assert!(slow.sizes.iter().all(|s| *s == 1), "{:?}", slow.sizes);
    }

    #[test]
    fn the_last_chunks_shrink_so_every_runner_stays_busy_to_the_end() {
        let run = FakeLambda::uniform(3000, Duration::from_micros(10)).run(4, Sizing::Adaptive);
        // The time per item would take MAX_CHUNK items; the fair share of the rest is less.
        assert!(run.sizes.iter().all(|s| *s < MAX_CHUNK), "{:?}", run.sizes);
        assert_eq!(*run.sizes.last().unwrap(), 1);
        let tail = &run.sizes[run.sizes.len() - 8..];
        assert!(tail.windows(2).all(|w| w[0] >= w[1]), "{tail:?}");
        // Few items, many runners: one each.
        let run = FakeLambda::uniform(10, Duration::from_micros(10)).run(16, Sizing::Adaptive);
        assert_eq!(run.sizes, [1; 10]);
    }

    #[test]
    fn chunk_sizes_follow_items_that_slow_down() {
        let mut per_item = vec![Duration::from_micros(20); 20_000];
        per_item.extend(vec![Duration::from_millis(5); 2_000]);
        let run = FakeLambda { per_item, fails: Box::new(|_, _| None) }.run(2, Sizing::Adaptive);
        let late = &run.sizes[run.sizes.len() - 20..];
        assert!(late.iter().all(|s| *s <= 8), "{late:?}");
    }

    #[test]
    fn a_chunk_whose_sandbox_crashed_is_split_and_each_item_run_again_alone() {
        // Item 2500 crashes its sandbox the first time it runs, never after.
        let lambda = FakeLambda {
            per_item: vec![Duration::from_micros(10); 3000],
            fails: Box::new(|i, crashes| (i == 2500 && crashes == 0).then_some(SandboxFailure::Crashed)),
        };
        let run = lambda.run(2, Sizing::Fixed(100));
        assert!(run.outcomes.iter().all(|o| *o == Some(Ok(()))));
        // The chunk of items 2500..2600 stopped at 2500: its 100 items ran again alone.
        assert_eq!(run.planner.retries(), 100);
        assert_eq!(run.runs[2500], 2);
        assert!(run.runs[2501..2600].iter().all(|r| *r == 1), "items after the crash had not run");
        assert_eq!(run.sizes.iter().filter(|s| **s == 1).count(), 100);
    }

    #[test]
    fn an_item_that_crashes_its_sandbox_alone_runs_twice_more_then_is_reported() {
        let lambda = FakeLambda {
            per_item: vec![Duration::from_micros(10); 50],
            fails: Box::new(|i, _| (i == 7).then_some(SandboxFailure::Crashed)),
        };
        let run = lambda.run(4, Sizing::Fixed(1));
        assert_eq!(run.outcomes[7], Some(Err(SandboxFailure::Crashed)));
        assert_eq!(run.runs[7], 1 + CRASH_RETRIES);
        assert_eq!(run.planner.retries(), u64::from(CRASH_RETRIES));
        assert_eq!(run.outcomes.iter().filter(|o| **o == Some(Ok(()))).count(), 49);
    }

    #[test]
    fn an_item_out_of_memory_or_time_alone_is_reported_at_once() {
        for failure in [SandboxFailure::OutOfMemory, SandboxFailure::Timeout] {
            let lambda =
                FakeLambda { per_item: vec![Duration::from_micros(10); 40], fails: Box::new(move |i, _| (i == 30).then_some(failure)) };
            // Alone from the start: never run again.
            let run = lambda.run(2, Sizing::Fixed(1));
            assert_eq!((run.outcomes[30], run.runs[30], run.planner.retries()), (Some(Err(failure)), 1, 0));
            // In a chunk of ten: the chunk is split, then the item fails alone and is reported.
            let run = lambda.run(2, Sizing::Fixed(10));
            assert_eq!((run.outcomes[30], run.runs[30], run.planner.retries()), (Some(Err(failure)), 2, 10));
            assert_eq!(run.outcomes.iter().filter(|o| **o == Some(Ok(()))).count(), 39);
        }
    }

    #[test]
    fn items_to_run_again_go_out_before_new_ones() {
        let mut planner = Planner::new(10, 1, Sizing::Fixed(3));
        let first = planner.next().unwrap();
        assert_eq!(planner.failed(first, SandboxFailure::Timeout), Settled::RunAgain);
        let next: Vec<_> = std::iter::from_fn(|| planner.next()).take(4).map(|c| c.items).collect();
        assert_eq!(next, [0..1, 1..2, 2..3, 3..6]);
        assert_eq!(planner.chunks(), 5);
    }
}
