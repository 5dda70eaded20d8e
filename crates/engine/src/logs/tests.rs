//! The logs' bookkeeping against no sandbox: output tagged by request, the rate bound under a
//! flood, queries, following, and files surviving a restart.

use std::sync::Arc;
use std::time::Duration;

use sprout_sandbox::output::OutputSink;

use super::*;

fn tag(id: &str) -> RequestTag {
    RequestTag { id: Arc::from(id), trigger: Trigger::Http }
}

fn report(sandbox: u64, outcome: &str) -> RunReport<'_> {
    RunReport { sandbox, duration: Duration::from_micros(1500), init: None, peak_memory: Some(12 << 20), cold: false, outcome, error: None }
}

fn kinds(entries: &[Arc<Entry>]) -> Vec<(Kind, Option<&str>, &str)> {
    entries.iter().map(|e| (e.kind, e.request_id.as_deref(), e.message.as_str())).collect()
}

#[test]
fn output_belongs_to_the_request_under_way() {
    let logs = Logs::in_memory();
    let out = logs.sandbox_output("echo", 2, "fake");
    out.write(7, b"loading\n");
    out.begin(&tag("r1"), 7, true);
    out.write(7, b"hello\nworld\r\n");
    out.finish(&report(7, "ok"));
    out.write(7, b"late\n");
    let all = logs.query("echo", &Query::default());
    let got = kinds(&all);
    assert_eq!(got[0], (Kind::Out, None, "loading"));
    assert_eq!(got[1], (Kind::Start, Some("r1"), "START RequestId: r1 Version: 2"));
    assert_eq!(got[2..4], [(Kind::Out, Some("r1"), "hello"), (Kind::Out, Some("r1"), "world")]);
    assert_eq!(got[4].0, Kind::Report);
    assert!(got[4].2.starts_with("REPORT RequestId: r1 Duration: 1.50 ms Billed Duration: 2 ms Max Memory Used: 12 MB"), "{}", got[4].2);
    assert_eq!(got[5], (Kind::Out, None, "late"));
    assert_eq!(all.iter().map(|e| e.seq).collect::<Vec<_>>(), [1, 2, 3, 4, 5, 6]);
    assert!(all.iter().all(|e| e.version == 2 && e.sandbox == Some(7)));
    let details = all[4].details.as_ref().unwrap();
    assert_eq!((details.billed_ms, details.outcome.as_deref(), details.start.as_deref()), (Some(2), Some("ok"), Some("warm")));
    // By request id, here and across lambdas.
    let only = logs.query("echo", &Query { request: Some("r1".into()), ..Query::default() });
    assert_eq!(only.len(), 4);
    assert_eq!(logs.find_request("r1").len(), 4);
    assert!(logs.find_request("nope").is_empty());
}

#[test]
fn a_handler_error_is_logged_before_the_report() {
    let logs = Logs::in_memory();
    let out = logs.sandbox_output("fail", 1, "fake");
    out.begin(&tag("r9"), 3, false);
    let tb = "Traceback (most recent call last):\nZeroDivisionError: division by zero";
    out.finish(&RunReport { error: Some(("division by zero", Some(tb))), ..report(3, "handler_exception") });
    let all = logs.query("fail", &Query::default());
    assert_eq!(all[1].kind, Kind::Error);
    assert_eq!(all[1].message, "ERROR RequestId: r9 handler_exception: division by zero");
    assert_eq!(all[1].details.as_ref().unwrap().traceback.as_deref(), Some(tb));
    assert!(all[2].message.ends_with("Outcome: handler_exception"), "{}", all[2].message);
}

#[test]
fn a_flood_is_dropped_past_the_rate_and_counted_without_touching_another_lambda() {
    let cfg = LogConfig { rate_bytes: 10_000, burst_bytes: 20_000, memory_bytes: 64 << 10, ..LogConfig::default() };
    let logs = Logs::new(cfg).unwrap();
    let quiet = logs.sandbox_output("quiet", 1, "fake");
    quiet.write(1, b"important\n");
    let noisy = logs.sandbox_output("noisy", 1, "fake");
    noisy.begin(&tag("flood"), 2, false);
    let line = [b'x'; 99].iter().chain(b"\n").copied().collect::<Vec<u8>>();
    let chunk: Vec<u8> = line.repeat(100); // 10,000 bytes a chunk
    for _ in 0..100 {
        noisy.write(2, &chunk);
    }
    noisy.finish(&report(2, "ok"));
    let (lines, bytes) = logs.dropped_of("noisy");
    assert!(lines >= 9_700 && bytes >= 970_000, "{lines} lines, {bytes} bytes dropped");
    let all = logs.query("noisy", &Query { limit: query::MAX_LIMIT, ..Query::default() });
    let dropped: Vec<_> = all.iter().filter(|e| e.kind == Kind::Dropped).collect();
    assert_eq!(dropped.len(), 1, "one dropped entry, at the end of the request");
    assert_eq!(dropped[0].details.as_ref().unwrap().lines, Some(lines));
    let report = all.last().unwrap();
    assert_eq!(report.kind, Kind::Report);
    assert_eq!(report.details.as_ref().unwrap().lines, Some(lines));
    // The memory ring stays within its bound, and the quiet lambda's line is still there.
    assert!(logs.lambda("noisy").state.lock().unwrap().ring.bytes() <= 64 << 10);
    assert_eq!(logs.query("quiet", &Query::default())[0].message, "important");
    assert_eq!(logs.dropped().len(), 2);
}

