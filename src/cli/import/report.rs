//! Progress on stderr while an import runs: a bar on a terminal, otherwise a plain line at
//! most every [`PROGRESS_LINE_INTERVAL`], so logs stay short.

use std::io::{self, IsTerminal as _};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

use super::rate;

/// Plain progress lines (stderr not a terminal) come at most this often.
const PROGRESS_LINE_INTERVAL: Duration = Duration::from_secs(2);

/// Progress on stderr: a bar on a terminal, otherwise a line at most every 2 s.
pub(super) struct Reporter {
    bar_opt: Option<ProgressBar>,
    file_len: u64,
    start_offset: u64,
    started: Instant,
    last_line: Instant,
}

impl Reporter {
    pub(super) fn new(file_len: u64, start_offset: u64, started: Instant) -> Reporter {
        let bar_opt = io::stderr().is_terminal().then(|| {
            let style = ProgressStyle::with_template(
                "{elapsed_precise} [{wide_bar}] {bytes}/{total_bytes} {msg}, eta {eta}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
            let bar = ProgressBar::new(file_len)
                .with_style(style)
                .with_position(start_offset);
            bar.reset_eta();
            bar.enable_steady_tick(Duration::from_millis(200));
            bar
        });
        Reporter {
            bar_opt,
            file_len,
            start_offset,
            started,
            last_line: started,
        }
    }

    pub(super) fn update(&mut self, offset: u64, total_points: u64, run_points: u64) {
        let run_rate = rate(run_points, self.started.elapsed());
        if let Some(bar) = &self.bar_opt {
            bar.set_position(offset);
            bar.set_message(format!("{total_points} points, {run_rate:.0} points/s"));
            return;
        }
        if self.last_line.elapsed() >= PROGRESS_LINE_INTERVAL {
            self.last_line = Instant::now();
            eprintln!("{}", self.line(offset, total_points, run_points));
        }
    }

    pub(super) fn finish(&mut self, offset: u64, total_points: u64, run_points: u64) {
        match &self.bar_opt {
            Some(bar) => {
                bar.set_position(offset);
                bar.finish_and_clear();
            }
            None => eprintln!("{}", self.line(offset, total_points, run_points)),
        }
    }

    /// `import: 1200000 points (35%), 250000 points/s, eta 12s`
    fn line(&self, offset: u64, total_points: u64, run_points: u64) -> String {
        let elapsed = self.started.elapsed();
        let percent = (offset.saturating_mul(100))
            .checked_div(self.file_len)
            .unwrap_or(100);
        let bytes_read = offset.saturating_sub(self.start_offset);
        let eta = if bytes_read == 0 {
            "?".to_owned()
        } else {
            let remaining = self.file_len.saturating_sub(offset) as f64;
            let seconds = (remaining * elapsed.as_secs_f64() / bytes_read as f64).round();
            humantime::format_duration(Duration::from_secs(seconds as u64)).to_string()
        };
        format!(
            "import: {total_points} points ({percent}%), {:.0} points/s, eta {eta}",
            rate(run_points, elapsed)
        )
    }

    /// Prints `message` on stderr without tearing the bar.
    pub(super) fn note(&self, message: &str) {
        match &self.bar_opt {
            Some(bar) => bar.suspend(|| eprintln!("{message}")),
            None => eprintln!("{message}"),
        }
    }
}

impl Drop for Reporter {
    /// A failed import leaves its bar on screen, so the error below it has context.
    fn drop(&mut self) {
        if let Some(bar) = &self.bar_opt
            && !bar.is_finished()
        {
            bar.abandon();
        }
    }
}
