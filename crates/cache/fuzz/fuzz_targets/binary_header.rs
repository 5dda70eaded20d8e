//! Arbitrary 24+ bytes as a binary-protocol packet: `Header::parse` must read back the fields
//! at their offsets, and `binary::step` (fed the bytes with the request magic forced, so
//! every input reaches past the magic check) must never panic and must answer in whole,
//! well-framed response packets. Store commands whose value is present are completed.
#![no_main]

use std::sync::{Arc, OnceLock};

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use sprout_cache::binary::{self, Header, HEADER};
use sprout_cache::output::Output;
use sprout_cache::session::{complete_store, Env, Next};
use sprout_cache::shared::{Settings, Shared};
use sprout_cache::stats::{Counters, CoreStats, StatsRoot};
use sprout_runtime::{Ebb, EbbRef};

fn stats_ebb() -> EbbRef<CoreStats> {
    static EBB: OnceLock<EbbRef<CoreStats>> = OnceLock::new();
    *EBB.get_or_init(|| EbbRef::create(StatsRoot { cores: 1 }))
}

/// The replies, as bytes: `Output` sends only to a file descriptor (a socket), so it sends to
/// one end of a Unix socket pair and this reads the other.
fn replies(out: &mut Output) -> Vec<u8> {
    use std::io::Read;
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;
    thread_local! {
        static PAIR: (UnixStream, UnixStream) = {
            let (a, b) = UnixStream::pair().expect("socketpair");
            a.set_nonblocking(true).unwrap();
            b.set_nonblocking(true).unwrap();
            (a, b)
        };
    }
    PAIR.with(|(ours, peer)| {
        let mut v = Vec::new();
        let mut chunk = [0u8; 64 * 1024];
        loop {
            let done = out.flush(ours.as_raw_fd()).expect("send replies");
            loop {
                match (&*peer).read(&mut chunk) {
                    Ok(0) => break,
                    Ok(n) => v.extend_from_slice(&chunk[..n]),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) => panic!("read replies: {e}"),
                }
            }
            if done {
                return v;
            }
        }
    })
}

fn check_frames(mut rest: &[u8]) {
    while !rest.is_empty() {
        assert!(rest.len() >= HEADER, "truncated response header");
        assert_eq!(rest[0], binary::RESPONSE_MAGIC);
        let keylen = u16::from_be_bytes([rest[2], rest[3]]) as usize;
        let extlen = rest[4] as usize;
        let bodylen = u32::from_be_bytes([rest[8], rest[9], rest[10], rest[11]]) as usize;
        assert!(keylen + extlen <= bodylen);
        assert!(rest.len() >= HEADER + bodylen, "response shorter than its bodylen");
        rest = &rest[HEADER + bodylen..];
    }
}

fuzz_target!(|data: &[u8]| {
    if data.len() < HEADER {
        return;
    }
    let h = Header::parse(data);
    assert_eq!(h.opcode, data[1]);
    assert_eq!(h.keylen.to_be_bytes(), data[2..4]);
    assert_eq!(h.extlen, data[4]);
    assert_eq!(h.bodylen.to_be_bytes(), data[8..12]);
    assert_eq!(h.opaque.to_be_bytes(), data[12..16]);
    assert_eq!(h.cas.to_be_bytes(), data[16..24]);

    let shared = Shared::new(
        Settings { limit_bytes: 1 << 20, item_max: 64 << 10, cores: 1, ..Default::default() },
        stats_ebb(),
    );
    let stats = <CoreStats as Ebb>::create_rep(&Arc::new(StatsRoot { cores: 1 }), 0);
    let env = Env { shared: &shared, stats: &stats, fd: -1 };
    let mut out = Output::new();
    let mut input = BytesMut::from(data);
    input[0] = binary::REQUEST_MAGIC;
    // Several packets may follow each other; each must begin with the magic, as on the wire.
    for _ in 0..64 {
        let before = input.len();
        match binary::step(&mut input, &env, &mut out) {
            Next::Continue => assert!(input.len() < before, "a handled packet consumed nothing"),
            Next::NeedMore | Next::Close | Next::Quit => break,
            Next::Watch(_) => unreachable!("watch is a text command"),
            Next::Stats(request) => {
                assert!(matches!(request, sprout_cache::session::StatsRequest::Binary { .. }));
                binary::stats_reply(request.group(), 0, &Counters::default(), &env, &mut out);
            }
            Next::Swallow(n) => {
                let n = n.min(input.len());
                let _ = input.split_to(n);
            }
            Next::Data(op) => {
                assert_eq!(op.trailer, 0);
                if input.len() < op.len {
                    break;
                }
                let block = input.split_to(op.len);
                complete_store(op, block, &env, &mut out);
            }
        }
        if input.is_empty() {
            break;
        }
    }
    check_frames(&replies(&mut out));
    assert!(shared.store.used() <= shared.store.limit() + (64 << 10));
});
