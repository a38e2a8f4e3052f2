//! Databento Binary Encoding reader (OHLCV schemas), plain or zstd, through the `dbn` crate.

use std::collections::HashMap;
use std::path::Path;

use dbn::decode::{DbnMetadata, DecodeRecordRef, DynDecoder};
use dbn::{OhlcvMsg, SType, Schema, VersionUpgradePolicy};

use super::{Collector, Outcome};
use crate::bar::Bar;
use crate::error::{DataError, Location, Result};

/// DBN prices are fixed-point integers in units of 1e-9.
const PRICE_SCALE: f64 = 1e9;

const ZSTD_MAGIC: [u8; 4] = [0x28, 0xB5, 0x2F, 0xFD];

pub(super) fn read(
    path: &Path,
    bytes: &[u8],
    bar_seconds: i64,
    collector: &mut Collector<'_>,
) -> Result<Outcome> {
    if !bytes.starts_with(&ZSTD_MAGIC) {
        return decode(path, bytes, bytes.len() as u64, bar_seconds, collector);
    }
    if bytes.len() < (1 << 20) {
        let unzip =
            zstd::stream::read::Decoder::with_buffer(bytes).map_err(|e| zstd_error(path, &e))?;
        return decode(path, unzip, MAX_ZSTD_METADATA, bar_seconds, collector);
    }
    // Large zstd file: decompress on a second thread and decode records from a pipe, so the two
    // halves of the work overlap (decompression is about half of the time of a read).
    let (reader, mut writer) = std::io::pipe().map_err(|error| DataError::Io {
        path: path.to_path_buf(),
        error,
    })?;
    std::thread::scope(|scope| {
        let unzip = scope.spawn(move || zstd::stream::copy_decode(bytes, &mut writer));
        let decoded = decode(path, reader, MAX_ZSTD_METADATA, bar_seconds, collector);
        match unzip.join().expect("zstd thread does not panic") {
            // The decoder stopping early closes the pipe; its own error is the one to report.
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => decoded,
            // Otherwise a decode error caused by bad compression is better reported as such.
            Err(e) => Err(zstd_error(path, &e)),
            Ok(_) => decoded,
        }
    })
}

fn zstd_error(path: &Path, e: &std::io::Error) -> DataError {
    DataError::Format {
        path: path.to_path_buf(),
        location: Location::File,
        message: format!("bad zstd compression: {e}"),
    }
}

/// Checks the framing of an uncompressed DBN stream as it passes to the decoder: the magic, then
/// every record's length (at least a header, a multiple of 8 bytes: records are 8-byte
/// aligned). The `dbn` decoder trusts these lengths; a corrupt one makes it build misaligned
/// records (found by fuzzing). It also counts the bytes, so that a file cut inside a record can be
/// told from a complete one: the decoder ends quietly at a partial last record.
struct Framed<R> {
    inner: R,
    count: u64,
    head: [u8; 8],
    /// Stream offset of the next record's length byte, once the header has been read.
    next_record: Option<u64>,
    /// That record's length byte, when its rtype byte has not arrived yet.
    pending_len: Option<u8>,
    /// Largest believable metadata length: the file size for plain files.
    max_metadata: u64,
    /// Where a record's declared length broke the framing: the decoder reads ahead, so this
    /// error can surface while it is still reading the header, and must not be blamed on it.
    bad_record_at: Option<u64>,
}

/// Metadata of a compressed file larger than this is taken as corrupt rather than allocated.
const MAX_ZSTD_METADATA: u64 = 256 << 20;

/// rtypes of OHLCV records (1s, 1m, 1h, 1d, end-of-day, and the deprecated generic one).
const OHLCV_RTYPES: [u8; 6] = [0x11, 0x20, 0x21, 0x22, 0x23, 0x24];

