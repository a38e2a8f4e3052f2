//! `cargo xtask synth`: a deterministic generator of long ES-like 1-minute series for scale and
//! performance work (never for tests that real data can serve). GARCH(1,1) volatility
//! clustering, a U-shaped intraday volatility and volume profile, CME sessions (17:00-16:00
//! Chicago, weekends closed), sparse overnight minutes, and quarterly contracts (H, M, U, Z)
//! whose volume crosses over eight days before expiry, so the volume roll is exercised.

use std::path::Path;

use anyhow::{Context, Result};
use foxhunt_data::Bar;
use foxhunt_data::symbol::ContractCode;
use jiff::civil::{Date, Time};
use jiff::tz::TimeZone;
use rand_xoshiro::Xoshiro256PlusPlus;
use rand_xoshiro::rand_core::{Rng as _, SeedableRng};

use crate::dbn_out::{ContractOut, encode};
use foxhunt_fs::write_atomic;

const TICK: f64 = 0.25;
const SESSION_MINUTES: i64 = 23 * 60;

struct Rng(Xoshiro256PlusPlus);

impl Rng {
    fn uniform(&mut self) -> f64 {
        // 53 random bits -> [0, 1)
        (self.0.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn normal(&mut self) -> f64 {
        // Box-Muller; u1 in (0, 1] so the log is finite.
        let u1 = 1.0 - self.uniform();
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

fn round_tick(p: f64) -> f64 {
    (p / TICK).round() * TICK
}

/// Third Friday of a month: the quarterly equity-index expiry.
fn third_friday(year: i16, month: i8) -> Result<Date> {
    let first = Date::new(year, month, 1)?;
    let to_friday = (5 - first.weekday().to_monday_one_offset() + 7) % 7;
    Ok(first.checked_add(jiff::Span::new().days(i64::from(to_friday) + 14))?)
}

/// The quarterly contract (year, month) expiring next on or after `day`.
fn front_contract(day: Date) -> Result<(i16, i8, Date)> {
    let (mut y, mut m) = (day.year(), day.month());
    loop {
        if m % 3 == 0 {
            let expiry = third_friday(y, m)?;
            if expiry >= day {
                return Ok((y, m, expiry));
            }
        }
        m += 1;
        if m > 12 {
            m = 1;
            y += 1;
        }
    }
}

/// Intraday volatility and volume multiplier by minute since the 17:00 open: quiet overnight,
/// busy from the 08:30 cash open (minute 930) to the 15:15 close (minute 1335), with spikes.
fn intraday(minute: i64) -> (f64, f64) {
    match minute {
        930..=944 => (2.2, 6.0),
        945..=1319 => (1.3, 3.0),
        1320..=1335 => (1.8, 5.0),
        _ => (0.55, 0.35),
    }
}

/// Generates the sessions of trading days `[start, end)`, the first opening at `price`:
/// returns (symbol, bars) per contract.
pub fn generate(start: Date, end: Date, price: f64, seed: u64) -> Result<Vec<(String, Vec<Bar>)>> {
    let tz = TimeZone::get("America/Chicago")?;
    let mut rng = Rng(Xoshiro256PlusPlus::seed_from_u64(seed));
    let mut contracts: std::collections::BTreeMap<(i16, i8), Vec<Bar>> = Default::default();
    let (base_var, alpha, beta) = (0.00027f64.powi(2), 0.05, 0.93);
    let omega = base_var * (1.0 - alpha - beta);
    let (mut var, mut last_r, mut price, mut spread) = (base_var, 0.0f64, price, 8.0f64);
    let mut day = start;
    while day < end {
        let weekday = day.weekday().to_monday_one_offset();
        let holiday = (day.month(), day.day()) == (12, 25) || (day.month(), day.day()) == (1, 1);
        if weekday <= 5 && !holiday {
            let (fy, fm, expiry) = front_contract(day)?;
            let days_left = expiry.since((jiff::Unit::Day, day))?.get_days();
            let (ny, nm) = if fm == 12 { (fy + 1, 3) } else { (fy, fm + 3) };
            // Share of volume in the next contract: 0 until 14 days out, 0.5 at 8 days out.
            let next_share = if days_left > 14 {
                0.0
            } else {
                (1.0 / (1.0 + ((f64::from(days_left as i16) - 8.0) * 0.7).exp())).max(0.02)
            };
            let open =
                tz.to_timestamp(day.yesterday()?.to_datetime(Time::constant(17, 0, 0, 0)))?;
            let open_ns = i64::try_from(open.as_nanosecond())?;
            spread = (spread + 0.05 * rng.normal()).clamp(2.0, 20.0);
            for minute in 0..SESSION_MINUTES {
                let (vol_mult, volume_mult) = intraday(minute);
                if vol_mult < 1.0 && rng.uniform() < 0.12 {
                    continue; // a quiet overnight minute without trades
                }
                var = omega + alpha * last_r * last_r + beta * var;
                let r = var.sqrt() * vol_mult * rng.normal();
                last_r = r / vol_mult;
                let o = round_tick(price);
                let c = round_tick(o * r.exp()).max(TICK);
                let wick = |rng: &mut Rng| {
                    round_tick(o * var.sqrt() * vol_mult * rng.normal().abs() * 0.7)
                };
                let h = o.max(c) + wick(&mut rng);
                let l = (o.min(c) - wick(&mut rng)).max(TICK);
                price = c;
                let activity =
                    volume_mult * (1.0 + 8.0 * (r.abs() / var.sqrt().max(1e-12)).min(5.0) / 5.0);
                let total = (400.0 * activity * (0.5 + rng.uniform())).round();
                let ts = open_ns + minute * 60_000_000_000;
                let front_v = (total * (1.0 - next_share)).round();
                if front_v >= 1.0 || next_share < 0.98 {
                    contracts.entry((fy, fm)).or_default().push(Bar::new_raw(
                        ts,
                        o,
                        h,
                        l,
                        c,
                        front_v.max(1.0),
                    )?);
                }
                let next_v = (total * next_share).round();
                if next_share > 0.0 && next_v >= 1.0 {
                    let s = round_tick(spread);
                    contracts.entry((ny, nm)).or_default().push(Bar::new_raw(
                        ts,
                        o + s,
                        h + s,
                        l + s,
                        c + s,
                        next_v,
                    )?);
                }
            }
        }
        day = day.tomorrow()?;
    }
    Ok(contracts
        .into_iter()
        .map(|((y, m), bars)| (ContractCode::format("ES", i32::from(y), m as u8), bars))
        .collect())
}

/// Writes `years` of synthetic bars to `out`: one file, or with `daily` a directory of one file
/// per UTC day (as Databento's batch downloads are split).
pub fn run(out: &Path, start: &str, years: u32, seed: u64, daily: bool) -> Result<()> {
    let start: Date = start
        .parse()
        .with_context(|| format!("--start {start:?} is not YYYY-MM-DD"))?;
    let end = start.checked_add(jiff::Span::new().years(i64::from(years)))?;
    let contracts = generate(start, end, 2500.0, seed)?;
    let bars: usize = contracts.iter().map(|(_, b)| b.len()).sum();
    let ids: Vec<u32> = (0..contracts.len() as u32).map(|i| 1000 + i).collect();
    // The contracts' bars in [lo, hi), as one file's content.
    let slice = |lo: i64, hi: i64| -> Vec<ContractOut<'_>> {
        contracts
            .iter()
            .zip(&ids)
            .map(|((s, b), &id)| ContractOut {
                symbol: s,
                instrument_id: id,
                bars: &b[b.partition_point(|x| x.ts() < lo)..b.partition_point(|x| x.ts() < hi)],
            })
            .filter(|c| !c.bars.is_empty())
            .collect()
    };
    if !daily {
        let bytes = encode(&slice(i64::MIN, i64::MAX))?;
        write_atomic(out, &bytes)?;
        println!(
            "wrote {} ({} contracts, {bars} bars, {} bytes)",
            out.display(),
            contracts.len(),
            bytes.len()
        );
        return Ok(());
    }
    const DAY: i64 = 86_400_000_000_000;
    let first = contracts
        .iter()
        .filter_map(|(_, b)| b.first())
        .map(Bar::ts)
        .min()
        .context("no bars")?;
    let last = contracts
        .iter()
        .filter_map(|(_, b)| b.last())
        .map(Bar::ts)
        .max()
        .context("no bars")?;
    let mut files = 0;
    for day in first.div_euclid(DAY)..=last.div_euclid(DAY) {
        let (lo, hi) = (day * DAY, (day + 1) * DAY);
        let outs = slice(lo, hi);
        if outs.is_empty() {
            continue;
        }
        let date = jiff::Timestamp::from_nanosecond(i128::from(lo))?
            .strftime("%Y%m%d")
            .to_string();
        write_atomic(
            &out.join(format!("glbx-mdp3-{date}.ohlcv-1m.dbn.zst")),
            &encode(&outs)?,
        )?;
        files += 1;
    }
    println!(
        "wrote {files} daily files to {} ({} contracts, {bars} bars)",
        out.display(),
        contracts.len()
    );
    Ok(())
}
