//! How `peerwasm map` shows itself: results as JSON lines, a progress bar
//! on a terminal (a line every few seconds elsewhere), resubmissions, and
//! the summary at the end.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::client::map::{MapItem, MapObserver, Progress};

/// How often a line of progress is printed when stderr is not a terminal.
const PLAIN_EVERY: Duration = Duration::from_secs(5);
/// How often buffered results are flushed.
const FLUSH_EVERY: Duration = Duration::from_millis(200);
/// Resubmissions reported one by one; after that only counted.
const RETRIES_SHOWN: u32 = 10;

/// Writes results and shows progress on stderr.
pub struct MapPrinter {
    out: Box<dyn Write + Send>,
    bar: Option<ProgressBar>,
    last_plain: Instant,
    last_flush: Instant,
    flush_each: bool,
    retries_shown: u32,
}

impl MapPrinter {
    /// Results go to `out`; progress to stderr, as a bar if it is a terminal
    /// and `show` is set.
    pub fn new(out: Box<dyn Write + Send>, total: Option<u64>, show: bool) -> MapPrinter {
        let bar = (show && std::io::stderr().is_terminal()).then(|| {
            let bar = ProgressBar::with_draw_target(total, ProgressDrawTarget::stderr_with_hz(10));
            bar.set_style(
                ProgressStyle::with_template("{bar:30.cyan/blue} {pos}/{len} {msg}")
                    .expect("a valid template")
                    .progress_chars("█▉ "),
            );
            bar
        });
        MapPrinter {
            out,
            bar,
            last_plain: Instant::now(),
            last_flush: Instant::now(),
            flush_each: false,
            retries_shown: 0,
        }
    }

    /// Flushes each result as it is written (a results file that a
    /// crashed map can be resumed from), not every 200 ms.
    pub fn flushing_each(mut self) -> MapPrinter {
        self.flush_each = true;
        self
    }

    /// Flushes the results and clears the bar.
    pub fn finish(&mut self) -> std::io::Result<()> {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
        self.out.flush()
    }

    fn say(&self, line: &str) {
        match &self.bar {
            Some(bar) => bar.println(line),
            None => eprintln!("{line}"),
        }
    }
}

/// `12/200 · 0 failed · 1 retried · 85 jobs/s · ETA 2s · mem 7.4 MiB`
fn describe(p: &Progress, with_counts: bool) -> String {
    let mut parts = Vec::new();
    if with_counts {
        parts.push(match p.total {
            Some(t) => format!("{}/{t}", p.done),
            None => p.done.to_string(),
        });
    }
    parts.push(format!("{} failed", p.failed));
    parts.push(format!("{} retried", p.retried));
    parts.push(format!("{:.0} jobs/s", p.rate()));
    if let Some(eta) = p.eta {
        parts.push(format!(
            "ETA {}",
            humantime::format_duration(Duration::from_secs(eta.as_secs().max(1)))
        ));
    }
    parts.push(format!("mem {}", p.request));
    parts.join(" · ")
}

impl MapObserver for MapPrinter {
    fn result(&mut self, item: MapItem) -> anyhow::Result<()> {
        serde_json::to_writer(&mut self.out, &item.to_json())?;
        self.out.write_all(b"\n")?;
        if self.flush_each || self.last_flush.elapsed() >= FLUSH_EVERY {
            self.out.flush()?;
            self.last_flush = Instant::now();
        }
        Ok(())
    }

    fn progress(&mut self, p: &Progress) {
        match &self.bar {
            Some(bar) => {
                bar.set_position(p.done);
                bar.set_message(describe(p, false));
            }
            None if self.last_plain.elapsed() >= PLAIN_EVERY => {
                eprintln!("peerwasm map: {}", describe(p, true));
                self.last_plain = Instant::now();
            }
            None => {}
        }
    }

    fn retry(&mut self, index: usize, why: &str) {
        self.retries_shown += 1;
        if self.retries_shown <= RETRIES_SHOWN {
            self.say(&format!("peerwasm map: input {index} again: {why}"));
        } else if self.retries_shown == RETRIES_SHOWN + 1 {
            self.say("peerwasm map: further resubmissions are counted in the summary");
        }
    }
}
