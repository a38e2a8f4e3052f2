//! One continuous front-month series per root symbol: volume roll at session boundaries,
//! back-adjusted by difference (Panama), ratio, or not at all.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::bar::Bar;
use crate::error::{DataError, Result};
use crate::read::{ContractSeries, format_ts};
use crate::session::{SessionCalendar, day_to_date};
use crate::symbol::ContractCode;

/// How earlier contracts' prices are adjusted to line up with the latest contract, in the
/// continuous series a user looks at (`data inspect`, [`ContinuousSeries::adjusted`]). Results
/// never depend on it: features come from each session's raw prices, and PnL from
/// [`ContinuousSeries::traded_bars`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, serde::Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum Adjustment {
    /// Raw prices; the series jumps at each roll.
    None,
    /// Add the price gap at each roll to all earlier bars (Panama canal). Keeps price
    /// differences; prices far back may become negative.
    #[default]
    Difference,
    /// Multiply earlier bars by the price ratio at each roll. Keeps returns.
    Ratio,
}

/// One change of front contract.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Roll {
    /// The trading day the new contract is front from (YYYY-MM-DD).
    pub session: String,
    /// Row of the first bar of the new contract in the continuous series.
    pub row: usize,
    /// The contract rolled out of.
    pub from: String,
    /// The contract rolled into.
    pub to: String,
    /// Time of the prices compared (RFC 3339): the last bar both contracts traded before the
    /// roll, else the old contract's last close against the new contract's first open.
    pub reference_time: String,
    /// Old contract's price at the reference.
    pub from_price: f64,
    /// New contract's price at the reference.
    pub to_price: f64,
    /// Days of no data before the roll's session, when longer than [`BREAK_DAYS`]: the series
    /// is not back-adjusted across such a hole (its two sides are separate segments), since no
    /// contract was held through it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub break_days: Option<i32>,
}

/// A hole in the data longer than this many days, across which the front contract changes,
/// ends an adjustment segment instead of being adjusted across: longer than a front month's
/// life (a quarterly contract is front for about 91 days), so no position was rolled through
/// it.
pub const BREAK_DAYS: i32 = 120;

impl Roll {
    /// `to_price - from_price`, added to earlier bars by difference adjustment.
    pub fn difference(&self) -> f64 {
        self.to_price - self.from_price
    }
    /// `to_price / from_price`, multiplied into earlier bars by ratio adjustment.
    pub fn ratio(&self) -> f64 {
        self.to_price / self.from_price
    }
}

/// A gap inside a session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Gap {
    /// Row of the first bar after the gap.
    pub row: usize,
    /// Start of the bar before the gap (RFC 3339).
    pub from: String,
    /// Start of the bar after the gap (RFC 3339).
    pub to: String,
    /// Minutes between the two bar starts.
    pub minutes: i64,
}

/// A continuous series: one row per bar of whichever contract was front that session.
///
/// Rolls happen only at session boundaries, so within a session every row comes from one
/// contract and the raw prices of a session are those of a real traded contract.
#[derive(Debug, Clone, Serialize)]
pub struct ContinuousSeries {
    /// Root symbol (`ES`).
    pub root: String,
    /// The adjustment applied to `bars`.
    pub adjustment: Adjustment,
    /// Contracts in expiry order; `contract[i]` indexes this.
    pub contracts: Vec<String>,
    /// Unadjusted bars of the front contract, `[T]`.
    pub raw: Vec<Bar>,
    /// Adjustment per segment between rolls: (first row, offset or factor), in row order.
    /// Adjusted bars are computed from `raw` on demand rather than stored twice.
    pub segments: Vec<(usize, f64)>,
    /// Front contract per row, `[T]`.
    pub contract: Vec<u16>,
    /// Session index per row, `[T]`, starting at 0 and increasing by one per trading day present.
    pub session: Vec<u32>,
    /// Trading day (days since 1970-01-01) of each session index.
    pub session_days: Vec<i32>,
    /// Every roll, in time order.
    pub rolls: Vec<Roll>,
}

