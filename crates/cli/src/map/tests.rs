//! The map's tests: items, requests, outcomes, the progress line, and whole maps against a
//! fake worker.

use super::items::*;
use super::outcomes::*;
use super::progress::*;
use super::run::*;
use super::*;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

#[test]
fn items_are_checked_whole_and_a_bad_line_is_named() {
    let text = "{\"a\": 1}\n\n  2  \n\"x\"\n[1, 2]\nnull\n";
    assert_eq!(parse_items(text, "in.jsonl").unwrap(), ["{\"a\": 1}", "2", "\"x\"", "[1, 2]", "null"]);
    let e = parse_items("1\n2\n{\"a\": }\n4\n", "in.jsonl").unwrap_err().to_string();
    assert!(e.starts_with("in.jsonl line 3 is not JSON at column 7:"), "{e}");
    assert!(e.ends_with("nothing was sent"), "{e}");
    // Two values on one line are not one event.
    assert!(parse_items("1 2\n", "x").unwrap_err().to_string().contains("line 1"));
    assert!(parse_items("{\"a\": 1}{\"b\": 2}\n", "x").is_err());
    assert!(parse_items("", "x").unwrap().is_empty());
    assert!(parse_items("\n \n", "x").unwrap().is_empty());
    // CRLF files.
    assert_eq!(parse_items("1\r\n2\r\n", "x").unwrap(), ["1", "2"]);
}

#[test]
fn requests_hold_at_most_max_items_and_about_max_bytes() {
    let items: Vec<String> = (0..5000).map(|i| i.to_string()).collect();
    let batches = split(&items, MAX_ITEMS, MAX_BYTES);
    assert_eq!(batches, [0..2048, 2048..4096, 4096..5000]);
    // By bytes: each item "xxxxxxxx" (8 bytes + a comma); a body of at most 30 bytes takes 3.
    let items = vec!["xxxxxxxx"; 7];
    assert_eq!(split(&items, 100, 30), [0..3, 3..6, 6..7]);
    for r in split(&items, 100, 30) {
        assert!(body(&items[r]).len() <= 30);
    }
    // An item larger than the bound goes alone, and does not drag its neighbours along.
    let big = "y".repeat(100);
    let items = vec!["1", big.as_str(), "2", "3"];
    assert_eq!(split(&items, 100, 30), [0..1, 1..2, 2..4]);
    assert!(split::<&str>(&[], 10, 10).is_empty());
    // Every item lands in exactly one request, in order.
    let items: Vec<String> = (0..10_000).map(|i| "z".repeat(i % 700)).collect();
    let batches = split(&items, MAX_ITEMS, 1 << 20);
    assert_eq!(batches.first().unwrap().start, 0);
    assert_eq!(batches.last().unwrap().end, items.len());
    assert!(batches.windows(2).all(|w| w[0].end == w[1].start));
    assert!(batches.iter().all(|r| r.len() <= MAX_ITEMS && body(&items[r.clone()]).len() <= 1 << 20));
}

#[test]
fn a_map_is_spread_over_several_requests_in_flight() {
    assert_eq!(request_items(3000, 4), 188); // 16 requests, four for each in flight
    assert_eq!(request_items(10, 4), MIN_ITEMS); // one request
    assert_eq!(request_items(1_000_000, 4), MAX_ITEMS);
    assert_eq!(request_items(0, 0), MIN_ITEMS);
    assert_eq!(split(&vec!["1"; 3000], request_items(3000, 4), MAX_BYTES).len(), 16);
}

#[test]
fn a_body_is_a_json_array_of_the_items_as_written() {
    assert_eq!(body(&["1", "{\"a\": [2]}", "\"s\""]), "[1,{\"a\": [2]},\"s\"]");
    assert_eq!(body::<&str>(&[]), "[]");
    let v: Value = serde_json::from_str(&body(&["1.50", "null"])).unwrap();
    assert_eq!(v, serde_json::json!([1.5, null]));
}

