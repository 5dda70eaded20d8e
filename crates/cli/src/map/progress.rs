//! What a map tells the person running it on stderr: the progress line, redrawn in place on a
//! terminal, and the line after the map.

use std::time::{Duration, Instant};

use super::run::Summary;

/// The line of stderr after a map.
pub fn summary_line(s: &Summary, seconds: f64) -> String {
    let mut line = format!(
        "{} items in {:.2} s ({:.0}/s): {} failed; {} requests, {} sandbox invocations",
        s.items,
        seconds,
        s.items as f64 / seconds.max(1e-9),
        s.failed,
        s.requests,
        s.chunks
    );
    if s.rerun > 0 {
        line += &format!(", {} items run again", s.rerun);
    }
    if s.resent > 0 {
        line += &format!(", {} requests sent again", s.resent);
    }
    line
}

/// A progress line on stderr, redrawn in place (only on a terminal).
pub struct Progress {
    total: usize,
    started: Instant,
    drawn: Option<Instant>,
    enabled: bool,
}

impl Progress {
    pub fn new(total: usize, enabled: bool) -> Progress {
        Progress { total, started: Instant::now(), drawn: None, enabled: enabled && total > 0 }
    }

    pub fn update(&mut self, done: usize, failed: usize) {
        if !self.enabled || self.drawn.is_some_and(|t| t.elapsed() < Duration::from_millis(100) && done < self.total) {
            return;
        }
        self.drawn = Some(Instant::now());
        let line = progress_line(done, self.total, failed, self.started.elapsed().as_secs_f64(), 30);
        eprint!("\r{line}\x1b[K");
    }

    pub fn finish(&mut self) {
        if self.enabled && self.drawn.is_some() {
            eprintln!();
        }
    }
}

/// `[##########----------]  1024/2048 items  3512/s  1 failed`.
pub fn progress_line(done: usize, total: usize, failed: usize, seconds: f64, width: usize) -> String {
    let filled = (done.min(total) * width).checked_div(total).unwrap_or(width);
    let rate = if seconds > 0.0 { done as f64 / seconds } else { 0.0 };
    let mut line = format!("[{}{}] {done}/{total} items  {rate:.0}/s", "#".repeat(filled), "-".repeat(width - filled));
    if failed > 0 {
        line += &format!("  {failed} failed");
    }
    line
}