impl ContinuousSeries {
    /// Number of rows (bars).
    pub fn len(&self) -> usize {
        self.raw.len()
    }
    /// Whether the series has no bars.
    pub fn is_empty(&self) -> bool {
        self.raw.is_empty()
    }
    /// The bars PnL is booked on, whatever `adjustment` says: each contract's raw prices
    /// shifted by a constant, so every move within a contract is its raw move, and joined at
    /// each roll by the roll's price difference (so carrying a position through a roll books
    /// the old contract's moves up to the reference and the new one's after). Adjusted forward
    /// from the first contract, so a row's prices depend on no later data. A hole of
    /// [`BREAK_DAYS`] is joined the same way: no move is booked across it.
    pub fn traded_bars(&self) -> impl Iterator<Item = Bar> + '_ {
        let mut offsets = Vec::with_capacity(self.rolls.len() + 1);
        let mut offset = 0.0;
        offsets.push((0, offset));
        for roll in &self.rolls {
            offset -= roll.difference();
            offsets.push((roll.row, offset));
        }
        offsets
            .into_iter()
            .enumerate()
            .flat_map(move |(i, (start, by))| {
                let end = self.rolls.get(i).map_or(self.raw.len(), |r| r.row);
                self.raw[start..end].iter().map(move |&b| b.shifted(by))
            })
    }
    /// The back-adjusted bar of `row`.
    pub fn adjusted(&self, row: usize) -> Bar {
        let seg = self.segments.partition_point(|&(start, _)| start <= row) - 1;
        self.apply(self.raw[row], self.segments[seg].1)
    }
    /// Every back-adjusted bar in row order.
    pub fn adjusted_bars(&self) -> impl Iterator<Item = Bar> + '_ {
        self.segments
            .iter()
            .enumerate()
            .flat_map(move |(i, &(start, by))| {
                let end = self.segments.get(i + 1).map_or(self.raw.len(), |s| s.0);
                self.raw[start..end].iter().map(move |&b| self.apply(b, by))
            })
    }
    /// Gaps longer than `min_minutes` between consecutive bars of one session (halts, missing
    /// data); the gaps between sessions are expected and not listed.
    pub fn gaps(&self, min_minutes: i64) -> Vec<Gap> {
        let limit = min_minutes * 60_000_000_000;
        (1..self.len())
            .filter(|&t| self.session[t] == self.session[t - 1])
            .filter_map(|t| {
                let (a, b) = (self.raw[t - 1].ts(), self.raw[t].ts());
                (b - a > limit).then(|| Gap {
                    row: t,
                    from: format_ts(a),
                    to: format_ts(b),
                    minutes: (b - a) / 60_000_000_000,
                })
            })
            .collect()
    }

    fn apply(&self, bar: Bar, by: f64) -> Bar {
        match self.adjustment {
            Adjustment::None => bar,
            Adjustment::Difference => bar.shifted(by),
            Adjustment::Ratio => bar.scaled(by),
        }
    }
    /// Trading day of each row (days since 1970-01-01), `[T]`.
    pub fn row_days(&self) -> Vec<i32> {
        self.session
            .iter()
            .map(|&s| self.session_days[s as usize])
            .collect()
    }
}

/// Orders contracts by delivery month. One-digit years are placed in the first decade that
/// does not end before the contract's first bar.
fn expiry_key(series: &ContractSeries) -> (i32, u8, i64) {
    let first_ts = series.bars.first().map_or(i64::MAX, Bar::ts);
    let Some(code) = ContractCode::parse(&series.symbol) else {
        return (i32::MIN, 0, first_ts);
    };
    let first_year = day_to_date((first_ts.div_euclid(86_400_000_000_000)) as i32).year() as i32;
    let modulus = if code.year_digits >= 10 { 100 } else { 10 };
    let mut year = first_year - 1;
    while year.rem_euclid(modulus) != i32::from(code.year_digits) {
        year += 1;
    }
    (year, code.month, first_ts)
}

