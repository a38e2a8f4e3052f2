//! `foxhunt train` and `foxhunt report`: the walk-forward training run and its summary.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use foxhunt::args::TrainArgs;
use foxhunt_trainer::report::{RunReport, read_json, summary};

/// Runs `foxhunt train` and prints the summary table.
pub fn train(args: &TrainArgs) -> Result<()> {
    let out = args.out_dir()?;
    let report = args.run(&out)?;
    println!("{}", summary(&report));
    println!("run directory: {}", out.display());
    Ok(())
}

/// `foxhunt report` options.
#[derive(Debug, Args)]
pub struct ReportArgs {
    /// A run directory written by `foxhunt train`.
    pub run_dir: PathBuf,
}

/// Prints the summary table of a finished run.
pub fn report(args: &ReportArgs) -> Result<()> {
    let r: RunReport = read_json(&args.run_dir.join("report.json"))?;
    print!("{}", summary(&r));
    Ok(())
}
