//! xtask: foxhunt's developer tasks (`cargo xtask --help`).

mod bench;
mod check_report;
mod dbn_out;
mod profile;
mod slurm;
mod synth;
mod testdata;
mod tools;

use std::path::PathBuf;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "foxhunt developer tasks")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Rebuild test_data/futures-baseline from the real Lean ES bars (--check: verify only).
    Testdata {
        /// Fail if the committed files differ from a fresh build instead of writing.
        #[arg(long)]
        check: bool,
    },
    /// Write a deterministic synthetic ES-like series (DBN ohlcv-1m, zstd).
    Synth {
        /// Output file.
        #[arg(long, default_value = "target/synth/es-synth.ohlcv-1m.dbn.zst")]
        out: PathBuf,
        /// First calendar day, YYYY-MM-DD.
        #[arg(long, default_value = "2019-01-02")]
        start: String,
        /// Number of years (1 to 9: one-digit contract years must not repeat).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=9))]
        years: u32,
        /// Random seed.
        #[arg(long, default_value_t = 7)]
        seed: u64,
        /// Write a directory of one file per UTC day (Databento's batch split) instead of one file.
        #[arg(long)]
        daily: bool,
    },
    /// Run the main job's profile configuration and print the median phase times per epoch.
    Profile {
        /// cpu, cuda or auto.
        #[arg(long, default_value = "cpu")]
        device: String,
        /// An earlier target/profile.json to compare with.
        #[arg(long)]
        compare: Option<PathBuf>,
        /// More `foxhunt train` flags (after `--`), laid over the profile configuration.
        #[arg(last = true)]
        train: Vec<String>,
    },
    /// Compile every kernel module with NVRTC for an architecture, without a GPU (needs libnvrtc
    /// and an xtask built with --features cuda): each module's CUBIN size and compile time, and
    /// ptxas's registers, stack, spills and static shared memory of every kernel and out-of-line
    /// function; NVRTC's log on an error.
    #[cfg(feature = "cuda")]
    Kernels {
        /// The architecture.
        #[arg(long, default_value = "sm_90")]
        arch: String,
    },
    /// The shipped sbatch script as a job array of 3 on a one-node Slurm cluster started here
    /// (needs slurmctld, slurmd, slurm-client and munge, as root); the aggregate must equal an
    /// unsharded run.
    SlurmTest,
    /// report.html of a small bundled-data run in headless Chromium (Debian's `chromium`): a
    /// screenshot in target/check-report/report.png, and every chart with data in the DOM.
    CheckReport,
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        what: Bench,
    },
}

#[derive(Subcommand)]
enum Bench {
    /// Load, validate, roll and compute features of synthetic ES years.
    Data {
        /// Years of synthetic data.
        #[arg(long, default_value_t = 1)]
        years: u32,
        /// Repetitions (the median is reported).
        #[arg(long, default_value_t = 15)]
        reps: usize,
    },
    /// Microseconds per greedy evaluation of the profile configuration's validation month:
    /// bar by bar (before), the host's rewrite, and the device's (cuda).
    Eval {
        /// cpu, or cuda (xtask built with --features cuda).
        #[arg(long, default_value = "cpu")]
        device: String,
        /// Repetitions (the median is reported).
        #[arg(long, default_value_t = 21)]
        reps: usize,
        /// Chunk sizes of the device's walk to time side by side (cuda).
        #[arg(long, value_delimiter = ',', default_value = "64")]
        chunks: Vec<usize>,
        /// Stitch teams to time side by side (cuda): `auto`, or BLOCKS:ROWS (blocks that
        /// follow a session together, bars each decides a round).
        #[arg(long, value_delimiter = ',', default_value = "auto")]
        stitch: Vec<String>,
        /// Most bars a chunk walk decides a round, side by side (cuda).
        #[arg(long, value_delimiter = ',', default_value = "8")]
        walk_rows: Vec<u32>,
        /// Threads of a chunk walk's block, side by side (cuda; 32 to 1,024, a multiple of
        /// 32).
        #[arg(long, value_delimiter = ',', default_value = "128")]
        walk_threads: Vec<u32>,
        /// How the walks get a position's first hidden layer, side by side (cuda): `reuse` (the
        /// flat pass's sums of the bar plus the state's two inputs) or `full` (every input
        /// summed again).
        #[arg(long, value_delimiter = ',', default_value = "reuse")]
        first_layer: Vec<String>,
        /// Warps booking a session, side by side (cuda): `auto` (the evaluator's choice) or 1
        /// to 8.
        #[arg(long, value_delimiter = ',', default_value = "auto")]
        book_warps: Vec<String>,
        /// Blocks summing a split's rows (the equity, the drawdown, the costs), one cluster,
        /// side by side (cuda): `auto` (the evaluator's choice) or 1 to 8.
        #[arg(long, value_delimiter = ',', default_value = "auto")]
        book_blocks: Vec<String>,
        /// Stitch teams as thread-block clusters where the device runs them so, side by side
        /// (cuda): `on` (the evaluator's default) or `off` (a barrier in global memory).
        #[arg(long, value_delimiter = ',', default_value = "on")]
        stitch_clusters: Vec<String>,
        /// Networks judged together, side by side with as many one after another (cuda; a
        /// population's validations), e.g. 1,4,16,64.
        #[arg(long, value_delimiter = ',')]
        members: Vec<usize>,
    },
    /// Microseconds per DQN train_step at batch 64 and 1024.
    Dqn {
        /// cpu, or cuda (xtask built with --features cuda).
        #[arg(long, default_value = "cpu")]
        device: String,
        /// Timed updates per batch size.
        #[arg(long, default_value_t = 200)]
        updates: usize,
        /// The one-launch kernel's batch rows a block (a list compares them side by side; the
        /// engine's choice is foxhunt-memory's `EpochKernel::BATCH_ROWS`).
        #[arg(long, value_delimiter = ',', default_value = "4")]
        batch_rows: Vec<usize>,
        /// Populations to time in one launch each (cuda), e.g. 1,4,16,64: agents of batch 64
        /// trained side by side (none by default).
        #[arg(long, value_delimiter = ',')]
        members: Vec<usize>,
    },
    /// Steps per second of the GPU environment (xtask built with --features cuda).
    #[cfg(feature = "cuda")]
    GpuEnv {
        /// Number of environments.
        #[arg(long, default_value_t = 65_536)]
        envs: usize,
        /// Steps per repetition.
        #[arg(long, default_value_t = 1000)]
        steps: usize,
        /// Repetitions (the median is reported).
        #[arg(long, default_value_t = 9)]
        reps: usize,
    },
    /// Steps per second of the CPU reference environment.
    Env {
        /// Number of environments.
        #[arg(long, default_value_t = 4096)]
        envs: usize,
        /// Steps per repetition.
        #[arg(long, default_value_t = 500)]
        steps: usize,
        /// Repetitions (the median is reported).
        #[arg(long, default_value_t = 9)]
        reps: usize,
    },
}

