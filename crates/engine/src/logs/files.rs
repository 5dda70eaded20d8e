//! Lambdas' logs on disk: `DIR/logs/<lambda>/log.jsonl` and up to three older files
//! (`log.1.jsonl`, the newest of them, to `log.3.jsonl`), one JSON entry a line, rotated when
//! the current one passes a quarter of the per-lambda limit, so the four together stay within
//! it. One thread of their own writes them, every [`WRITE_EVERY`] (or sooner when much is
//! waiting), fed through a bounded queue, so no request and no sandbox waits on the disk, and
//! a request's entries cost it no wake-up of that thread: when the queue is full the entry is
//! dropped and counted. Queries older than a lambda's memory ring read them back.

use std::collections::{HashMap, VecDeque};
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant, UNIX_EPOCH};

use super::entry::Entry;

/// Older files kept beside the current one.
const ROTATED: usize = 3;
/// Most files the writer keeps open at once.
const MAX_OPEN: usize = 128;

/// How often the writer writes what is waiting.
pub const WRITE_EVERY: Duration = Duration::from_millis(100);
/// Waiting entries that wake the writer before its time.
const WRITE_AT: usize = 4096;

pub struct Files {
    dir: PathBuf,
    shared: Arc<Shared>,
}

/// The queue between the worker and the writer thread.
struct Shared {
    queue: Mutex<Queue>,
    /// Wakes the writer (much waiting, a flush asked for, closing).
    wake: Condvar,
    /// Wakes those waiting for a flush.
    written: Condvar,
    capacity: usize,
    /// Entries the writer could not take in time.
    dropped: AtomicU64,
}

#[derive(Default)]
struct Queue {
    entries: Vec<Arc<Entry>>,
    /// Flushes asked for, and done (all entries queued before the asking are written).
    flushes_asked: u64,
    flushes_done: u64,
    closed: bool,
}

impl Files {
    /// Write under `dir`, each lambda's files within `max_bytes`, with up to `queue` entries
    /// waiting for the writer.
    pub fn start(dir: PathBuf, max_bytes: u64, queue: usize) -> io::Result<Files> {
        fs::create_dir_all(&dir)?;
        let shared = Arc::new(Shared {
            queue: Mutex::default(),
            wake: Condvar::new(),
            written: Condvar::new(),
            capacity: queue,
            dropped: AtomicU64::new(0),
        });
        let writer = Writer { dir: dir.clone(), rotate_at: (max_bytes / (ROTATED as u64 + 1)).max(4096), open: HashMap::new() };
        let theirs = shared.clone();
        std::thread::Builder::new().name("sprout-logs".into()).spawn(move || writer.run(&theirs))?;
        Ok(Files { dir, shared })
    }

