//! `cargo xtask profile`: runs the profile configuration of the main job (ES on the bundled
//! data, 3/1/1-month windows, 5 epochs of 50 steps, batch 64), prints the median time of each
//! phase per epoch with a window's first epoch apart from the later ones, writes
//! target/profile.json, and with --compare shows the change against an earlier profile.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::Parser;
use foxhunt::args::TrainArgs;
use foxhunt_trainer::PhaseTimes;
use foxhunt_trainer::phase::PHASES;
use serde::{Deserialize, Serialize};

/// Median phase times (ms) of one group of epochs.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Group {
    epochs: usize,
    phases: Vec<(String, f64)>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Profile {
    date: String,
    device: String,
    args: Vec<String>,
    first_epoch: Group,
    later_epochs: Group,
}

#[derive(Parser)]
#[command(args_override_self = true)]
struct ProfileCli {
    #[command(flatten)]
    train: TrainArgs,
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn group(phases: &[&PhaseTimes]) -> Group {
    let mut out: Vec<(String, f64)> = PHASES
        .iter()
        .enumerate()
        .map(|(k, name)| {
            (
                (*name).to_owned(),
                median(phases.iter().map(|p| p.values()[k]).collect()),
            )
        })
        .collect();
    out.push((
        "total".into(),
        median(phases.iter().map(|p| p.total).collect()),
    ));
    Group {
        epochs: phases.len(),
        phases: out,
    }
}

/// The profile configuration as `foxhunt train` arguments (the program name first): ES on the
/// bundled data, 3/1/1-month windows stepped by 3 months, 5 epochs of 50 steps, batch 64, on
/// `device`, into `out_dir`, with `extra` flags laid over it.
pub fn profile_args(root: &Path, device: &str, out_dir: &Path, extra: &[String]) -> Vec<String> {
    let mut args: Vec<String> = [
        "profile",
        "--model",
        "dqn",
        "--symbol",
        "ES.FUT",
        "--epochs",
        "5",
        "--max-steps-per-epoch",
        "50",
        "--batch-size",
        "64",
        "--train-months",
        "3",
        "--val-months",
        "1",
        "--test-months",
        "1",
        "--step-months",
        "3",
        "--no-progress",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    args.extend([
        "--data-dir".into(),
        root.join("test_data/futures-baseline")
            .display()
            .to_string(),
        "--device".into(),
        device.to_owned(),
        "--out".into(),
        out_dir.display().to_string(),
    ]);
    args.extend(extra.iter().cloned());
    args
}

/// The profile configuration's options, parsed.
pub fn profile_train_args(args: &[String]) -> Result<TrainArgs> {
    Ok(ProfileCli::try_parse_from(args)
        .context("profile options")?
        .train)
}

pub fn run(root: &Path, device: &str, compare: Option<&Path>, extra: &[String]) -> Result<()> {
    let out_dir = foxhunt_fs::create_unique_dir(
        &root.join("target/profile"),
        &jiff::Timestamp::now()
            .strftime("run-%Y%m%d-%H%M%S")
            .to_string(),
    )?;
    let args = profile_args(root, device, &out_dir, extra);
    let parsed = profile_train_args(&args)?;
    let t_run = std::time::Instant::now();
    let report = parsed.run(&out_dir)?;
    let wall_s = t_run.elapsed().as_secs_f64();
    if report.phases.is_empty() {
        bail!("the profile run trained no epoch");
    }
    let first: Vec<&PhaseTimes> = report
        .phases
        .iter()
        .filter(|p| p.uploaded_bytes > 0)
        .collect();
    let later: Vec<&PhaseTimes> = report
        .phases
        .iter()
        .filter(|p| p.uploaded_bytes == 0)
        .collect();
    let profile = Profile {
        date: jiff::Timestamp::now().to_string(),
        device: report.device.clone(),
        args: args[1..].to_vec(),
        first_epoch: group(&first),
        later_epochs: group(&later),
    };
    let old: Option<Profile> = match compare {
        Some(p) => Some(
            serde_json::from_slice(
                &std::fs::read(p).with_context(|| format!("reading {}", p.display()))?,
            )
            .with_context(|| {
                format!(
                    "{} is not a profile written by cargo xtask profile",
                    p.display()
                )
            })?,
        ),
        None => None,
    };
    println!(
        "\nphase breakdown, median ms per epoch ({} device; {} first epochs of a window, {} later epochs)",
        profile.device, profile.first_epoch.epochs, profile.later_epochs.epochs
    );
    print!("{:<8} {:>12} {:>12}", "phase", "first epoch", "later");
    if old.is_some() {
        print!(" {:>12} {:>12} {:>8}", "was first", "was later", "later");
    }
    println!();
    for (k, (name, f)) in profile.first_epoch.phases.iter().enumerate() {
        let l = profile.later_epochs.phases[k].1;
        print!("{name:<8} {f:>12.4} {l:>12.4}");
        if let Some(o) = &old {
            let (of, ol) = (o.first_epoch.phases[k].1, o.later_epochs.phases[k].1);
            let change = if ol > 0.0 {
                format!("{:+.0}%", (l - ol) / ol * 100.0)
            } else {
                "-".into()
            };
            print!(" {of:>12.4} {ol:>12.4} {change:>8}");
        }
        println!();
    }
    if let Some(first) = report.phases.first() {
        println!(
            "\nfirst epoch of the run: device open {:.1} ms + epoch {:.1} ms (init {:.1}) = {:.1} ms",
            report.device_open_ms,
            first.total,
            first.init,
            report.device_open_ms + first.total
        );
    }
    population_line(&report, wall_s);
    let path: PathBuf = root.join("target/profile.json");
    foxhunt_fs::write_atomic(&path, &serde_json::to_vec_pretty(&profile)?)?;
    println!(
        "\nwrote {} (run directory {})",
        path.display(),
        out_dir.display()
    );
    Ok(())
}

/// For a population (or one agent): an epoch of all its members (their epochs summed per window and epoch,
/// median over the run), the whole run's wall time per window-epoch, and agent-steps per
/// second of wall time (an agent-step: one step of an agent's every environment).
fn population_line(report: &foxhunt_trainer::RunReport, wall_s: f64) {
    let agents = report
        .windows
        .iter()
        .find_map(|w| w.population.as_ref())
        .map_or(1, |p| p.members.len());
    let mut sums: std::collections::BTreeMap<(usize, usize), f64> = Default::default();
    let mut agent_steps = 0usize;
    for p in &report.phases {
        *sums.entry((p.window, p.epoch)).or_default() += p.total;
        agent_steps += p.steps;
    }
    let later: Vec<f64> = sums
        .iter()
        .filter(|((_, e), _)| *e > 0)
        .map(|(_, &t)| t)
        .collect();
    let train_s = report.train_ms / 1e3;
    println!(
        "\npopulation of {agents} agents: an epoch of every member (their epochs summed, median of \
         later epochs) {:.2} ms; windows' training and tests {train_s:.3} s wall = {:.2} ms per \
         window-epoch, {:.0} agent-steps/s (whole run with data load and device open {wall_s:.3} \
         s)",
        median(later),
        report.train_ms / sums.len().max(1) as f64,
        agent_steps as f64 / train_s
    );
}
