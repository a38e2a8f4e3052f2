//! Timestamp parsing for text formats: epoch integers of any unit, RFC 3339, and naive
//! date-times in a stated time zone.

use jiff::Timestamp;
use jiff::civil::DateTime;
use jiff::tz::TimeZone;

use crate::error::{DataError, Result, excerpt};

/// Looks up an IANA time zone name (`America/New_York`, `UTC`) in the bundled database.
pub fn parse_time_zone(name: &str) -> Result<TimeZone> {
    TimeZone::get(name).map_err(|e| {
        DataError::InvalidOption(format!(
            "unknown time zone {name:?} ({e}); use an IANA name such as America/Chicago or UTC"
        ))
    })
}

/// Formats nanoseconds since the epoch as RFC 3339 UTC, for messages and reports.
pub fn format_ts(ts: i64) -> String {
    match Timestamp::from_nanosecond(i128::from(ts)) {
        Ok(t) => t.to_string(),
        Err(_) => format!("{ts}ns"),
    }
}

/// Parses one timestamp field to nanoseconds since the epoch (UTC).
///
/// Integers are epoch seconds, milliseconds, microseconds or nanoseconds, told apart by
/// magnitude (a 1-minute bar series never spans the ambiguous ranges: seconds reach 1e11 only
/// in the year 5138). Text with an offset or `Z` is RFC 3339; text without one is a civil
/// date-time (`YYYY-MM-DD HH:MM[:SS[.f]]` or `YYYY-MM-DDTHH:MM:SS`, or a bare date) in `tz`.
pub(crate) fn parse_ts(field: &str, tz: &TimeZone) -> std::result::Result<i64, String> {
    let field = field.trim();
    if field.is_empty() {
        return Err("empty timestamp".into());
    }
    if field.bytes().all(|b| b.is_ascii_digit()) {
        let v: i64 = field
            .parse()
            .map_err(|_| format!("timestamp {} does not fit in 64 bits", excerpt(field)))?;
        let scale: i64 = if v < 100_000_000_000 {
            1_000_000_000
        } else if v < 100_000_000_000_000 {
            1_000_000
        } else if v < 100_000_000_000_000_000 {
            1_000
        } else {
            1
        };
        return v
            .checked_mul(scale)
            .ok_or_else(|| format!("timestamp {} is out of range", excerpt(field)));
    }
    if let Ok(t) = field.parse::<Timestamp>() {
        return to_ns(t);
    }
    let civil: DateTime = match field.parse::<DateTime>() {
        Ok(dt) => dt,
        Err(_) => match field.parse::<jiff::civil::Date>() {
            Ok(d) => d.to_datetime(jiff::civil::Time::midnight()),
            Err(_) => {
                return Err(format!(
                    "cannot read timestamp {}: expected epoch s/ms/us/ns, RFC 3339, or YYYY-MM-DD HH:MM:SS",
                    excerpt(field)
                ));
            }
        },
    };
    let t = tz
        .to_timestamp(civil)
        .map_err(|e| format!("timestamp {} in the time zone: {e}", excerpt(field)))?;
    to_ns(t)
}

fn to_ns(t: Timestamp) -> std::result::Result<i64, String> {
    i64::try_from(t.as_nanosecond()).map_err(|_| format!("timestamp {t} is out of range"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_every_supported_form() {
        let utc = TimeZone::UTC;
        let want = 1_609_160_400_000_000_000_i64; // 2020-12-28T13:00:00Z
        for s in [
            "1609160400",
            "1609160400000",
            "1609160400000000",
            "1609160400000000000",
            "2020-12-28T13:00:00Z",
            "2020-12-28T08:00:00-05:00",
            "2020-12-28 13:00:00",
            "2020-12-28T13:00",
        ] {
            assert_eq!(parse_ts(s, &utc), Ok(want), "{s}");
        }
        let ny = parse_time_zone("America/New_York").expect("bundled tzdb");
        assert_eq!(parse_ts("2020-12-28 08:00:00", &ny), Ok(want));
        // Summer time: New York is UTC-4 in July.
        assert_eq!(
            parse_ts("2024-07-01 20:00:00", &ny),
            parse_ts("2024-07-02T00:00:00Z", &utc)
        );
        assert!(parse_ts("yesterday", &utc).is_err());
        assert!(parse_ts("", &utc).is_err());
        assert!(parse_time_zone("Mars/Olympus").is_err());
    }
}