    /// Queue `entry` for its lambda's file; dropped (and counted) when the writer is behind.
    pub fn write(&self, entry: Arc<Entry>) {
        let mut queue = self.shared.queue.lock().unwrap();
        if queue.entries.len() >= self.shared.capacity {
            self.shared.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        queue.entries.push(entry);
        if queue.entries.len() == WRITE_AT {
            self.shared.wake.notify_one();
        }
    }

    /// Entries dropped because the writer was behind.
    pub fn dropped(&self) -> u64 {
        self.shared.dropped.load(Ordering::Relaxed)
    }

    /// Wait up to `timeout` for what was queued before to be written.
    pub fn flush(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let mut queue = self.shared.queue.lock().unwrap();
        queue.flushes_asked += 1;
        let asked = queue.flushes_asked;
        self.shared.wake.notify_one();
        while queue.flushes_done < asked {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            queue = self.shared.written.wait_timeout(queue, left).unwrap().0;
        }
    }

    /// Lambdas with logs on disk.
    pub fn lambdas(&self) -> Vec<String> {
        let Ok(dirs) = fs::read_dir(&self.dir) else { return Vec::new() };
        dirs.flatten().filter(|d| d.path().is_dir()).filter_map(|d| d.file_name().into_string().ok()).collect()
    }

    /// The newest `limit` entries of `lambda` on disk that `keep` accepts, oldest first, among
    /// those before `before_seq` and (skipping whole files last written earlier) from `since`.
    pub fn read(
        &self,
        lambda: &str,
        before_seq: Option<u64>,
        since: Option<f64>,
        limit: usize,
        keep: impl Fn(&Entry) -> bool,
    ) -> Vec<Entry> {
        let mut out = VecDeque::new();
        for path in files_oldest_first(&self.dir.join(lambda)) {
            let Ok(file) = File::open(&path) else { continue };
            if let (Some(since), Ok(modified)) = (since, file.metadata().and_then(|m| m.modified())) {
                if modified.duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0) < since {
                    continue;
                }
            }
            for line in BufReader::new(file).lines() {
                let Ok(line) = line else { break };
                let Ok(entry) = serde_json::from_str::<Entry>(&line) else { continue };
                if before_seq.is_some_and(|b| entry.seq >= b) {
                    return out.into();
                }
                if keep(&entry) {
                    if out.len() == limit {
                        out.pop_front();
                    }
                    out.push_back(entry);
                }
            }
        }
        out.into()
    }

    /// The `seq` of `lambda`'s last entry on disk.
    pub fn last_seq(&self, lambda: &str) -> Option<u64> {
        files_oldest_first(&self.dir.join(lambda)).iter().rev().find_map(|path| last_entry(path).map(|e| e.seq))
    }
}

/// A lambda's files, oldest first.
fn files_oldest_first(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = (1..=ROTATED).rev().map(|n| dir.join(format!("log.{n}.jsonl"))).collect();
    files.push(dir.join("log.jsonl"));
    files.into_iter().filter(|p| p.exists()).collect()
}

/// The last complete entry of a file, read from its end.
fn last_entry(path: &Path) -> Option<Entry> {
    let mut file = File::open(path).ok()?;
    let len = file.metadata().ok()?.len();
    let start = len.saturating_sub(64 * 1024);
    file.seek(SeekFrom::Start(start)).ok()?;
    let mut tail = String::new();
    file.take(64 * 1024).read_to_string(&mut tail).ok()?;
    tail.lines().rev().find_map(|line| serde_json::from_str(line).ok())
}

struct Writer {
    dir: PathBuf,
    rotate_at: u64,
    open: HashMap<Arc<str>, Open>,
}

struct Open {
    file: BufWriter<File>,
    size: u64,
}

impl Drop for Files {
    fn drop(&mut self) {
        self.shared.queue.lock().unwrap().closed = true;
        self.shared.wake.notify_one();
    }
}

impl Writer {
    /// Every [`WRITE_EVERY`], or when woken, write what is waiting; until closed.
    fn run(mut self, shared: &Shared) {
        loop {
            let (entries, asked, closed) = {
                let mut queue = shared.queue.lock().unwrap();
                if queue.entries.len() < WRITE_AT && queue.flushes_asked == queue.flushes_done && !queue.closed {
                    queue = shared.wake.wait_timeout(queue, WRITE_EVERY).unwrap().0;
                }
                (std::mem::take(&mut queue.entries), queue.flushes_asked, queue.closed)
            };
            for entry in &entries {
                if let Err(e) = self.append(entry) {
                    tracing::warn!(lambda = %entry.lambda, "writing the lambda's log: {e}");
                    self.open.remove(&entry.lambda);
                }
            }
            self.flush();
            let mut queue = shared.queue.lock().unwrap();
            queue.flushes_done = asked;
            shared.written.notify_all();
            if closed && queue.entries.is_empty() {
                return;
            }
        }
    }

