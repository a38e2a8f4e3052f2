//! One call from a data directory to the continuous series and its feature matrix.

use std::path::Path;

use crate::continuous::{Adjustment, ContinuousSeries, build_continuous};
use crate::error::Result;
use crate::features::{FeatureConfig, FeatureMatrix, compute_features};
use crate::read::{LoadOptions, RawData, load_path};
use crate::session::SessionCalendar;
use crate::symbol::SymbolSelector;

/// A loaded data set: what was read, the continuous series, and its features.
#[derive(Debug, Clone)]
pub struct Dataset {
    /// Files and contracts read.
    pub raw: RawData,
    /// The continuous front-month series.
    pub series: ContinuousSeries,
    /// Features and price columns, one row per bar of `series`.
    pub features: FeatureMatrix,
}

impl Dataset {
    /// Reads `path`, selects `selector`, rolls and adjusts, and computes features.
    pub fn load(
        path: &Path,
        selector: &SymbolSelector,
        opts: &LoadOptions,
        calendar: &SessionCalendar,
        adjustment: Adjustment,
        features: &FeatureConfig,
    ) -> Result<Self> {
        let raw = load_path(path, selector, opts)?;
        let series = build_continuous(&selector.root(), &raw.contracts, calendar, adjustment)?;
        let features = compute_features(&series, calendar, features);
        Ok(Self {
            raw,
            series,
            features,
        })
    }
}