#[test]
fn answers_come_out_in_order() {
    let mut r = Reorder::default();
    assert!(r.push(2, "c").is_empty());
    assert!(r.push(1, "b").is_empty());
    assert_eq!(r.waiting(), 2);
    assert_eq!(r.push(0, "a"), ["a", "b", "c"]);
    assert_eq!(r.push(3, "d"), ["d"]);
    assert!(r.push(5, "f").is_empty());
    assert_eq!(r.push(4, "e"), ["e", "f"]);
    assert_eq!(r.waiting(), 0);
}

#[test]
fn outcomes_are_results_or_error_objects() {
    let reply = r#"[{"result": {"n": 1}}, {"error": "handler_exception", "message": "boom", "traceback": "T"}, {"result": null}]"#;
    let o = outcomes(reply, 3).unwrap();
    assert_eq!(o[0], Outcome::Ok(r#"{"n":1}"#.into()));
    assert!(matches!(&o[1], Outcome::Failed(s) if serde_json::from_str::<Value>(s).unwrap()["error"] == "handler_exception"));
    assert_eq!(o[2], Outcome::Ok("null".into()));
    assert!(outcomes(reply, 2).unwrap_err().to_string().contains("3 outcomes for 2 items"));
    assert!(outcomes("[1]", 1).is_err());
    assert!(outcomes(r#"{"error": "x"}"#, 1).is_err());
}

#[test]
fn only_undelivered_requests_are_retried() {
    for code in [429, 502, 503] {
        assert!(retryable_status(code));
    }
    for code in [400, 404, 413, 500, 504] {
        assert!(!retryable_status(code));
    }
}

#[test]
fn the_progress_line() {
    assert_eq!(progress_line(5, 10, 0, 2.0, 10), "[#####-----] 5/10 items  2/s");
    assert_eq!(progress_line(10, 10, 1, 1.0, 4), "[####] 10/10 items  10/s  1 failed");
    assert_eq!(progress_line(0, 0, 0, 0.0, 3), "[###] 0/0 items  0/s");
}

/// A worker's `/map` on a local port: each request's items are numbers, an item's result
/// is its double and a negative one fails; the first `unavailable` requests are answered
/// 503, and later answers are slower for earlier items (so they come back out of order).
fn fake_worker(unavailable: usize, status: u16) -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let refused = Arc::new(AtomicUsize::new(0));
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { break };
            let (log, refused) = (log.clone(), refused.clone());
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                loop {
                    let mut first = String::new();
                    if reader.read_line(&mut first).unwrap_or(0) == 0 {
                        return;
                    }
                    let mut length = 0;
                    loop {
                        let mut h = String::new();
                        reader.read_line(&mut h).unwrap();
                        if h.trim().is_empty() {
                            break;
                        }
                        if let Some((k, v)) = h.split_once(':') {
                            if k.eq_ignore_ascii_case("content-length") {
                                length = v.trim().parse().unwrap();
                            }
                        }
                    }
                    let mut body = vec![0; length];
                    reader.read_exact(&mut body).unwrap();
                    log.lock().unwrap().push(first.split_whitespace().nth(1).unwrap_or("").to_string());
                    let mut stream = &stream;
                    if refused.fetch_add(1, Ordering::SeqCst) < unavailable {
                        let _ = write!(stream, "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n");
                        continue;
                    }
                    if status != 200 {
                        let err = r#"{"error": "lambda_not_found", "message": "no lambda named \"nope\""}"#;
                        let _ = write!(
                            stream,
                            "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{err}",
                            err.len()
                        );
                        continue;
                    }
                    let items: Vec<i64> = serde_json::from_slice(&body).unwrap();
                    std::thread::sleep(Duration::from_millis(((100 - items[0].clamp(0, 100)) / 10) as u64));
                    let reply: Vec<Value> = items
                        .iter()
                        .map(|n| {
                            if *n < 0 {
                                serde_json::json!({"error": "handler_exception", "message": "negative"})
                            } else {
                                serde_json::json!({"result": n * 2})
                            }
                        })
                        .collect();
                    let reply = serde_json::to_string(&reply).unwrap();
                    let _ = write!(
                        stream,
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nx-sprout-map-chunks: 1\r\nContent-Length: {}\r\n\r\n{reply}",
                        reply.len()
                    );
                }
            });
        }
    });
    (url, seen)
}