/// Lambdas `a1` and `a2` in group `a` (5,000 bytes a second together); `b` in none.
struct TwoGroups;

impl LogGroups for TwoGroups {
    fn group(&self, lambda: &str) -> Option<(String, u64)> {
        lambda.starts_with('a').then(|| ("a".to_string(), 5_000))
    }
}

#[test]
fn a_groups_lambdas_share_its_rate_and_the_drop_names_it() {
    let logs = Logs::in_memory();
    logs.set_groups(Arc::new(TwoGroups));
    let chunk: Vec<u8> = [b'x'; 99].iter().chain(b"\n").copied().collect::<Vec<u8>>().repeat(10); // 1,000 bytes
    let (a1, a2, b) = (logs.sandbox_output("a1", 1, "fake"), logs.sandbox_output("a2", 1, "fake"), logs.sandbox_output("b", 1, "fake"));
    for _ in 0..4 {
        a1.write(1, &chunk);
        a2.write(2, &chunk);
        b.write(3, &chunk);
    }
    // Group a's second's worth (5,000 bytes) went to its two lambdas together; b kept all.
    let kept = |name: &str| logs.query(name, &Query { limit: query::MAX_LIMIT, ..Query::default() }).len();
    assert_eq!(kept("a1") + kept("a2"), 50);
    assert_eq!(kept("b"), 40);
    assert_eq!(logs.group_dropped(), [("a".to_string(), 3_000)]);
    // Once output is kept again, the drop is logged naming the group's quota.
    std::thread::sleep(Duration::from_millis(300));
    a2.write(2, b"again\n");
    let all = logs.query("a2", &Query { limit: query::MAX_LIMIT, ..Query::default() });
    let dropped = all.iter().find(|e| e.kind == Kind::Dropped).expect("a dropped entry");
    assert!(dropped.message.contains("tenant \"a\"'s lambdas together (its log_kb_s quota)"), "{}", dropped.message);
}

#[test]
fn queries_take_the_newest_matching_oldest_first() {
    let logs = Logs::in_memory();
    let out = logs.sandbox_output("l", 1, "fake");
    for i in 0..10 {
        out.write(1, format!("line {i}\n").as_bytes());
    }
    let last3 = logs.query("l", &Query { limit: 3, ..Query::default() });
    assert_eq!(last3.iter().map(|e| e.message.as_str()).collect::<Vec<_>>(), ["line 7", "line 8", "line 9"]);
    let future = logs.query("l", &Query { since: Some(all_ts(&logs) + 100.0), ..Query::default() });
    assert!(future.is_empty());
}

fn all_ts(logs: &Logs) -> f64 {
    logs.query("l", &Query::default()).last().unwrap().ts
}

#[tokio::test]
async fn followers_get_new_entries() {
    let logs = Logs::in_memory();
    let mut follower = logs.follow("f");
    let out = logs.sandbox_output("f", 1, "fake");
    out.write(4, b"one\n");
    let got = tokio::time::timeout(Duration::from_secs(5), follower.recv()).await.unwrap().unwrap();
    assert_eq!(got.message, "one");
    drop(follower);
    out.write(4, b"two\n"); // nobody listens: no error, nothing kept for them
    assert_eq!(logs.query("f", &Query::default()).len(), 2);
    // The worker stops: streams end, and new ones end at once.
    let mut follower = logs.follow("f");
    logs.close();
    assert!(follower.recv().await.is_err());
    assert!(logs.follow("f").recv().await.is_err());
}

#[test]
fn files_keep_logs_past_the_ring_and_across_a_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = LogConfig { dir: Some(tmp.path().to_path_buf()), memory_bytes: 4096, ..LogConfig::default() };
    {
        let logs = Logs::new(cfg.clone()).unwrap();
        let out = logs.sandbox_output("p", 1, "fake");
        for i in 0..200 {
            out.write(1, format!("line {i}\n").as_bytes());
        }
        // The ring holds a few; the query reaches back into the files for the rest.
        let all = logs.query("p", &Query { limit: 1000, ..Query::default() });
        assert_eq!(all.len(), 200);
        assert_eq!(all.iter().map(|e| e.seq).collect::<Vec<_>>(), (1..=200).collect::<Vec<_>>());
    }
    let logs = Logs::new(cfg).unwrap();
    assert!(logs.has("p") && !logs.has("q"));
    let out = logs.sandbox_output("p", 2, "fake");
    out.write(1, b"after restart\n");
    let last = logs.query("p", &Query { limit: 2, ..Query::default() });
    assert_eq!(last.iter().map(|e| (e.seq, e.message.as_str())).collect::<Vec<_>>(), [(200, "line 199"), (201, "after restart")]);
}
