//! Fuzz target: arbitrary bytes as a DBN file (plain or zstd) must give bars or an error, never a panic.
#![no_main]

use foxhunt_data::read::load_bytes;
use foxhunt_data::{LoadOptions, SymbolSelector};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let sel = SymbolSelector::Parent("ES".into());
    let _ = load_bytes(std::path::Path::new("fuzz.dbn"), data, &sel, &LoadOptions::default());
});
