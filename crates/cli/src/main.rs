//! The `foxhunt` binary: inspect futures data, backtest baseline strategies, train DQN agents.

mod backtest;
mod fetch;
mod inspect;
mod train;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "foxhunt",
    version,
    about = "Walk-forward DQN trading research on futures minute bars"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Train a DQN agent on each walk-forward window; report out-of-sample results beside the
    /// baselines and the phase breakdown of every epoch.
    Train(Box<foxhunt::args::TrainArgs>),
    /// Continue a stopped training run from its directory alone: the data, windows and
    /// settings it recorded (config.json).
    Resume(train::ResumeArgs),
    /// Print the summary of a finished training run (and, with --html, write its report.html).
    Report(train::ReportArgs),
    /// Run a baseline strategy over a date range and print its metrics.
    Backtest(backtest::BacktestArgs),
    /// Work with market data.
    Data {
        #[command(subcommand)]
        command: DataCommand,
    },
}

#[derive(Subcommand)]
enum DataCommand {
    /// Show what a data directory holds: contracts, rolls, gaps, sessions, walk-forward windows.
    Inspect(inspect::InspectArgs),
    /// Download minute bars from Databento (DATABENTO_API_KEY) as daily .dbn.zst files that
    /// --data-dir reads: the cost estimate first, resumable.
    Fetch(fetch::FetchArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    foxhunt::init_logging(matches!(
        cli.command,
        Command::Train(_) | Command::Resume(_)
    ));
    let result = match &cli.command {
        Command::Data {
            command: DataCommand::Inspect(args),
        } => inspect::run(args),
        Command::Data {
            command: DataCommand::Fetch(args),
        } => fetch::run(args),
        Command::Backtest(args) => backtest::run(args),
        Command::Train(args) => train::train(args),
        Command::Resume(args) => train::resume(args),
        Command::Report(args) => train::report(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One paragraph, the whole cause chain, no backtrace.
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
