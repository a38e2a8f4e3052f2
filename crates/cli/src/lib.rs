//! The foxhunt command line as a library: the options of `foxhunt train`, `foxhunt backtest` and
//! `foxhunt data inspect` ([`args`]), and the application logic that turns them into a run
//! (loading the data, planning the windows, running the trainer). The `foxhunt` binary, the
//! `train_baseline_rl` example and `cargo xtask profile` share them.

pub mod args;

/// How a command logs. Training logs its progress (one phase-breakdown line per epoch) on stdout
/// at INFO, through the progress bars' writer; the other commands print only warnings, on
/// stderr.
pub fn init_logging(training: bool) {
    if training {
        tracing_subscriber::fmt()
            .with_writer(|| foxhunt_trainer::progress::LogWriter)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
            .with_target(false)
            .with_max_level(tracing::Level::INFO)
            .init();
    } else {
        tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_max_level(tracing::Level::WARN)
            .init();
    }
}
