//! Time as memcached keeps it: seconds since the server started ("relative time"), and the
//! conversion of a client's exptime into it.
//!
//! An exptime of 0 never expires; up to 30 days it is a number of seconds from now; above
//! that it is an absolute Unix time; a negative one, or an absolute time before the server
//! started, is already past. Relative time starts at 2, so time 1 is always in the past.

use std::time::{SystemTime, UNIX_EPOCH};

/// The largest exptime taken as relative (memcached's REALTIME_MAXDELTA).
pub const MAX_RELATIVE: i64 = 60 * 60 * 24 * 30;

/// Relative time 1: a moment every item compares as expired against.
pub const PAST: u32 = 1;

#[derive(Clone, Copy, Debug)]
pub struct Clock {
    /// Unix time (s) of relative time 0.
    started_unix: i64,
    /// CLOCK_MONOTONIC_COARSE (s) at relative time 0.
    started_mono: i64,
}

fn monotonic_coarse() -> i64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime fills the timespec; CLOCK_MONOTONIC_COARSE is served by the vDSO.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    ts.tv_sec
}

fn unix_now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
}

impl Clock {
    pub fn start() -> Clock {
        Clock { started_unix: unix_now() - 2, started_mono: monotonic_coarse() - 2 }
    }

    /// Seconds since the start (at least 2).
    #[inline]
    pub fn now(&self) -> u32 {
        (monotonic_coarse() - self.started_mono) as u32
    }

    /// Seconds the server has run (`uptime`).
    pub fn uptime(&self) -> u32 {
        self.now()
    }

    /// The Unix time now, as the server sees it (`time`).
    pub fn unix(&self) -> i64 {
        self.started_unix + self.now() as i64
    }

    pub fn started_unix(&self) -> i64 {
        self.started_unix
    }

    /// A client's exptime as relative time: 0 = never.
    pub fn expiry(&self, exptime: i64) -> u32 {
        if exptime == 0 {
            return 0;
        }
        if exptime < 0 {
            return PAST;
        }
        if exptime > MAX_RELATIVE {
            if exptime <= self.started_unix {
                return PAST;
            }
            return (exptime - self.started_unix).min(u32::MAX as i64) as u32;
        }
        (exptime + self.now() as i64).min(u32::MAX as i64) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exptime_rules_follow_memcached() {
        let clock = Clock::start();
        let now = clock.now();
        assert!(now >= 2);
        assert_eq!(clock.expiry(0), 0);
        assert_eq!(clock.expiry(-1), PAST);
        assert_eq!(clock.expiry(10), now + 10);
        assert_eq!(clock.expiry(MAX_RELATIVE), now + MAX_RELATIVE as u32);
        // Above 30 days: an absolute time, before the start = past.
        assert_eq!(clock.expiry(MAX_RELATIVE + 1), PAST);
        let in_an_hour = clock.unix() + 3600;
        assert_eq!(clock.expiry(in_an_hour), now + 3600);
    }
}
