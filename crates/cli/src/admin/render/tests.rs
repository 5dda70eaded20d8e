//! The renderers' tests: JSON in, the text people read out.

use super::super::{parse_static, segment};
use super::lambdas::*;
use super::logs::*;
use super::sites::*;
use super::stats::*;
use super::text::*;
use serde_json::{json, Value};

#[test]
fn a_lambdas_invocations_join_its_figures_with_or_without_sandboxes() {
    let stats = json!({
        "lambdas": {"per_lambda": {"busy": {"sandboxes": 1, "idle": 0, "served": 2}}},
        "lambda_invocations": {"busy": {"invocations": 7, "cold_starts": 1, "errors": 0},
                               "gone": {"invocations": 3, "cold_starts": 1, "errors": 1}},
    });
    let stats = with_invocations(stats);
    assert_eq!(invocations(figures_of(&stats, "busy").unwrap()), 7);
    assert_eq!(invocations(figures_of(&stats, "gone").unwrap()), 3);
    assert_eq!(figures_of(&stats, "busy").unwrap()["sandboxes"], 1);
    assert!(figures_of(&stats, "never").is_none());
    assert!(stats.get("lambda_invocations").is_none_or(Value::is_null));
}

#[test]
fn tables_align_their_columns() {
    let rows = vec![vec!["echo".to_string(), "12".to_string(), "x".to_string()], vec!["a-long-name".into(), "3".into(), "".into()]];
    assert_eq!(table(&["NAME", "N", "NOTE"], &rows, &[1]), "NAME          N  NOTE\necho         12  x\na-long-name   3\n");
    assert_eq!(table(&["A", "B"], &[], &[]), "A  B\n");
}

#[test]
fn times_read_as_people_say_them() {
    assert_eq!(ago(100, 100), "just now");
    assert_eq!(ago(100, 90), "just now");
    assert_eq!(ago(100, 159), "59s ago");
    assert_eq!(ago(100, 100 + 180), "3m ago");
    assert_eq!(ago(0, 7200), "2h ago");
    assert_eq!(ago(0, 3 * 86400 + 5), "3d ago");
    assert_eq!(span(45.7), "45s");
    assert_eq!(span(192.0), "3m 12s");
    assert_eq!(span(7380.0), "2h 3m");
    assert_eq!(span(90000.0), "1d 1h");
    assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
    assert_eq!(rfc3339(1_795_764_741), "2026-11-27T07:32:21Z");
    assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
    assert_eq!(rfc3339(4_107_542_399), "2100-02-28T23:59:59Z");
    assert_eq!(bytes(148), "148 B");
    assert_eq!(bytes(1536), "1.5 KiB");
    assert_eq!(bytes(3 << 20), "3.0 MiB");
    assert_eq!(bytes(5 << 30), "5.0 GiB");
}

#[test]
fn log_entries_print_as_lines() {
    let out = json!({"seq": 812, "time": "2026-11-27T10:02:03.456Z", "ts": 1795779723.456, "lambda": "echo", "version": 3,
                     "request_id": "9f3a0c1d2b4e5f60", "sandbox": 17, "backend": "sock", "type": "out", "message": "hello"});
    assert_eq!(render_entry(&out), "2026-11-27T10:02:03.456Z 9f3a0c1d hello");
    let report = json!({"time": "2026-11-27T10:02:03.457Z", "type": "report", "request_id": "9f3a0c1d2b4e5f60", "duration_ms": 1.23,
                        "message": "REPORT RequestId: 9f3a0c1d2b4e5f60 Duration: 1.23 ms Billed Duration: 2 ms Max Memory Used: 12 MB"});
    assert_eq!(
        render_entry(&report),
        "2026-11-27T10:02:03.457Z REPORT RequestId: 9f3a0c1d2b4e5f60 Duration: 1.23 ms Billed Duration: 2 ms Max Memory Used: 12 MB"
    );
    let outside = json!({"time": "2026-11-27T10:02:03.000Z", "type": "out", "request_id": null, "message": "loading"});
    assert_eq!(render_entry(&outside), "2026-11-27T10:02:03.000Z loading");
    let hostile = json!({"time": "T", "type": "out", "request_id": "abc", "message": "\u{1b}[2Jgone\tok\r"});
    assert_eq!(render_entry(&hostile), "T abc \\x1b[2Jgone\tok\\x0d");
    assert_eq!(render_entry(&json!({"ts": 0.5, "type": "dropped", "message": "dropped 3 lines"})), "1970-01-01T00:00:00Z dropped 3 lines");
    assert_eq!(dropped_note(&json!({"lines": 0, "bytes": 0})), None);
    assert!(dropped_note(&json!({"lines": 3, "bytes": 2048})).unwrap().contains("3 lines, 2.0 KiB"));
}

#[test]
fn pretty_keeps_the_order_and_text_of_the_json() {
    let raw = r#"{"z":1,"a":{"s":"x, y: {[\"q\"]}","e":[],"o":{}},"n":[1.50,2]}"#;
    let out = pretty(raw);
    assert_eq!(
        out,
        "{\n  \"z\": 1,\n  \"a\": {\n    \"s\": \"x, y: {[\\\"q\\\"]}\",\n    \"e\": [],\n    \"o\": {}\n  },\n  \"n\": [\n    1.50,\n    2\n  ]\n}"
    );
    assert_eq!(serde_json::from_str::<Value>(&out).unwrap(), serde_json::from_str::<Value>(raw).unwrap());
    assert_eq!(pretty("[]"), "[]");
    assert_eq!(pretty("not json"), "not json");
    let value = json!({"b": [1, {"c": null}], "a": "é\\"});
    assert_eq!(pretty(&value.to_string()), serde_json::to_string_pretty(&value).unwrap());
}