    fn append(&mut self, entry: &Entry) -> io::Result<()> {
        if !self.open.contains_key(&entry.lambda) {
            if self.open.len() >= MAX_OPEN {
                self.flush();
                self.open.clear();
            }
            let dir = self.dir.join(&*entry.lambda);
            fs::create_dir_all(&dir)?;
            let file = OpenOptions::new().create(true).append(true).open(dir.join("log.jsonl"))?;
            let size = file.metadata()?.len();
            self.open.insert(entry.lambda.clone(), Open { file: BufWriter::with_capacity(64 * 1024, file), size });
        }
        let open = self.open.get_mut(&entry.lambda).expect("opened above");
        let mut line = serde_json::to_vec(entry)?;
        line.push(b'\n');
        open.file.write_all(&line)?;
        open.size += line.len() as u64;
        if open.size >= self.rotate_at {
            let mut done = self.open.remove(&entry.lambda).expect("open");
            done.file.flush()?;
            drop(done);
            rotate(&self.dir.join(&*entry.lambda))?;
        }
        Ok(())
    }

    fn flush(&mut self) {
        for open in self.open.values_mut() {
            let _ = open.file.flush();
        }
    }
}

/// `log.jsonl` becomes `log.1.jsonl`, each older one moves up, the oldest goes.
fn rotate(dir: &Path) -> io::Result<()> {
    let _ = fs::remove_file(dir.join(format!("log.{ROTATED}.jsonl")));
    for n in (1..ROTATED).rev() {
        let from = dir.join(format!("log.{n}.jsonl"));
        if from.exists() {
            fs::rename(&from, dir.join(format!("log.{}.jsonl", n + 1)))?;
        }
    }
    fs::rename(dir.join("log.jsonl"), dir.join("log.1.jsonl"))
}

#[cfg(test)]
mod tests {
    use super::super::entry::Kind;
    use super::*;

    fn entry(lambda: &Arc<str>, seq: u64, message: &str) -> Arc<Entry> {
        let mut e = Entry::now(lambda, 1, Kind::Out, message.to_string());
        e.seq = seq;
        Arc::new(e)
    }

    fn total_bytes(dir: &Path) -> u64 {
        files_oldest_first(dir).iter().map(|p| fs::metadata(p).unwrap().len()).sum()
    }

    #[test]
    fn files_rotate_within_the_limit_and_read_back_newest_last() {
        let tmp = tempfile::tempdir().unwrap();
        let files = Files::start(tmp.path().to_path_buf(), 64 * 1024, 100_000).unwrap();
        let (noisy, quiet): (Arc<str>, Arc<str>) = (Arc::from("noisy"), Arc::from("quiet"));
        files.write(entry(&quiet, 1, "keep me"));
        for seq in 1..=5000 {
            files.write(entry(&noisy, seq, &"x".repeat(100)));
        }
        files.flush(Duration::from_secs(10));
        assert_eq!(files.dropped(), 0);
        let dir = tmp.path().join("noisy");
        assert!(total_bytes(&dir) <= 64 * 1024 + 1024, "{} bytes", total_bytes(&dir));
        assert_eq!(files_oldest_first(&dir).len(), 4);
        assert_eq!(files.last_seq("noisy"), Some(5000));
        let newest = files.read("noisy", None, None, 3, |_| true);
        assert_eq!(newest.iter().map(|e| e.seq).collect::<Vec<_>>(), [4998, 4999, 5000]);
        let before = files.read("noisy", Some(4999), None, 2, |_| true);
        assert_eq!(before.iter().map(|e| e.seq).collect::<Vec<_>>(), [4997, 4998]);
        // The quiet lambda's log is its own: the flood pushed nothing of it out.
        assert_eq!(files.read("quiet", None, None, 10, |_| true)[0].message, "keep me");
        let mut lambdas = files.lambdas();
        lambdas.sort();
        assert_eq!(lambdas, ["noisy", "quiet"]);
        assert_eq!(files.last_seq("nobody"), None);
    }
}
