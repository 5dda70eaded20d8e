//! The meta commands (mg, ms, md, ma, mn, me). Only `mn` is served so far; the others get
//! memcached's reply to a command it does not know, so clients fall back to the classic ones.

use crate::output::Output;
use crate::session::{Env, Next};
use crate::stats::CoreStats;

pub fn execute(name: u8, _tokens: &[&[u8]], env: &Env, out: &mut Output) -> Next {
    CoreStats::bump(&env.stats.cmd_meta);
    match name {
        b'n' => out.put(b"MN\r\n"),
        _ => out.put(b"ERROR\r\n"),
    }
    Next::Continue
}
