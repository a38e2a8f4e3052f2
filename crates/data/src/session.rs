//! Exchange session calendar: which trading day a bar belongs to, so that nothing downstream
//! treats the overnight or weekend gap as one minute.

use jiff::Timestamp;
use jiff::civil::Date;
use jiff::tz::TimeZone;

const NS_PER_MIN: i64 = 60_000_000_000;
const NS_PER_DAY: i64 = 86_400_000_000_000;

/// A session calendar in the style of CME Globex: a trading day opens at `open_minute` local
/// time on the previous calendar day (17:00 Chicago time) and runs until the daily maintenance
/// break; the weekend gap runs from Friday's close to Sunday's open.
///
/// A bar at or after the open time belongs to the next calendar day's session; a session that
/// would fall on a Saturday or Sunday (Friday evening or Sunday evening bars) belongs to Monday.
/// Exchange holidays are not modelled: a holiday simply has no bars, and a shortened session is
/// still one session. The calendar is the same for CME equity, FX and energy, and COMEX metals.
#[derive(Debug, Clone)]
pub struct SessionCalendar {
    tz: TimeZone,
    open_minute: i64,
}

impl Default for SessionCalendar {
    fn default() -> Self {
        Self::cme()
    }
}

impl SessionCalendar {
    /// CME Globex: sessions open at 17:00 America/Chicago.
    pub fn cme() -> Self {
        Self::new(
            TimeZone::get("America/Chicago")
                .expect("America/Chicago is in the bundled tz database"),
            17 * 60,
        )
    }

    /// A calendar whose sessions open at `open_minute` minutes after local midnight in `tz`.
    pub fn new(tz: TimeZone, open_minute: u32) -> Self {
        assert!(
            open_minute < 24 * 60,
            "open_minute {open_minute} is not a time of day"
        );
        Self {
            tz,
            open_minute: i64::from(open_minute),
        }
    }

    /// A cursor that converts increasing timestamps quickly (it caches the UTC offset).
    pub fn cursor(&self) -> SessionCursor<'_> {
        SessionCursor {
            calendar: self,
            valid: (i64::MAX, i64::MIN),
            offset_ns: 0,
        }
    }

    /// The trading day of a bar starting at `ts` (nanoseconds UTC), as days since 1970-01-01.
    pub fn trading_day(&self, ts: i64) -> i32 {
        self.cursor().locate(ts).trading_day
    }
}

/// Where a timestamp falls in the calendar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionPoint {
    /// Trading day, days since 1970-01-01.
    pub trading_day: i32,
    /// Minutes since local midnight, 0..1440.
    pub minute_of_day: u16,
    /// Day of week of the trading day, Monday = 0 .. Friday = 4.
    pub weekday: u8,
}

/// Converts timestamps to session points, caching the time zone's offset for an hour at a time.
pub struct SessionCursor<'a> {
    calendar: &'a SessionCalendar,
    valid: (i64, i64),
    offset_ns: i64,
}

impl SessionCursor<'_> {
    /// The session point of `ts`.
    pub fn locate(&mut self, ts: i64) -> SessionPoint {
        if ts < self.valid.0 || ts >= self.valid.1 {
            // Offsets change only on whole hours in every zone an exchange uses, so the offset
            // at the start of the UTC hour holds for the whole hour.
            let hour = ts.div_euclid(3_600_000_000_000) * 3_600_000_000_000;
            let t = Timestamp::from_nanosecond(i128::from(hour)).unwrap_or(Timestamp::UNIX_EPOCH);
            self.offset_ns = i64::from(self.calendar.tz.to_offset(t).seconds()) * 1_000_000_000;
            self.valid = (hour, hour + 3_600_000_000_000);
        }
        let local = ts + self.offset_ns;
        let mut day = local.div_euclid(NS_PER_DAY);
        let minute = local.rem_euclid(NS_PER_DAY) / NS_PER_MIN;
        if minute >= self.calendar.open_minute {
            day += 1;
        }
        // 1970-01-01 was a Thursday (Monday = 0 -> Thursday = 3).
        let mut weekday = (day + 3).rem_euclid(7);
        if weekday >= 5 {
            day += 7 - weekday;
            weekday = 0;
        }
        SessionPoint {
            trading_day: i32::try_from(day).expect("timestamp within +-5.8 million years"),
            minute_of_day: minute as u16,
            weekday: weekday as u8,
        }
    }
}

/// Days since 1970-01-01 -> civil date.
pub fn day_to_date(day: i32) -> Date {
    Date::constant(1970, 1, 1)
        .checked_add(jiff::Span::new().days(i64::from(day)))
        .expect("trading day within jiff's range")
}

/// Civil date -> days since 1970-01-01.
pub fn date_to_day(date: Date) -> i32 {
    let span = date
        .since((jiff::Unit::Day, Date::constant(1970, 1, 1)))
        .expect("date within jiff's range");
    span.get_days()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ns(s: &str) -> i64 {
        i64::try_from(s.parse::<Timestamp>().expect("valid").as_nanosecond()).expect("fits")
    }

    #[test]
    fn cme_trading_days() {
        let cal = SessionCalendar::cme();
        let day = |s: &str| day_to_date(cal.trading_day(ns(s))).to_string();
        // Sunday 17:00 CDT (22:00 UTC) opens Monday's session.
        assert_eq!(day("2013-10-06T22:00:00Z"), "2013-10-07");
        // Monday 15:59 CDT is still Monday's session; 17:00 CDT opens Tuesday's.
        assert_eq!(day("2013-10-07T20:59:00Z"), "2013-10-07");
        assert_eq!(day("2013-10-07T22:00:00Z"), "2013-10-08");
        // Winter: 17:00 CST is 23:00 UTC.
        assert_eq!(day("2024-01-02T22:59:00Z"), "2024-01-02");
        assert_eq!(day("2024-01-02T23:00:00Z"), "2024-01-03");
        // A stray Friday-evening bar belongs to Monday, never to a Saturday session.
        assert_eq!(day("2024-01-05T23:30:00Z"), "2024-01-08");
        let p = cal.cursor().locate(ns("2013-10-07T14:30:00Z"));
        assert_eq!((p.minute_of_day, p.weekday), (9 * 60 + 30, 0));
        assert_eq!(date_to_day(day_to_date(16_000)), 16_000);
    }
}