fn options(url: &str, ordered: bool, chunk: Option<u32>) -> Options {
    Options { url: url.into(), name: "double".into(), concurrency: 4, ordered, chunk, backoff: Duration::from_millis(5) }
}

#[test]
fn a_map_prints_every_outcome_in_order_and_counts_failures() {
    let (url, seen) = fake_worker(1, 200);
    let lines: Vec<String> = (0..5000).map(|i| if i == 77 { "-1".to_string() } else { i.to_string() }).collect();
    let items: Vec<&str> = lines.iter().map(String::as_str).collect();
    let mut out = Vec::new();
    let mut updates = 0;
    let summary = run(&options(&url, true, Some(8)), &items, &mut out, &mut |_, _| updates += 1).unwrap();
    let printed: Vec<String> = String::from_utf8(out).unwrap().lines().map(str::to_string).collect();
    assert_eq!(printed.len(), 5000);
    for (i, line) in printed.iter().enumerate() {
        if i == 77 {
            assert!(line.contains("handler_exception"), "{line}");
        } else {
            assert_eq!(line, &(i * 2).to_string());
        }
    }
    assert_eq!(summary, Summary { items: 5000, failed: 1, requests: 16, chunks: 16, rerun: 0, resent: 1 });
    assert!(updates >= 16);
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 17); // one 503, sent again
    assert!(seen.iter().all(|path| path == "/map/double?chunk=8"), "{seen:?}");
}

#[test]
fn unordered_still_prints_every_outcome_once() {
    let (url, _) = fake_worker(0, 200);
    let lines: Vec<String> = (0..4100).map(|i| i.to_string()).collect();
    let items: Vec<&str> = lines.iter().map(String::as_str).collect();
    let mut out = Vec::new();
    run(&options(&url, false, None), &items, &mut out, &mut |_, _| {}).unwrap();
    let mut got: Vec<i64> = String::from_utf8(out).unwrap().lines().map(|l| l.parse().unwrap()).collect();
    got.sort();
    assert_eq!(got, (0..4100).map(|i| i * 2).collect::<Vec<i64>>());
}

#[test]
fn a_request_error_stops_the_map() {
    let (url, seen) = fake_worker(0, 404);
    let mut out = Vec::new();
    let Stopped(e) = run(&options(&url, true, None), &["1", "2"], &mut out, &mut |_, _| {}).unwrap_err();
    let e = format!("{e:#}");
    assert!(e.contains("404 lambda_not_found"), "{e}");
    assert!(out.is_empty());
    assert_eq!(seen.lock().unwrap().len(), 1); // a 404 is not sent again
                                               // Still unavailable after the retries.
    let (url, seen) = fake_worker(usize::MAX, 200);
    let Stopped(e) = run(&options(&url, true, None), &["1"], &mut Vec::new(), &mut |_, _| {}).unwrap_err();
    assert!(format!("{e:#}").contains("503"), "{e:#}");
    assert_eq!(seen.lock().unwrap().len(), 1 + RETRIES as usize);
    // Nobody listening: connection refused, retried, then an error naming the worker.
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let Stopped(e) = run(&options(&format!("http://127.0.0.1:{port}"), true, None), &["1"], &mut Vec::new(), &mut |_, _| {}).unwrap_err();
    assert!(format!("{e:#}").contains("cannot reach the worker"), "{e:#}");
}

#[test]
fn nothing_to_map_sends_nothing() {
    let summary = run(&options("http://127.0.0.1:1", true, None), &[], &mut Vec::new(), &mut |_, _| {}).unwrap();
    assert_eq!(summary.requests, 0);
}
