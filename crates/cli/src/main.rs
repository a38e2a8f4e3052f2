//! The `foxhunt` binary: inspect futures data, backtest baseline strategies, train DQN agents.

mod args;
mod backtest;
mod inspect;

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
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(tracing::Level::WARN)
        .init();
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Data {
            command: DataCommand::Inspect(args),
        } => inspect::run(args),
        Command::Backtest(args) => backtest::run(args),
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
