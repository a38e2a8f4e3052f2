//! `foxhunt train`, `foxhunt resume` and `foxhunt report`: the walk-forward training run, its
//! continuation from its directory alone, its summary and its report.html.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::Args;
use foxhunt::args::{ExecArgs, Recorded, TrainArgs};
use foxhunt_trainer::report::{RunReport, read_json, summary};

/// Runs `foxhunt train` and prints the summary table.
pub fn train(args: &TrainArgs) -> Result<()> {
    let out = args.out_dir()?;
    let report = match args.run(&out) {
        Ok(r) => r,
        Err(e) => {
            if args.out.is_none() {
                remove_if_unused(&out);
            }
            return Err(e);
        }
    };
    finish(&report, &out, &args.exec)
}

/// `foxhunt resume` options.
#[derive(Debug, Args)]
pub struct ResumeArgs {
    /// The run directory of a stopped `foxhunt train` (its --out).
    pub run_dir: PathBuf,
    /// How the rest of the run is carried out.
    #[command(flatten)]
    pub exec: ExecArgs,
}

/// Runs `foxhunt resume`: the run in its directory continued with the data, windows and
/// settings it recorded, as `foxhunt train --resume` with its first options would.
pub fn resume(args: &ResumeArgs) -> Result<()> {
    let out = &args.run_dir;
    let report = Recorded::read(out)?.run(&args.exec.options(out, true)?)?;
    finish(&report, out, &args.exec)
}

/// Prints a finished run's summary table and where its files are; an error where no window
/// has an out-of-sample result.
fn finish(report: &RunReport, out: &Path, exec: &ExecArgs) -> Result<()> {
    println!("{}", summary(report));
    println!("run directory: {}", out.display());
    let page = out.join(foxhunt_trainer::html::FILE);
    if page.exists() {
        println!("report: {}", page.display());
    }
    if let Some(s) = exec.shard()? {
        println!(
            "shard {s}: the table above covers this shard's windows only; `foxhunt report {}` \
             gives the run's once every shard is done",
            out.display()
        );
    }
    // A shard that owns no window (more shards than windows) has nothing to report.
    if !report.windows.is_empty() && !report.has_result() {
        bail!(
            "every window failed ({} of {}): there is no out-of-sample result; the reasons are \
             in the summary above and in {}",
            report.windows.len(),
            report.windows.len(),
            out.join("summary.txt").display()
        );
    }
    Ok(())
}

/// Removes a run directory this process named and created that holds nothing but its lock
/// file: a run refused before it started leaves no empty folder behind.
fn remove_if_unused(out: &std::path::Path) {
    let only_lock = std::fs::read_dir(out).is_ok_and(|entries| {
        entries
            .filter_map(|e| e.ok())
            .all(|e| e.file_name() == foxhunt_fs::LOCK_FILE)
    });
    if only_lock {
        let _ = std::fs::remove_file(out.join(foxhunt_fs::LOCK_FILE));
        let _ = std::fs::remove_dir(out);
    }
}

/// `foxhunt report` options.
#[derive(Debug, Args)]
pub struct ReportArgs {
    /// A run directory written by `foxhunt train`.
    pub run_dir: PathBuf,
    /// Also (re)write the run's report.html (the tearsheet `foxhunt train` writes at its end).
    #[arg(long)]
    pub html: bool,
}

/// Prints the summary table of a run. A run without its report yet (a sharded run whose last
/// shard has not finished it, an interrupted run) is aggregated from its windows' folders and
/// its report written; a window not finished yet is an error that lists the missing windows and
/// their shards. A report already written (by the run, or the shard that finished it) is read
/// as it is: it holds what only the training process knew (device, pool, open time).
pub fn report(args: &ReportArgs) -> Result<()> {
    let dir = &args.run_dir;
    let r: RunReport = if !dir.join("report.json").exists() && dir.join("plan.json").exists() {
        let config: serde_json::Value = read_json(&dir.join("config.json"))?;
        let capital = config["train"]["capital"]
            .as_f64()
            .with_context(|| format!("{}: no train.capital", dir.join("config.json").display()))?;
        foxhunt_trainer::aggregate(dir, capital)?
    } else {
        read_json(&dir.join("report.json"))?
    };
    print!("{}", summary(&r));
    if args.html {
        let page = foxhunt_trainer::write_html(dir)?;
        println!("wrote {}", page.display());
    }
    Ok(())
}
