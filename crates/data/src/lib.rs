//! foxhunt-data: futures bars from exchange files to the feature matrix and walk-forward windows.
//!
//! The way through: [`read::load_path`] reads DBN/CSV/Lean files into validated bars per contract;
//! [`continuous::build_continuous`] rolls them into one front-month series with sessions marked;
//! [`features::compute_features`] turns that into a causal `T x F` f32 matrix; and
//! [`walkforward::plan`] cuts the rows into train/validation/test windows. [`Dataset::load`] does
//! all but the last in one call. This crate knows nothing of GPUs, burn or trading actions.

pub mod bar;
pub mod continuous;
pub mod error;
pub mod features;
pub mod read;
pub mod session;
pub mod symbol;
pub mod walkforward;

mod dataset;

pub use bar::{Bar, BarError};
pub use continuous::{Adjustment, ContinuousSeries, Roll};
pub use dataset::Dataset;
pub use error::{DataError, Location, Result};
pub use features::{FeatureConfig, FeatureMatrix, Normalizer};
pub use read::{BarTime, Format, LoadOptions, RawData};
pub use session::SessionCalendar;
pub use symbol::{ContractCode, SymbolSelector};
pub use walkforward::{Period, Plan, TrainMode, WalkForwardConfig, Window};
