//! foxhunt-trainer: the main job. Trains a DQN agent on each walk-forward window of a futures
//! series, keeps the epoch that scores best on validation, judges it once on the window's test
//! period beside the baselines, and reports the out-of-sample result over all windows, with a
//! phase breakdown (init, collect, train, sync, eval) of every epoch.
//!
//! [`run`] is the loop; [`TrainConfig`] its settings (TOML); [`report`] the run directory's
//! files, [`html`] its report.html and [`charts`] the pictures in it and in equity.png; [`phase`] the profiling; [`Shard`] which windows a process of a sharded run trains,
//! and [`aggregate`] the run's report from its windows' folders. A window's data lives in a foxhunt-memory arena built once per
//! window; epochs borrow it; an engine (host or device) collects and learns. The command line
//! that fills a [`Job`] lives in the `foxhunt` crate.

mod budget;
pub mod charts;
pub mod config;
mod engine;
mod error;
pub mod eval;
pub mod html;
pub mod phase;
pub mod population;
pub mod progress;
pub mod report;
mod run;
mod rundir;
pub mod shard;
mod stats;

pub use config::{DeviceChoice, StepLoop, TrainConfig};
#[cfg(feature = "cuda")]
pub use engine::device::{learn_rule, learner_buffers, net_shape};
pub use error::TrainError;
pub use phase::PhaseTimes;
pub use population::{Select, Sweep};
pub use report::RunReport;
pub use run::{Devices, Job, Resolved, RunOptions, aggregate, resolve_device, run, write_html};
pub use shard::Shard;
