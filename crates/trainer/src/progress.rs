//! Progress bars for windows and epochs on a terminal; nothing when output is not a terminal
//! (the log lines say the same). Log output goes through [`LogWriter`] so a line never tears a
//! bar.

use std::io::{IsTerminal, Write};
use std::sync::OnceLock;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

fn multi() -> &'static MultiProgress {
    static MP: OnceLock<MultiProgress> = OnceLock::new();
    MP.get_or_init(|| MultiProgress::with_draw_target(ProgressDrawTarget::stderr()))
}

/// Standard output that first lifts the progress bars off the terminal, for log subscribers.
pub struct LogWriter;

impl Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        multi().suspend(|| std::io::stdout().write(buf))
    }
    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stdout().flush()
    }
}

/// The run's bars: windows, and epochs of the current window.
pub(crate) struct Bars {
    windows: Option<ProgressBar>,
    epochs: Option<ProgressBar>,
}

impl Bars {
    /// Bars when `enabled` and stderr is a terminal; silent otherwise.
    pub fn new(enabled: bool, windows: usize, epochs: usize) -> Self {
        if !(enabled && std::io::stderr().is_terminal()) {
            return Self {
                windows: None,
                epochs: None,
            };
        }
        let style = |t: &str| {
            ProgressStyle::with_template(t).unwrap_or_else(|_| ProgressStyle::default_bar())
        };
        let w = multi().add(ProgressBar::new(windows as u64));
        w.set_style(style("windows {bar:30} {pos}/{len} {msg}"));
        let e = multi().add(ProgressBar::new(epochs as u64));
        e.set_style(style("epochs  {bar:30} {pos}/{len} {msg} [{elapsed}]"));
        Self {
            windows: Some(w),
            epochs: Some(e),
        }
    }
    pub fn window_started(&self, index: usize, from_epoch: usize) {
        if let Some(e) = &self.epochs {
            e.set_position(from_epoch as u64);
            e.set_message(format!("window {index}"));
        }
    }
    pub fn epoch_done(&self, val_pnl: f64) {
        if let Some(e) = &self.epochs {
            e.inc(1);
            e.set_message(format!("val pnl {val_pnl:.0}"));
        }
    }
    pub fn window_done(&self) {
        if let Some(w) = &self.windows {
            w.inc(1);
        }
    }
    pub fn finish(&self) {
        for b in [&self.windows, &self.epochs].into_iter().flatten() {
            b.finish_and_clear();
        }
    }
}
