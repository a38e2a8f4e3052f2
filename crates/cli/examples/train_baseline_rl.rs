//! The main job as a library user writes it: `foxhunt train`'s options, the walk-forward DQN run
//! on the CPU or GPU, one `phase breakdown` line per epoch, and the summary beside the baselines.
//!
//! cargo run --release --example train_baseline_rl -p foxhunt -- --model dqn \
//!   --data-dir test_data/futures-baseline --symbol ES.FUT --epochs 5 --max-steps-per-epoch 50 \
//!   --batch-size 64 --train-months 3 --val-months 1 --test-months 1 --step-months 3

use clap::Parser;
use foxhunt::args::TrainArgs;

#[derive(Parser)]
#[command(about = "Walk-forward DQN baseline on futures minute bars")]
struct Cli {
    #[command(flatten)]
    train: TrainArgs,
}

fn main() -> anyhow::Result<()> {
    foxhunt::init_logging(true);
    let cli = Cli::parse();
    let out = cli.train.out_dir()?;
    let report = cli.train.run(&out)?;
    println!("{}", foxhunt_trainer::report::summary(&report));
    println!("run directory: {}", out.display());
    Ok(())
}