impl<R: std::io::Read> std::io::Read for Framed<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let invalid = |m: String| std::io::Error::new(std::io::ErrorKind::InvalidData, m);
        let n = self.inner.read(buf)?;
        let start = self.count;
        let have = start.min(8) as usize;
        let take = (8 - have).min(n);
        self.head[have..have + take].copy_from_slice(&buf[..take]);
        self.count += n as u64;
        if self.next_record.is_none() && self.count >= 8 {
            if &self.head[..3] != b"DBN" {
                return Err(invalid(
                    "not a DBN stream (no DBN magic; legacy DBZ files are not read)".into(),
                ));
            }
            let metadata_len = u64::from(u32::from_le_bytes([
                self.head[4],
                self.head[5],
                self.head[6],
                self.head[7],
            ]));
            if metadata_len > self.max_metadata {
                return Err(invalid(format!(
                    "metadata length {metadata_len} is larger than the file can hold"
                )));
            }
            self.next_record = Some(8 + metadata_len);
        }
        // Each record needs its length byte and its rtype byte, which may arrive in two reads.
        while let Some(at) = self.next_record {
            let len_byte = match self.pending_len.take() {
                Some(b) => b,
                None if at < self.count => buf[(at - start) as usize],
                None => break,
            };
            if at + 1 >= self.count {
                self.pending_len = Some(len_byte);
                break;
            }
            let rtype = buf[(at + 1 - start) as usize];
            let len = u64::from(len_byte) * 4;
            if len < 16 || len % 8 != 0 {
                self.bad_record_at = Some(at);
                return Err(invalid(format!(
                    "record at byte {at} declares length {len}, not a whole number of 8-byte words"
                )));
            }
            if OHLCV_RTYPES.contains(&rtype) && len < std::mem::size_of::<OhlcvMsg>() as u64 {
                self.bad_record_at = Some(at);
                return Err(invalid(format!(
                    "OHLCV record at byte {at} declares length {len}, shorter than an OHLCV record"
                )));
            }
            self.next_record = Some(at + len);
        }
        Ok(n)
    }
}

