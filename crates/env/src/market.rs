//! The bar data the environment reads: one window's rows of features and prices, shared by all
//! environments (structure of arrays).

use std::ops::Range;

use foxhunt_data::{FeatureMatrix, Normalizer};

/// Rows `[0, rows)` of market data, structure of arrays. Row 0 is the first row handed to the
/// environment (a window's first row): look-back is clamped there.
#[derive(Debug, Clone, PartialEq)]
pub struct MarketData {
    /// Number of rows.
    pub rows: usize,
    /// Features per row.
    pub cols: usize,
    /// Normalized features, row-major `[rows * cols]`.
    pub features: Vec<f32>,
    /// Adjusted open per row, `[rows]`.
    pub open: Vec<f64>,
    /// Adjusted close per row, `[rows]`.
    pub close: Vec<f64>,
    /// Session index per row, `[rows]`.
    pub session: Vec<u32>,
    /// Front contract per row, `[rows]`; a change between rows is a roll.
    pub contract: Vec<u16>,
    /// Bar start per row, ns UTC, `[rows]`.
    pub ts: Vec<i64>,
}

impl MarketData {
    /// Rows `range` of a feature matrix, features normalized by `normalizer` (fitted on a train
    /// split) or as they are.
    pub fn from_features(
        m: &FeatureMatrix,
        range: Range<usize>,
        normalizer: Option<&Normalizer>,
    ) -> Self {
        assert!(
            range.end <= m.rows,
            "row range {range:?} outside the matrix of {} rows",
            m.rows
        );
        let features = match normalizer {
            Some(n) => n.apply(m, range.clone()),
            None => m.values[range.start * m.cols..range.end * m.cols].to_vec(),
        };
        Self {
            rows: range.len(),
            cols: m.cols,
            features,
            open: m.open[range.clone()].to_vec(),
            close: m.close[range.clone()].to_vec(),
            session: m.session[range.clone()].to_vec(),
            contract: m.contract[range.clone()].to_vec(),
            ts: m.ts[range].to_vec(),
        }
    }

    /// Features of row t, `[cols]`.
    pub fn row(&self, t: usize) -> &[f32] {
        &self.features[t * self.cols..(t + 1) * self.cols]
    }
}