/// Builds the continuous front-month series of the given contracts.
///
/// Roll rule: at each session, the front contract is the one, among contracts with bars in that
/// session and not earlier in expiry than the current front, with the largest volume in the
/// previous session present in the data; ties keep the current front. The very first session has
/// no previous one, so its own volume decides (the only use of same-session information, and it
/// only picks where the series starts). Rolls never go back to an earlier expiry.
pub fn build_continuous(
    root: &str,
    contracts: &[ContractSeries],
    calendar: &SessionCalendar,
    adjustment: Adjustment,
) -> Result<ContinuousSeries> {
    let mut order: Vec<usize> = (0..contracts.len())
        .filter(|&i| !contracts[i].bars.is_empty())
        .collect();
    if order.is_empty() {
        return Err(DataError::InvalidOption(format!("no bars for {root}")));
    }
    if order.len() > usize::from(u16::MAX) {
        return Err(DataError::InvalidOption(format!(
            "{root}: more than 65535 contracts"
        )));
    }
    order.sort_by_key(|&i| expiry_key(&contracts[i]));
    // Per contract (in expiry order): trading day of each bar, and volume per day.
    let mut days: Vec<Vec<i32>> = Vec::with_capacity(order.len());
    let mut volume: BTreeMap<i32, Vec<f64>> = BTreeMap::new();
    for (k, &ci) in order.iter().enumerate() {
        let mut cursor = calendar.cursor();
        let d: Vec<i32> = contracts[ci]
            .bars
            .iter()
            .map(|b| cursor.locate(b.ts()).trading_day)
            .collect();
        // Bars are in time order, so a day's bars are one run: one map lookup per run.
        let bars = &contracts[ci].bars;
        let mut i = 0;
        while i < bars.len() {
            let day = d[i];
            let mut sum = 0.0;
            while i < bars.len() && d[i] == day {
                sum += bars[i].volume();
                i += 1;
            }
            volume.entry(day).or_insert_with(|| vec![0.0; order.len()])[k] += sum;
        }
        days.push(d);
    }
    let names: Vec<String> = order.iter().map(|&i| contracts[i].symbol.clone()).collect();
    let n_total: usize = days.iter().map(Vec::len).sum();
    let mut raw = Vec::with_capacity(n_total);
    let mut contract = Vec::with_capacity(n_total);
    let mut session = Vec::with_capacity(n_total);
    let mut session_days = Vec::with_capacity(volume.len());
    let mut rolls = Vec::new();
    let mut cursors = vec![0usize; order.len()];
    let mut front: Option<usize> = None;
    let mut previous: Option<&Vec<f64>> = None;
    for (&day, today) in &volume {
        // Advance every contract's cursor to this day's first bar.
        for (k, cur) in cursors.iter_mut().enumerate() {
            while *cur < days[k].len() && days[k][*cur] < day {
                *cur += 1;
            }
        }
        let present = |k: usize| cursors[k] < days[k].len() && days[k][cursors[k]] == day;
        let floor = front.unwrap_or(0);
        let decide = previous.unwrap_or(today);
        let mut pick: Option<usize> = None;
        for k in floor..order.len() {
            if present(k) && pick.is_none_or(|p| decide[k] > decide[p]) {
                pick = Some(k);
            }
        }
        // A present current front wins ties: only a strictly larger volume moves the roll.
        if let (Some(f), Some(p)) = (front, pick)
            && present(f)
            && decide[f] >= decide[p]
        {
            pick = Some(f);
        }
        let Some(k) = pick else {
            previous = Some(today);
            continue;
        };
        let row = raw.len();
        if let Some(old) = front.filter(|&f| f != k) {
            rolls.push(roll_between(
                &contracts[order[old]],
                &contracts[order[k]],
                &names,
                old,
                k,
                day,
                *session_days.last().expect("a front contract had a session"),
                row,
                &days,
            ));
        }
        front = Some(k);
        let s = u32::try_from(session_days.len()).expect("fewer than 4 billion sessions");
        session_days.push(day);
        let bars = &contracts[order[k]].bars;
        let mut i = cursors[k];
        while i < bars.len() && days[k][i] == day {
            raw.push(bars[i]);
            contract.push(k as u16);
            session.push(s);
            i += 1;
        }
        previous = Some(today);
    }
    let segments = segments(&rolls, adjustment);
    Ok(ContinuousSeries {
        root: root.to_owned(),
        adjustment,
        contracts: names,
        raw,
        segments,
        contract,
        session,
        session_days,
        rolls,
    })
}

#[allow(clippy::too_many_arguments)]
fn roll_between(
    old: &ContractSeries,
    new: &ContractSeries,
    names: &[String],
    old_k: usize,
    new_k: usize,
    day: i32,
    previous_day: i32,
    row: usize,
    days: &[Vec<i32>],
) -> Roll {
    // Last timestamp before the roll day at which both contracts have a bar.
    let old_end = days[old_k].partition_point(|&d| d < day);
    let new_end = days[new_k].partition_point(|&d| d < day);
    let (mut i, mut j) = (old_end, new_end);
    let mut common = None;
    while i > 0 && j > 0 {
        let (a, b) = (old.bars[i - 1].ts(), new.bars[j - 1].ts());
        if a == b {
            common = Some((i - 1, j - 1));
            break;
        } else if a > b {
            i -= 1;
        } else {
            j -= 1;
        }
    }
    let (ts, from_price, to_price) = match common {
        Some((i, j)) => (old.bars[i].ts(), old.bars[i].close(), new.bars[j].close()),
        None => {
            let last_old = old.bars[old_end.saturating_sub(1)];
            let first_new = new.bars[new_end.min(new.bars.len() - 1)];
            (first_new.ts(), last_old.close(), first_new.open())
        }
    };
    Roll {
        session: day_to_date(day).to_string(),
        row,
        from: names[old_k].clone(),
        to: names[new_k].clone(),
        reference_time: format_ts(ts),
        from_price,
        to_price,
        break_days: Some(day - previous_day).filter(|&d| d > BREAK_DAYS),
    }
}

/// The adjustment of each segment between rolls. Walking back from the latest roll, each
/// segment gets the accumulated adjustment of every roll after it, so the latest contract keeps
/// its real prices.
fn segments(rolls: &[Roll], adjustment: Adjustment) -> Vec<(usize, f64)> {
    let neutral = if adjustment == Adjustment::Ratio {
        1.0
    } else {
        0.0
    };
    let mut out = vec![(0, neutral)];
    out.extend(rolls.iter().map(|r| (r.row, neutral)));
    let mut acc = neutral;
    for (i, roll) in rolls.iter().enumerate().rev() {
        acc = match adjustment {
            Adjustment::None => neutral,
            // Across a hole in the data the earlier side lines up with itself only.
            _ if roll.break_days.is_some() => neutral,
            Adjustment::Difference => acc + roll.difference(),
            Adjustment::Ratio => acc * roll.ratio(),
        };
        out[i].1 = acc;
    }
    out
}
