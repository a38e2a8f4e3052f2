//! The foxhunt command line as a library: the options of `foxhunt train`, `foxhunt backtest` and
//! `foxhunt data inspect` ([`args`]), and the application logic that turns them into a run
//! (loading the data, planning the windows, running the trainer). The `foxhunt` binary, the
//! `train_baseline_rl` example and `cargo xtask profile` share them.

pub mod args;
