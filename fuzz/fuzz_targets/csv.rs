//! Fuzz target: arbitrary bytes as an OHLCV CSV file must give bars or an error, never a panic.
#![no_main]

use foxhunt_data::read::load_bytes;
use foxhunt_data::{LoadOptions, SymbolSelector};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let sel = SymbolSelector::Parent("ES".into());
    let _ = load_bytes(std::path::Path::new("fuzz.csv"), data, &sel, &LoadOptions::default());
});
