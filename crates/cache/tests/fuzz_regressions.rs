//! Replays every input in `tests/fuzz_regressions/` (crashes the fuzzer found, and seeds that
//! exercise tricky paths: partial commands, oversized values, bad binary lengths) through the
//! `session` fuzz target's driver, on stable Rust: with the chunking each file names, and with
//! every other chunking too. See `crates/cache/fuzz/README.md`.

#[path = "support/fuzz_driver.rs"]
mod fuzz_driver;

use std::path::PathBuf;

fn corpus() -> Vec<(String, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz_regressions");
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| {
            let path = entry.unwrap().path();
            (path.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&path).unwrap())
        })
        .collect();
    files.sort();
    files
}

#[test]
fn replays_every_regression_input() {
    let files = corpus();
    assert!(!files.is_empty(), "tests/fuzz_regressions is empty");
    for (name, data) in &files {
        let (ctrl, stream) = fuzz_driver::split(data);
        let result = std::panic::catch_unwind(|| {
            fuzz_driver::run(data);
            // Every chunking: whole, and at most 1, 2, 7, 64, 512, 4096, 16384 bytes, in
            // fixed and in drawn sizes.
            for c0 in 0..16u8 {
                fuzz_driver::run_stream([c0, ctrl[1]], stream, false);
            }
        });
        if let Err(e) = result {
            let msg = e.downcast_ref::<String>().cloned().or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()));
            panic!("fuzz regression {name} failed: {}", msg.unwrap_or_default());
        }
    }
}

/// A command line and a value cut anywhere give the same replies as when whole.
#[test]
fn partial_commands_answer_as_whole_ones() {
    let (_, stream) = fuzz_driver::split(include_bytes!("fuzz_regressions/seed_text_partial"));
    let whole = fuzz_driver::run_stream([0, 0], stream, true);
    assert_eq!(whole.output, b"STORED\r\nVALUE k 0 5\r\nhello\r\nEND\r\n");
    for c0 in 1..16u8 {
        for c1 in [0u8, 1, 77] {
            assert_eq!(fuzz_driver::run_stream([c0, c1], stream, true).output, whole.output, "chunking {c0} {c1}");
        }
    }
}

/// A value over DIRECT_MIN is read into its own buffer and stored intact, however it arrives.
#[test]
fn large_values_take_the_direct_path() {
    for file in
        [&include_bytes!("fuzz_regressions/seed_text_direct_value")[..], include_bytes!("fuzz_regressions/seed_binary_direct_value")]
    {
        let (_, stream) = fuzz_driver::split(file);
        let whole = fuzz_driver::run_stream([0, 0], stream, true);
        for c0 in [1u8, 3, 4, 5, 6, 12, 13] {
            let chunked = fuzz_driver::run_stream([c0, 5], stream, true);
            assert!(chunked.used_direct, "chunking {c0}: no direct buffer");
            assert_eq!(chunked.output, whole.output, "chunking {c0}");
            assert!(chunked.peak_held <= 17_100, "chunking {c0}: held {}", chunked.peak_held);
        }
    }
}

/// An oversized value is refused and discarded as it arrives, never buffered.
#[test]
fn oversized_values_are_swallowed() {
    let (_, stream) = fuzz_driver::split(include_bytes!("fuzz_regressions/seed_text_oversized"));
    for c0 in [0u8, 1, 4, 5] {
        let o = fuzz_driver::run_stream([c0, 0], stream, true);
        assert_eq!(o.output, b"SERVER_ERROR object too large for cache\r\n", "chunking {c0}");
        assert!(!o.used_direct);
        assert!(o.peak_held <= 3100, "chunking {c0}: held {}", o.peak_held);
    }
}

/// Found by the fuzzer (`meta_set_base64_key_returned_decoded`): `ms` with `b` (base64 key)
/// and `k` returned the decoded key raw, without `b`, so a key decoding to a space or a
/// newline broke the reply line. Like mg, md and ma, it returns the key as the client sent it.
#[test]
fn meta_set_returns_a_base64_key_encoded() {
    let o = fuzz_driver::run_stream([0, 0], b"ms IA== 2 b k\r\nhi\r\nms DQo= 1 b k c\r\nx\r\nmg DQo= b k v\r\n", true);
    assert_eq!(o.output, b"HD kIA== b\r\nHD kDQo= c3 b\r\nVA 1 kDQo= b\r\nx\r\n");
}
