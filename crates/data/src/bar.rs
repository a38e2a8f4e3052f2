//! The validated OHLCV bar: a bar that breaks the OHLC invariants cannot be constructed.

use serde::Serialize;

/// Why a set of OHLCV values is not a valid bar.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BarError {
    /// A price or the volume is NaN or infinite.
    #[error("{field} is not finite ({value})")]
    NonFinite {
        /// Which field (open, high, low, close, volume).
        field: &'static str,
        /// The offending value.
        value: f64,
    },
    /// A raw exchange price is zero or negative.
    #[error("{field} price {value} is not positive")]
    NonPositive {
        /// Which price field.
        field: &'static str,
        /// The offending value.
        value: f64,
    },
    /// The high is below the open or the close.
    #[error("high {high} is below max(open, close) = {max_oc}")]
    HighBelowBody {
        /// The bar's high.
        high: f64,
        /// max(open, close).
        max_oc: f64,
    },
    /// The low is above the open or the close.
    #[error("low {low} is above min(open, close) = {min_oc}")]
    LowAboveBody {
        /// The bar's low.
        low: f64,
        /// min(open, close).
        min_oc: f64,
    },
    /// The volume is negative.
    #[error("volume {0} is negative")]
    NegativeVolume(f64),
}

/// One OHLCV bar of one contract.
///
/// `ts` is the bar's start in nanoseconds since the Unix epoch (UTC); readers convert bar-end
/// stamps to bar-start so that every bar in the system means the same thing.
/// Invariants (checked by [`Bar::new`]): all fields finite, `low <= min(open, close)`,
/// `high >= max(open, close)`, `volume >= 0`. Positivity is not an invariant of `Bar`, because a
/// difference-adjusted continuous series may legitimately go below zero far back in history;
/// readers check positivity of raw exchange prices with [`Bar::new_raw`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Bar {
    ts: i64,
    open: f64,
    high: f64,
    low: f64,
    close: f64,
    volume: f64,
}

impl Bar {
    /// Builds a bar, checking the OHLC invariants.
    pub fn new(
        ts: i64,
        open: f64,
        high: f64,
        low: f64,
        close: f64,
        volume: f64,
    ) -> Result<Self, BarError> {
        for (field, value) in [
            ("open", open),
            ("high", high),
            ("low", low),
            ("close", close),
            ("volume", volume),
        ] {
            if !value.is_finite() {
                return Err(BarError::NonFinite { field, value });
            }
        }
        let max_oc = open.max(close);
        let min_oc = open.min(close);
        if high < max_oc {
            return Err(BarError::HighBelowBody { high, max_oc });
        }
        if low > min_oc {
            return Err(BarError::LowAboveBody { low, min_oc });
        }
        if volume < 0.0 {
            return Err(BarError::NegativeVolume(volume));
        }
        Ok(Self {
            ts,
            open,
            high,
            low,
            close,
            volume,
        })
    }

    /// Builds a bar from raw exchange prices: as [`Bar::new`], and every price must be positive.
    pub fn new_raw(
        ts: i64,
        open: f64,
        high: f64,
        low: f64,
        close: f64,
        volume: f64,
    ) -> Result<Self, BarError> {
        let bar = Self::new(ts, open, high, low, close, volume)?;
        for (field, value) in [
            ("open", open),
            ("high", high),
            ("low", low),
            ("close", close),
        ] {
            if value <= 0.0 {
                return Err(BarError::NonPositive { field, value });
            }
        }
        Ok(bar)
    }

    /// The same bar with every price shifted by `offset` (difference back-adjustment).
    pub fn shifted(&self, offset: f64) -> Self {
        Self {
            open: self.open + offset,
            high: self.high + offset,
            low: self.low + offset,
            close: self.close + offset,
            ..*self
        }
    }

    /// The same bar with every price multiplied by `factor > 0` (ratio back-adjustment).
    pub fn scaled(&self, factor: f64) -> Self {
        debug_assert!(factor > 0.0, "ratio adjustment needs a positive factor");
        Self {
            open: self.open * factor,
            high: self.high * factor,
            low: self.low * factor,
            close: self.close * factor,
            ..*self
        }
    }

    /// Bar start, nanoseconds since the Unix epoch (UTC).
    pub fn ts(&self) -> i64 {
        self.ts
    }
    /// Opening price.
    pub fn open(&self) -> f64 {
        self.open
    }
    /// Highest price.
    pub fn high(&self) -> f64 {
        self.high
    }
    /// Lowest price.
    pub fn low(&self) -> f64 {
        self.low
    }
    /// Closing price.
    pub fn close(&self) -> f64 {
        self.close
    }
    /// Traded volume in contracts.
    pub fn volume(&self) -> f64 {
        self.volume
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_each_broken_invariant() {
        assert!(Bar::new(0, 10.0, 11.0, 9.0, 10.5, 5.0).is_ok());
        assert!(matches!(
            Bar::new(0, 10.0, 10.2, 9.0, 10.5, 5.0),
            Err(BarError::HighBelowBody { .. })
        ));
        assert!(matches!(
            Bar::new(0, 10.0, 11.0, 10.1, 10.5, 5.0),
            Err(BarError::LowAboveBody { .. })
        ));
        assert!(matches!(
            Bar::new(0, f64::NAN, 11.0, 9.0, 10.5, 5.0),
            Err(BarError::NonFinite { field: "open", .. })
        ));
        assert!(matches!(
            Bar::new(0, 10.0, 11.0, 9.0, 10.5, -1.0),
            Err(BarError::NegativeVolume(_))
        ));
        assert!(matches!(
            Bar::new_raw(0, 0.0, 1.0, 0.0, 0.5, 1.0),
            Err(BarError::NonPositive { field: "open", .. })
        ));
        // A negative price is allowed for an adjusted series, not for raw input.
        assert!(Bar::new(0, -1.0, 0.0, -2.0, -0.5, 1.0).is_ok());
    }

    #[test]
    fn adjustments_keep_differences_or_ratios() {
        let b = Bar::new(7, 10.0, 12.0, 8.0, 11.0, 3.0).expect("valid");
        let s = b.shifted(-2.5);
        assert_eq!(
            (s.open(), s.high(), s.low(), s.close()),
            (7.5, 9.5, 5.5, 8.5)
        );
        assert_eq!((s.ts(), s.volume()), (7, 3.0));
        let r = b.scaled(0.5);
        assert_eq!(
            (r.open(), r.high(), r.low(), r.close()),
            (5.0, 6.0, 4.0, 5.5)
        );
    }
}
