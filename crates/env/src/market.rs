//! The bar data the environment reads: one window's rows of features and prices, shared by all
//! environments (structure of arrays), made only through a checked constructor.

use std::ops::Range;

use foxhunt_data::{FeatureMatrix, Normalizer};

use crate::EnvError;

/// Rows `[0, rows)` of market data, structure of arrays. Row 0 is the first row handed to the
/// environment (a window's first row): look-back is clamped there.
///
/// Invariants, checked by [`MarketData::new`] and relied on by every reader (the GPU kernels
/// index these arrays without bounds checks): `features` holds `rows * cols` values and every
/// other column `rows`; prices are finite; session indices never decrease; the front contract
/// changes only where the session does (rolls happen at session boundaries).
#[derive(Debug, Clone, PartialEq)]
pub struct MarketData {
    rows: usize,
    cols: usize,
    features: Vec<f32>,
    open: Vec<f64>,
    close: Vec<f64>,
    session: Vec<u32>,
    contract: Vec<u16>,
    ts: Vec<i64>,
}

/// The columns of a [`MarketData`], unchecked: what [`MarketData::new`] checks, and what
/// [`MarketData::into_columns`] hands back for reuse.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MarketColumns {
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
    /// Checks `c` and makes it market data; the error names the column and the row.
    pub fn new(c: MarketColumns) -> Result<Self, EnvError> {
        let rows = c.open.len();
        let bad = |m: String| Err(EnvError::Market(m));
        for (name, len) in [
            ("close", c.close.len()),
            ("session", c.session.len()),
            ("contract", c.contract.len()),
            ("ts", c.ts.len()),
        ] {
            if len != rows {
                return bad(format!("{name} has {len} rows, open has {rows}"));
            }
        }
        if c.features.len() != rows.saturating_mul(c.cols) {
            return bad(format!(
                "features hold {} values, not {rows} rows x {} columns",
                c.features.len(),
                c.cols
            ));
        }
        if let Some(t) = (0..rows).find(|&t| !(c.open[t].is_finite() && c.close[t].is_finite())) {
            return bad(format!(
                "row {t}: open {} / close {} not finite",
                c.open[t], c.close[t]
            ));
        }
        for t in 1..rows {
            if c.session[t] < c.session[t - 1] {
                return bad(format!(
                    "row {t}: session {} after session {}",
                    c.session[t],
                    c.session[t - 1]
                ));
            }
            if c.contract[t] != c.contract[t - 1] && c.session[t] == c.session[t - 1] {
                return bad(format!(
                    "row {t}: the front contract changes inside session {}",
                    c.session[t]
                ));
            }
        }
        Ok(Self {
            rows,
            cols: c.cols,
            features: c.features,
            open: c.open,
            close: c.close,
            session: c.session,
            contract: c.contract,
            ts: c.ts,
        })
    }

    /// Rows `range` of a feature matrix, features normalized by `normalizer` (fitted on a train
    /// split) or as they are.
    pub fn from_features(
        m: &FeatureMatrix,
        range: Range<usize>,
        normalizer: Option<&Normalizer>,
    ) -> Result<Self, EnvError> {
        if range.start > range.end || range.end > m.rows {
            return Err(EnvError::Market(format!(
                "rows {range:?} outside the feature matrix of {} rows",
                m.rows
            )));
        }
        let features = match normalizer {
            Some(n) => n.apply(m, range.clone()),
            None => m.values[range.start * m.cols..range.end * m.cols].to_vec(),
        };
        let col = |v: &[f64]| {
            v.get(range.clone())
                .map(<[f64]>::to_vec)
                .unwrap_or_default()
        };
        Self::new(MarketColumns {
            cols: m.cols,
            features,
            open: col(&m.open),
            close: col(&m.close),
            session: m
                .session
                .get(range.clone())
                .map(<[u32]>::to_vec)
                .unwrap_or_default(),
            contract: m
                .contract
                .get(range.clone())
                .map(<[u16]>::to_vec)
                .unwrap_or_default(),
            ts: m.ts.get(range).map(<[i64]>::to_vec).unwrap_or_default(),
        })
    }

    /// A copy of this data in `buffers` (their allocations reused where large enough): valid
    /// because this is.
    pub fn copy_into(&self, mut buffers: MarketColumns) -> Self {
        fn fill<T: Copy>(dst: &mut Vec<T>, src: &[T]) {
            dst.clear();
            dst.extend_from_slice(src);
        }
        fill(&mut buffers.features, &self.features);
        fill(&mut buffers.open, &self.open);
        fill(&mut buffers.close, &self.close);
        fill(&mut buffers.session, &self.session);
        fill(&mut buffers.contract, &self.contract);
        fill(&mut buffers.ts, &self.ts);
        Self {
            rows: self.rows,
            cols: self.cols,
            features: buffers.features,
            open: buffers.open,
            close: buffers.close,
            session: buffers.session,
            contract: buffers.contract,
            ts: buffers.ts,
        }
    }

    /// The columns, for reuse of their allocations.
    pub fn into_columns(self) -> MarketColumns {
        MarketColumns {
            cols: self.cols,
            features: self.features,
            open: self.open,
            close: self.close,
            session: self.session,
            contract: self.contract,
            ts: self.ts,
        }
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.rows
    }
    /// Features per row.
    pub fn cols(&self) -> usize {
        self.cols
    }
    /// Normalized features, row-major `[rows * cols]`.
    pub fn features(&self) -> &[f32] {
        &self.features
    }
    /// Adjusted open per row.
    pub fn open(&self) -> &[f64] {
        &self.open
    }
    /// Adjusted close per row.
    pub fn close(&self) -> &[f64] {
        &self.close
    }
    /// Session index per row.
    pub fn session(&self) -> &[u32] {
        &self.session
    }
    /// Front contract per row.
    pub fn contract(&self) -> &[u16] {
        &self.contract
    }
    /// Bar start per row, ns UTC.
    pub fn ts(&self) -> &[i64] {
        &self.ts
    }
    /// Features of row t, `[cols]`.
    pub fn row(&self, t: usize) -> &[f32] {
        &self.features[t * self.cols..(t + 1) * self.cols]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn columns() -> MarketColumns {
        MarketColumns {
            cols: 2,
            features: vec![0.0; 8],
            open: vec![1.0, 2.0, 3.0, 4.0],
            close: vec![1.5, 2.5, 3.5, 4.5],
            session: vec![0, 0, 1, 1],
            contract: vec![0, 0, 1, 1],
            ts: vec![0, 60, 120, 180],
        }
    }

    #[test]
    fn inconsistent_columns_are_refused_naming_the_problem() {
        assert_eq!(MarketData::new(columns()).expect("valid").rows(), 4);
        type Break = fn(&mut MarketColumns);
        let cases: [(Break, &str); 6] = [
            (|c| c.close.truncate(3), "close has 3 rows"),
            (|c| c.features.push(1.0), "features hold 9 values"),
            (|c| c.cols = 3, "not 4 rows x 3 columns"),
            (|c| c.open[2] = f64::NAN, "row 2: open NaN"),
            (|c| c.session[3] = 0, "row 3: session 0 after session 1"),
            (
                |c| c.contract[1] = 1,
                "row 1: the front contract changes inside session 0",
            ),
        ];
        for (break_it, want) in cases {
            let mut c = columns();
            break_it(&mut c);
            let e = MarketData::new(c).expect_err(want).to_string();
            assert!(e.contains(want), "{e} (wanted {want})");
        }
    }

    #[test]
    fn a_copy_into_reused_buffers_equals_the_original() {
        let m = MarketData::new(columns()).expect("valid");
        let mut big = MarketColumns {
            features: vec![7.0; 100],
            ..MarketColumns::default()
        };
        big.open.reserve(50);
        let copy = m.copy_into(big);
        assert_eq!(copy, m);
        assert!(
            copy.into_columns().features.capacity() >= 100,
            "allocation reused"
        );
    }
}