/// The workspace root: the nearest directory upward from the current one that holds
/// xtask/Cargo.toml (so a copied binary works in a copied tree), else where xtask was built.
fn workspace_root() -> PathBuf {
    std::env::current_dir()
        .ok()
        .and_then(|d| {
            d.ancestors()
                .find(|a| a.join("xtask/Cargo.toml").is_file())
                .map(PathBuf::from)
        })
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .parent()
                .expect("xtask is inside the workspace")
                .to_path_buf()
        })
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let root = workspace_root();
    tracing_subscriber::fmt()
        .with_ansi(false)
        .with_target(false)
        .with_max_level(tracing::Level::INFO)
        .init();
    match cli.command {
        Command::Profile {
            device,
            compare,
            train,
        } => profile::run(&root, &device, compare.as_deref(), &train),
        Command::Testdata { check } => testdata::run(&root, check),
        Command::SlurmTest => slurm::run(&root),
        Command::CheckReport => check_report::run(&root),
        #[cfg(feature = "cuda")]
        Command::Kernels { arch } => {
            for m in foxhunt_gpu::Module::ALL {
                let c = foxhunt_gpu::compile_check(m, &arch)?;
                println!(
                    "{}: {} bytes of CUBIN for {arch}, compiled in {:.1} s",
                    m.name(),
                    c.cubin_bytes,
                    c.seconds
                );
                for line in &c.resources {
                    println!("    {line}");
                }
            }
            Ok(())
        }
        Command::Synth {
            out,
            start,
            years,
            seed,
            daily,
        } => synth::run(&root.join(out), &start, years, seed, daily),
        Command::Bench {
            what: Bench::Data { years, reps },
        } => bench::data(&root, years, reps),
        Command::Bench {
            what: Bench::Env { envs, steps, reps },
        } => bench::env(&root, envs, steps, reps),
        Command::Bench {
            what:
                Bench::Dqn {
                    device,
                    updates,
                    batch_rows,
                    members,
                },
        } => bench::dqn(&root, &device, updates, &batch_rows, &members),
        Command::Bench {
            what:
                Bench::Eval {
                    device,
                    reps,
                    chunks,
                    stitch,
                    walk_rows,
                    walk_threads,
                    first_layer,
                    book_warps,
                    book_blocks,
                    stitch_clusters,
                    members,
                },
        } => bench::eval(
            &root,
            &device,
            reps,
            &bench::DeviceVariants {
                chunks,
                stitch,
                walk_rows,
                walk_threads,
                first_layer,
                book_warps,
                book_blocks,
                stitch_clusters,
                members,
            },
        ),
        #[cfg(feature = "cuda")]
        Command::Bench {
            what: Bench::GpuEnv { envs, steps, reps },
        } => bench::gpu_env(&root, envs, steps, reps),
    }
}
