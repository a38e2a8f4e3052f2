//! Encodes bars of several contracts as one Databento ohlcv-1m DBN file (zstd).

use anyhow::{Context, Result};
use dbn::encode::EncodeRecord;
use dbn::encode::dbn::Encoder;
use dbn::{MappingInterval, Metadata, OhlcvMsg, RecordHeader, SType, Schema, SymbolMapping};
use foxhunt_data::Bar;

/// One contract to write: its raw symbol, the instrument id we assign it, its bars.
pub struct ContractOut<'a> {
    pub symbol: &'a str,
    pub instrument_id: u32,
    pub bars: &'a [Bar],
}

fn fixed(price: f64) -> i64 {
    (price * 1e9).round() as i64
}

fn date_of(ts: i64) -> Result<time::Date> {
    Ok(time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ts))?.date())
}

/// Encodes the contracts' bars, interleaved in (time, instrument id) order as Databento
/// delivers them, into DBN bytes compressed with zstd.
pub fn encode(contracts: &[ContractOut<'_>]) -> Result<Vec<u8>> {
    let mut records: Vec<OhlcvMsg> = Vec::new();
    let mut mappings = Vec::new();
    let (mut first, mut last) = (i64::MAX, i64::MIN);
    for c in contracts {
        let (Some(a), Some(b)) = (c.bars.first(), c.bars.last()) else {
            continue;
        };
        first = first.min(a.ts());
        last = last.max(b.ts());
        mappings.push(SymbolMapping {
            raw_symbol: c.symbol.to_owned(),
            intervals: vec![MappingInterval {
                start_date: date_of(a.ts())?,
                end_date: date_of(b.ts())?.next_day().context("date overflow")?,
                symbol: c.instrument_id.to_string(),
            }],
        });
        for bar in c.bars {
            records.push(OhlcvMsg {
                hd: RecordHeader::new::<OhlcvMsg>(
                    dbn::rtype::OHLCV_1M,
                    dbn::Publisher::GlbxMdp3Glbx as u16,
                    c.instrument_id,
                    u64::try_from(bar.ts()).context("bar before 1970")?,
                ),
                open: fixed(bar.open()),
                high: fixed(bar.high()),
                low: fixed(bar.low()),
                close: fixed(bar.close()),
                volume: bar.volume().round() as u64,
            });
        }
    }
    anyhow::ensure!(!records.is_empty(), "no bars to write");
    records.sort_by_key(|r| (r.hd.ts_event, r.hd.instrument_id));
    mappings.sort_by(|a, b| a.raw_symbol.cmp(&b.raw_symbol));
    let metadata = Metadata::builder()
        .dataset("GLBX.MDP3".to_owned())
        .schema(Some(Schema::Ohlcv1M))
        .start(u64::try_from(first)?)
        .end(std::num::NonZeroU64::new(
            u64::try_from(last)? + 60_000_000_000,
        ))
        .stype_in(Some(SType::RawSymbol))
        .stype_out(SType::InstrumentId)
        .symbols(mappings.iter().map(|m| m.raw_symbol.clone()).collect())
        .mappings(mappings)
        .build();
    let mut out = Vec::new();
    {
        let mut encoder = Encoder::with_zstd(&mut out, &metadata)?;
        encoder.encode_records(&records)?;
    } // dropping the encoder finishes the zstd frame
    Ok(out)
}