#[test]
fn ls_and_show_render_the_registry_and_the_figures() {
    let meta = json!({"archive_bytes": 148, "config": {"reuse_sandbox": true, "environment": {"GREETING": "hello"}}, "files": 1,
                      "name": "echo", "requirements": ["jinja2==3.1.4"], "sha256": "acd5", "unpacked_bytes": 2048,
                      "uploaded": 1_795_764_741u64, "version": 3});
    let figures = json!({"idle": 1, "queued": 0, "sandboxes": 3, "served": 42,
                         "keep_alive": {"basis": "young", "idle_times": 2, "keep_alive_s": 300.0, "policy": "histogram", "prewarm_s": 0.0}});
    let other = json!({"name": "a", "version": 12, "uploaded": 1_795_764_741u64 - 7200});
    let now = 1_795_764_741 + 180;
    assert_eq!(
        render_ls(&[(other, None), (meta.clone(), Some(&figures))], now),
        "NAME  VERSION  UPLOADED  BUSY/IDLE  INVOCATIONS\n\
         a          12  2h ago          0/0            0\n\
         echo        3  3m ago          2/1           42\n"
    );
    assert_eq!(render_ls(&[], now), "no lambdas\n");
    let shown = render_show(&meta, Some(&figures), now);
    assert_eq!(
        shown,
        "name          echo\n\
         version       3\n\
         uploaded      2026-11-27T07:32:21Z (3m ago)\n\
         sha256        acd5\n\
         files         1, 2.0 KiB unpacked (archive 148 B)\n\
         requirements  jinja2==3.1.4\n\
         config        environment: {\"GREETING\":\"hello\"}\n\
         \x20             reuse_sandbox: true\n\
         sandboxes     3 (busy 2, idle 1), queued 0\n\
         served        42\n\
         keep-alive    histogram (young, 2 idle times): keep 5m 0s\n"
    );
    assert!(render_show(&json!({"name": "x", "config": {}}), None, now).contains("sandboxes     none (no request"));
}

#[test]
fn stats_read_as_one_liners() {
    let stats = json!({
        "backend": "sock", "uptime_s": 7380.0, "invocations": 3, "cold_starts": 1, "warm_starts": 2,
        "latency": {"cold": {"count": 1, "p50_ms": 3.449, "p99_ms": 3.449}, "warm": {"count": 0, "p50_ms": 0.0, "p99_ms": 0.0}},
        "sandbox_start": {"count": 1, "p50_ms": 2.989, "p99_ms": 2.989},
        "sandboxes": {"starting": 0, "busy": 1, "idle": 2},
        "errors": {"timeout": 2, "handler_exception": 1}, "retries": {"no_reply": 0, "send_failed": 0},
        "handler_cache": {"pause": true, "paused": 1, "paused_pss_mb": 4.25, "memory_limit_mb": 1024, "pauses": 5, "resumes": 4,
                          "evictions": {"idle": 1, "budget": 0}},
        "install_cache": {"enabled": true, "installed_packages": 2, "hits": 3, "misses": 1, "installs": 1, "install_seconds": 2.5,
                          "install_failures": 0, "resolution_failures": 1},
        "import_cache": null,
        "lambdas": {"per_lambda": {"echo": {"queued": 2}}, "memory_budget": {"limit_mb": 2048.0, "used_mb": 100.0, "pending_mb": 0.0,
                    "waits": 1, "evictions": 0, "queued_instead": 0}},
    });
    let out = render_stats(&stats);
    for line in [
        "worker         sock backend, up 2h 3m",
        "invocations    3 (cold 1, warm 2)",
        "latency        cold p50 3.45 ms, p99 3.45 ms; warm none",
        "sandbox start  p50 2.99 ms, p99 2.99 ms (1 started)",
        "sandboxes      starting 0, busy 1, idle 2 (paused 1)",
        "lambdas        1 with sandboxes or requests, 2 requests queued",
        "memory budget  100.0 MiB of 2048.0 MiB used, 0.0 MiB pending; 1 waits, 0 evictions, 0 queued instead",
        "handler cache  1 paused, 4.2 MiB PSS of 1024 MiB; 5 pauses, 4 resumes; evictions: idle 1",
        "install cache  2 packages; 3 hits, 1 misses, 1 installs (2.5 s), 1 failures",
        "import cache   none (this backend has no Zygotes)",
        "errors         handler_exception 1, timeout 2",
        "retries        none",
    ] {
        assert!(out.lines().any(|l| l == line), "{line:?} not in\n{out}");
    }
    // A worker with fewer figures still renders.
    assert!(render_stats(&json!({})).contains("errors         none"));
}

#[test]
fn sites_render_and_static_args_parse() {
    let sites = json!({"*": {"site": {"lambda": "olio"}, "source": "config"},
                       "a.example": {"site": {"lambda": "echo", "static": {"/s/": "/tmp"}}, "source": "api"}});
    assert_eq!(
        render_sites(&sites),
        "HOST       LAMBDA  SOURCE  STATIC\n*          olio    config  -\na.example  echo    api     /s/ → /tmp\n"
    );
    assert_eq!(render_sites(&json!({})), "no sites\n");
    assert_eq!(parse_static("/static/=/srv/a=b"), Ok(("/static/".into(), "/srv/a=b".into())));
    assert!(parse_static("/static/").is_err() && parse_static("=/x").is_err());
    assert_eq!(describe_site(&json!({"lambda": "echo", "static": {}})), "echo");
}

#[test]
fn names_are_encoded_as_path_segments() {
    assert_eq!(segment("echo_1.2-x"), "echo_1.2-x");
    assert_eq!(segment("a b/c?"), "a%20b%2Fc%3F");
}
