//! `cargo xtask testdata`: rebuilds test_data/futures-baseline (ES.FUT, DBN ohlcv-1m) from the
//! real Lean ES minute bars in test_data/lean-futures-minute, reproducibly; `--check` verifies
//! that the committed files are exactly what the builder produces.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use foxhunt_data::SymbolSelector;
use foxhunt_data::read::{Format, LoadOptions, load_path};
use foxhunt_data::symbol::ContractCode;
use sha2::{Digest, Sha256};

use crate::dbn_out::{ContractOut, encode, write_atomic};

const SOURCE: &str = "\
ES.FUT 1-minute bars in Databento Binary Encoding (ohlcv-1m, zstd), one file per Lean day file.

Built by `cargo xtask testdata` from the real exchange bars in ../lean-futures-minute/cme/minute/es
(QuantConnect Lean, Apache-2.0, data by AlgoSeek; see that folder's SOURCE.txt). Nothing is
synthetic except the instrument ids: Lean files carry no Databento ids, so each contract gets
id = its expiry as YYYYMM (ESZ3 -> 201312). Prices, volumes and timestamps (UTC, bar start) are
Lean's, converted to DBN fixed-point (1e-9). Several contracts trade each day, so loading
ES.FUT exercises the volume roll (ESZ3 -> ESH4 in December 2013; ESH0 in January 2020).
`cargo xtask testdata --check` rebuilds the files and fails if any byte differs.
";

fn lean_dir(root: &Path) -> PathBuf {
    root.join("test_data/lean-futures-minute/cme/minute/es")
}

fn build(root: &Path) -> Result<Vec<(String, Vec<u8>)>> {
    let dir = lean_dir(root);
    let mut zips: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "zip"))
        .collect();
    zips.sort();
    let opts = LoadOptions {
        format: Format::Lean,
        ..LoadOptions::default()
    };
    let mut files = Vec::new();
    for zip in zips {
        let raw = load_path(&zip, &SymbolSelector::Parent("ES".into()), &opts)?;
        let day = zip
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.split('_').next())
            .context("Lean file name without a date")?
            .to_owned();
        let contracts: Vec<ContractOut<'_>> = raw
            .contracts
            .iter()
            .map(|c| {
                let code = ContractCode::parse(&c.symbol).context("Lean contract symbol")?;
                let year = 2010 + i32::from(code.year_digits);
                let year = if year < 2013 { year + 10 } else { year };
                Ok(ContractOut {
                    symbol: &c.symbol,
                    instrument_id: u32::try_from(year)? * 100 + u32::from(code.month),
                    bars: &c.bars,
                })
            })
            .collect::<Result<_>>()?;
        files.push((
            format!("glbx-mdp3-{day}.ohlcv-1m.dbn.zst"),
            encode(&contracts)?,
        ));
    }
    Ok(files)
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

pub fn run(root: &Path, check: bool) -> Result<()> {
    let out_dir = root.join("test_data/futures-baseline");
    let files = build(root)?;
    let sums: String = files
        .iter()
        .map(|(n, b)| format!("{}  {n}\n", sha256_hex(b)))
        .collect();
    if check {
        let mut bad = Vec::new();
        for (name, bytes) in &files {
            match std::fs::read(out_dir.join(name)) {
                Ok(existing) if &existing == bytes => {}
                _ => bad.push(name.clone()),
            }
        }
        if std::fs::read_to_string(out_dir.join("SHA256SUMS"))
            .ok()
            .as_deref()
            != Some(sums.as_str())
        {
            bad.push("SHA256SUMS".into());
        }
        if !bad.is_empty() {
            bail!(
                "test_data/futures-baseline differs from a fresh build in: {}; run `cargo xtask testdata`",
                bad.join(", ")
            );
        }
        println!(
            "test_data/futures-baseline: {} files match a fresh build",
            files.len()
        );
        return Ok(());
    }
    for (name, bytes) in &files {
        write_atomic(&out_dir.join(name), bytes)?;
    }
    write_atomic(&out_dir.join("SHA256SUMS"), sums.as_bytes())?;
    write_atomic(&out_dir.join("SOURCE.txt"), SOURCE.as_bytes())?;
    println!("wrote {} files to {}", files.len(), out_dir.display());
    Ok(())
}
