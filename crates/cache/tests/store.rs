//! The store's contract: memcached's storage semantics, honest memory accounting, eviction
//! in LRU order across shards, expiry and flush, and consistency under concurrent cores.

use bytes::Bytes;
use sprout_cache::store::{Deleted, DeltaError, Mode, Store, Stored, ITEM_OVERHEAD, SHARDS};

const NOW: u32 = 10;

fn set(store: &Store, key: &str, value: &str, cas: u64) -> Stored {
    store.store(Mode::Set, key.as_bytes(), Bytes::from(value.to_string()), 0, 0, cas, NOW)
}

fn value(store: &Store, key: &str) -> Option<String> {
    store.get(key.as_bytes(), NOW).map(|i| String::from_utf8(i.value.to_vec()).unwrap())
}

#[test]
fn storage_commands_follow_memcached() {
    let s = Store::new(1 << 20);
    assert_eq!(s.store(Mode::Add, b"k", Bytes::from("a"), 7, 0, 1, NOW), Stored::Stored(1));
    assert_eq!(s.store(Mode::Add, b"k", Bytes::from("b"), 0, 0, 2, NOW), Stored::NotStored);
    assert_eq!(s.store(Mode::Replace, b"missing", Bytes::from("b"), 0, 0, 3, NOW), Stored::NotStored);
    assert_eq!(s.store(Mode::Append(0), b"k", Bytes::from("z"), 99, 0, 4, NOW), Stored::Stored(4));
    assert_eq!(s.store(Mode::Prepend(0), b"k", Bytes::from("y"), 99, 0, 5, NOW), Stored::Stored(5));
    let item = s.get(b"k", NOW).unwrap();
    assert_eq!((&item.value[..], item.flags, item.cas), (&b"yaz"[..], 7, 5), "append keeps flags, takes the new cas");
    assert_eq!(s.store(Mode::Cas(4), b"k", Bytes::from("c"), 0, 0, 6, NOW), Stored::Exists);
    assert_eq!(s.store(Mode::Cas(5), b"k", Bytes::from("c"), 0, 0, 6, NOW), Stored::Stored(6));
    assert_eq!(s.store(Mode::Cas(1), b"nope", Bytes::from("c"), 0, 0, 7, NOW), Stored::NotFound);
    assert_eq!(s.store(Mode::Append(1), b"k", Bytes::from("x"), 0, 0, 8, NOW), Stored::Exists, "a binary append with a stale cas");
    assert_eq!(s.delete(b"k", 5, NOW), Deleted::Exists);
    assert_eq!(s.delete(b"k", 6, NOW), Deleted::Deleted);
    assert_eq!(s.delete(b"k", 0, NOW), Deleted::NotFound);
}

#[test]
fn memory_is_charged_per_item_and_returned() {
    let s = Store::new(1 << 20);
    set(&s, "a", "hello", 1);
    set(&s, "bb", &"x".repeat(1000), 2);
    assert_eq!(s.used(), (1 + 5 + ITEM_OVERHEAD) + (2 + 1000 + ITEM_OVERHEAD));
    set(&s, "a", "hi", 3);
    assert_eq!(s.used(), (1 + 2 + ITEM_OVERHEAD) + (2 + 1000 + ITEM_OVERHEAD), "an overwrite charges the new size only");
    s.delete(b"a", 0, NOW);
    s.delete(b"bb", 0, NOW);
    assert_eq!(s.used(), 0);
    let st = s.stats();
    assert_eq!((st.curr_items, st.total_items, st.bytes), (0, 3, 0));
}

#[test]
fn eviction_removes_least_recently_used_first_across_shards() {
    // Room for about 20 items of 1000 bytes.
    let per_item = 4 + 1000 + ITEM_OVERHEAD;
    let s = Store::new(per_item * 20);
    for i in 0..20 {
        set(&s, &format!("k{i:03}"), &"v".repeat(1000), i + 1);
    }
    assert_eq!(s.stats().evictions, 0);
    // Touch the oldest five: they become the most recent.
    for i in 0..5 {
        assert!(value(&s, &format!("k{i:03}")).is_some());
    }
    // Ten more items push out ten: k005..k014, whatever shards they are in.
    for i in 20..30 {
        set(&s, &format!("k{i:03}"), &"v".repeat(1000), i + 1);
    }
    assert!(s.used() <= s.limit());
    let st = s.stats();
    assert_eq!(st.evictions, 10);
    let alive: Vec<u64> = (0..30).filter(|i| value(&s, &format!("k{i:03}")).is_some()).collect();
    let expected: Vec<u64> = (0..5).chain(15..30).collect();
    assert_eq!(alive, expected);
}

#[test]
fn an_item_larger_than_memory_is_refused() {
    let s = Store::new(10_000);
    assert_eq!(set(&s, "big", &"x".repeat(20_000), 1), Stored::TooLarge);
    assert_eq!(s.used(), 0);
}

#[test]
fn expired_items_are_gone_and_reclaimed() {
    let s = Store::new(1 << 20);
    s.store(Mode::Set, b"short", Bytes::from("v"), 0, NOW + 5, 1, NOW);
    s.store(Mode::Set, b"past", Bytes::from("v"), 0, 1, 2, NOW);
    assert!(s.get(b"short", NOW + 4).is_some());
    assert!(s.get(b"short", NOW + 5).is_none(), "an item expires at its exptime");
    assert!(s.get(b"past", NOW).is_none());
    assert_eq!(s.stats().reclaimed, 2);
    assert_eq!(s.used(), 0);
    // touch moves the expiry.
    s.store(Mode::Set, b"t", Bytes::from("v"), 0, NOW + 1, 3, NOW);
    assert!(s.touch(b"t", NOW + 100, NOW).is_some());
    assert!(s.get(b"t", NOW + 50).is_some());
}