/// Decodes an uncompressed DBN stream.
fn decode(
    path: &Path,
    input: impl std::io::Read,
    max_metadata: u64,
    bar_seconds: i64,
    collector: &mut Collector<'_>,
) -> Result<Outcome> {
    let file_error = |message: String| DataError::Format {
        path: path.to_path_buf(),
        location: Location::Header,
        message,
    };
    let mut framed = Framed {
        inner: input,
        count: 0,
        head: [0; 8],
        next_record: None,
        pending_len: None,
        max_metadata,
        bad_record_at: None,
    };
    let opened = DynDecoder::inferred_with_buffer(
        std::io::BufReader::with_capacity(1 << 16, &mut framed),
        // OHLCV records are laid out alike in every DBN version, so nothing needs upgrading;
        // the upgrade path also trusts record lengths of other rtypes, which a corrupt file breaks.
        VersionUpgradePolicy::AsIs,
    );
    let mut decoder = match opened {
        Ok(d) => d,
        Err(e) => {
            return Err(DataError::Format {
                path: path.to_path_buf(),
                location: match framed.bad_record_at {
                    Some(at) => Location::Byte(at),
                    None => Location::Header,
                },
                message: format!("not a readable DBN file: {e}"),
            });
        }
    };
    let metadata = decoder.metadata();
    let seconds = match metadata.schema {
        Some(Schema::Ohlcv1S) => 1,
        Some(Schema::Ohlcv1M) => 60,
        Some(Schema::Ohlcv1H) => 3_600,
        Some(Schema::Ohlcv1D | Schema::OhlcvEod) => 86_400,
        Some(other) => {
            return Ok(Outcome::Skipped(format!(
                "schema {other} holds no OHLCV bars; foxhunt reads ohlcv-1s, ohlcv-1m, ohlcv-1h and ohlcv-1d"
            )));
        }
        None => {
            return Err(file_error(
                "file mixes schemas; foxhunt reads one OHLCV schema per file".into(),
            ));
        }
    };
    if seconds != bar_seconds {
        // Bars of different lengths must never be merged into one series.
        return Ok(Outcome::Skipped(format!(
            "{seconds} s bars, not the {bar_seconds} s bars asked for (--bar-seconds)"
        )));
    }
    let symbols = instrument_symbols(metadata);
    let source = collector.source(path, None, true);
    let mut slot_of_id: HashMap<u32, Option<usize>> = HashMap::new();
    let mut n: u64 = 0;
    // Consecutive records are often of the same instrument: skip the map then.
    let mut last: (u32, Option<usize>) = (u32::MAX, None);
    let mut record_bytes: u64 = 0;
    let mut other_records: std::collections::BTreeMap<u8, u64> = Default::default();
    loop {
        let record = match decoder.decode_record_ref() {
            Ok(Some(r)) => r,
            Ok(None) => break,
            Err(e) => {
                return Err(collector.format_error(
                    source,
                    n + 1,
                    format!("cannot decode record (truncated or corrupt file?): {e}"),
                ));
            }
        };
        n += 1;
        record_bytes += record.header().record_size() as u64;
        // Other record types (status, symbol mappings) may be interleaved; they carry no bar,
        // and are counted by type for the load's notes rather than dropped silently.
        let Some(msg) = record.get::<OhlcvMsg>() else {
            *other_records.entry(record.header().rtype).or_insert(0u64) += 1;
            continue;
        };
        let id = msg.hd.instrument_id;
        let slot = match slot_of_id.get(&id) {
            _ if last.0 == id => last.1,
            Some(s) => *s,
            None => {
                let symbol = symbols.get(&id).cloned().unwrap_or_else(|| id.to_string());
                let s = collector.slot(&symbol);
                slot_of_id.insert(id, s);
                s
            }
        };
        last = (id, slot);
        let Some(slot) = slot else { continue };
        let ts = i64::try_from(msg.hd.ts_event).map_err(|_| {
            collector.format_error(
                source,
                n,
                format!("ts_event {} is out of range", msg.hd.ts_event),
            )
        })?;
        let px = |v: i64| {
            if v == dbn::UNDEF_PRICE {
                f64::NAN
            } else {
                v as f64 / PRICE_SCALE
            }
        };
        match Bar::new_raw(
            ts,
            px(msg.open),
            px(msg.high),
            px(msg.low),
            px(msg.close),
            msg.volume as f64,
        ) {
            Ok(bar) => collector.push(slot, source, n, bar)?,
            Err(problem) => {
                let symbol = collector.slots[slot].0.clone();
                return Err(collector.invalid_bar(source, n, &symbol, problem));
            }
        }
    }
    drop(decoder);
    let metadata_len = u64::from(u32::from_le_bytes([
        framed.head[4],
        framed.head[5],
        framed.head[6],
        framed.head[7],
    ]));
    let expected = 8 + metadata_len + record_bytes;
    if !other_records.is_empty() {
        let kinds: Vec<String> = other_records
            .iter()
            .map(|(&rtype, n)| match dbn::RType::try_from(rtype) {
                Ok(t) => format!("{n} {t} (rtype {rtype:#04x})"),
                Err(_) => format!("{n} of unknown rtype {rtype:#04x}"),
            })
            .collect();
        collector.note(
            path,
            format!("records without bars passed over: {}", kinds.join(", ")),
        );
    }
    if framed.count > expected {
        return Err(collector.format_error(
            source,
            n + 1,
            format!(
                "file ends inside this record ({} stray bytes): truncated file?",
                framed.count - expected
            ),
        ));
    }
    Ok(Outcome::Read)
}

/// Instrument id -> the symbol foxhunt shows. Raw-symbol files map ids back to the raw symbols;
/// parent-symbology files (`ES.FUT`) only know ids, so contracts become `ES.FUT#<id>`.
fn instrument_symbols(metadata: &dbn::Metadata) -> HashMap<u32, String> {
    let parent = metadata.stype_in == Some(SType::Parent);
    let mut map = HashMap::new();
    if metadata.stype_out != SType::InstrumentId {
        return map;
    }
    for mapping in &metadata.mappings {
        for interval in &mapping.intervals {
            if let Ok(id) = interval.symbol.parse::<u32>() {
                let label = if parent {
                    format!("{}#{id}", mapping.raw_symbol)
                } else {
                    mapping.raw_symbol.clone()
                };
                map.insert(id, label);
            }
        }
    }
    map
}