#[test]
fn flush_all_now_and_later() {
    let s = Store::new(1 << 20);
    set(&s, "a", "1", 1);
    s.flush(None);
    assert!(value(&s, "a").is_none());
    assert_eq!(s.used(), 0);
    set(&s, "b", "1", 2);
    s.flush(Some(NOW + 10));
    assert!(s.get(b"b", NOW + 9).is_some(), "a delayed flush waits for its time");
    assert!(s.get(b"b", NOW + 10).is_none(), "then items stored before it are gone");
    s.store(Mode::Set, b"c", Bytes::from("1"), 0, 0, 3, NOW + 11);
    assert!(s.get(b"c", NOW + 12).is_some(), "items stored after the flush time live");
}

#[test]
fn incr_and_decr_as_memcached() {
    let s = Store::new(1 << 20);
    set(&s, "n", "10", 1);
    assert_eq!(s.delta(b"n", false, 1, 0, 2, None, NOW), Ok((9, 2)));
    assert_eq!(value(&s, "n").unwrap(), "9 ", "a shorter number is padded in place");
    assert_eq!(s.delta(b"n", true, 991, 0, 3, None, NOW), Ok((1000, 3)));
    assert_eq!(value(&s, "n").unwrap(), "1000");
    assert_eq!(s.delta(b"n", false, 5000, 0, 4, None, NOW), Ok((0, 4)), "decr stops at zero");
    set(&s, "max", &u64::MAX.to_string(), 5);
    assert_eq!(s.delta(b"max", true, 2, 0, 6, None, NOW), Ok((1, 6)), "incr wraps at 2^64");
    set(&s, "word", "abc", 7);
    assert_eq!(s.delta(b"word", true, 1, 0, 8, None, NOW), Err(DeltaError::NonNumeric));
    assert_eq!(s.delta(b"none", true, 1, 0, 9, None, NOW), Err(DeltaError::NotFound));
    assert_eq!(s.delta(b"none", true, 1, 0, 10, Some((42, 0)), NOW), Ok((42, 10)), "binary incr creates with its initial value");
    assert_eq!(value(&s, "none").unwrap(), "42");
    assert_eq!(s.delta(b"none", true, 1, 3, 11, None, NOW), Err(DeltaError::Exists), "a stale cas");
}

#[test]
fn concurrent_cores_keep_the_accounting_exact() {
    let per_item = 8 + 200 + ITEM_OVERHEAD;
    let s = std::sync::Arc::new(Store::new(per_item * 500));
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let s = s.clone();
            std::thread::spawn(move || {
                for i in 0..20_000u64 {
                    let key = format!("k{:07}", (i * 7 + t * 13) % 3000);
                    match i % 4 {
                        0 => {
                            s.delete(key.as_bytes(), 0, NOW);
                        }
                        1 => {
                            s.get(key.as_bytes(), NOW);
                        }
                        _ => {
                            s.store(Mode::Set, key.as_bytes(), Bytes::from(vec![b'v'; 200]), 0, 0, t * 100_000 + i + 1, NOW);
                        }
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let st = s.stats();
    assert!(st.bytes as usize <= s.limit(), "over the limit: {} > {}", st.bytes, s.limit());
    assert_eq!(st.bytes as usize, st.curr_items as usize * per_item, "bytes must equal the charges of the items held");
    assert!(st.evictions > 0);
}

#[test]
fn peek_reads_without_changing_the_lru_order() {
    let per_item = 4 + 1000 + ITEM_OVERHEAD;
    let s = Store::new(per_item * 3);
    for i in 0..3 {
        set(&s, &format!("k{i:03}"), &"v".repeat(1000), i + 1);
    }
    assert!(s.peek(b"k000", NOW).is_some(), "peek reads the value");
    set(&s, "k003", &"v".repeat(1000), 4);
    assert!(value(&s, "k000").is_none(), "a peeked item stays least recently used");
    assert!(value(&s, "k001").is_some());
}

#[test]
fn the_crawler_frees_expired_items_nobody_asks_for() {
    let s = Store::new(1 << 20);
    for k in 0..200 {
        s.store(Mode::Set, format!("short{k}").as_bytes(), Bytes::from("x"), 0, NOW + 2, 1, NOW);
        s.store(Mode::Set, format!("long{k}").as_bytes(), Bytes::from("y"), 0, 0, 1, NOW);
    }
    let used = s.used();
    assert_eq!(s.stats().curr_items, 400);
    // Before they expire, nothing goes.
    let none: usize = (0..SHARDS).map(|shard| s.crawl(shard, 1000, NOW + 1)).sum();
    assert_eq!(none, 0);
    // A small budget takes several steps, each resuming where the last stopped.
    let mut gone = 0;
    for _ in 0..100 {
        gone += (0..SHARDS).map(|shard| s.crawl(shard, 3, NOW + 2)).sum::<usize>();
    }
    assert_eq!(gone, 200);
    let stats = s.stats();
    assert_eq!((stats.curr_items, stats.reclaimed, stats.expired_unfetched), (200, 200, 200));
    assert!(s.used() < used && value(&s, "long7").is_some() && value(&s, "short7").is_none());
}
