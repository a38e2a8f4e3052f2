//! The memory a run's settings ask for, computed before anything is allocated, so that sizes
//! that cannot fit are refused with the arithmetic instead of aborting in an allocation.

use crate::TrainError;
use crate::config::TrainConfig;

/// Copies of the parameter vector a learning agent holds: online and target networks, Adam's
/// two moments, the gradients, the kept best epoch and the host evaluation network.
const PARAM_COPIES: f64 = 7.0;

/// Bytes a stored transition takes beside its observations (two vector headers, allocator
/// overhead, action, return, discount).
const TRANSITION_OVERHEAD: f64 = 96.0;

/// Bytes an environment takes beside its observations and the acting pass's activations (its
/// state, n-step queue, the step's transition).
const ENV_OVERHEAD: f64 = 160.0;

/// The run's largest allocations: (what, bytes), each an estimate from the settings alone.
pub(crate) fn estimate(cfg: &TrainConfig, feature_cols: usize) -> Vec<(String, f64)> {
    // f64 throughout: sizes a user can type overflow usize products, not f64 ones.
    let obs = cfg.env.lookback as f64 * feature_cols as f64 + 2.0;
    let actions = cfg.env.actions() as f64;
    let mut widths = vec![obs];
    widths.extend(cfg.dqn.hidden.iter().map(|&h| h as f64));
    let mut params = 0.0;
    for pair in widths.windows(2) {
        params += pair[0] * pair[1] + pair[1];
        if cfg.dqn.layer_norm {
            params += 2.0 * pair[1];
        }
    }
    let last = *widths.last().expect("the observation width");
    params += last * actions + actions;
    if cfg.dqn.dueling {
        params += last + 1.0;
    }
    let widest = widths.iter().copied().fold(actions, f64::max);
    let batch = cfg.dqn.batch_size as f64;
    let capacity = cfg.dqn.replay_capacity as f64;
    let envs = cfg.envs as f64;
    vec![
        (
            format!(
                "network: {params:.0} parameters x {PARAM_COPIES} copies x 4 bytes (observation \
                 {obs:.0} = lookback {} x {feature_cols} features + 2, hidden {:?})",
                cfg.env.lookback, cfg.dqn.hidden
            ),
            params * PARAM_COPIES * 4.0,
        ),
        (
            format!(
                "activations: batch {batch} x {} layers x widest {widest:.0} x 3 passes x 2 x 4 \
                 bytes",
                widths.len()
            ),
            batch * widths.len() as f64 * widest * 3.0 * 2.0 * 4.0,
        ),
        (
            format!(
                "replay: capacity {capacity} x (2 observations of {obs:.0} floats x 4 bytes + \
                 {TRANSITION_OVERHEAD} bytes) (replay_capacity)"
            ),
            capacity * (2.0 * obs * 4.0 + TRANSITION_OVERHEAD),
        ),
        (
            format!(
                "environments: {envs} x (5 observations of {obs:.0} floats + 2 activations of \
                 {widest:.0} x 4 bytes + {ENV_OVERHEAD} bytes) (envs)"
            ),
            envs * ((5.0 * obs + 2.0 * widest) * 4.0 + ENV_OVERHEAD),
        ),
    ]
}

/// Blocks of the one-launch epoch an agent may use (each with a slot of the gradient), an
/// upper bound for the estimate.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
const EPOCH_BLOCKS: f64 = 132.0;

/// What one device-engine agent holds on the GPU: (what, bytes). The replay ring stores a step
/// by index (bar, position, entry, action, reward, done), not its observations.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn device_estimate(
    cfg: &TrainConfig,
    feature_cols: usize,
    eval_bars: usize,
) -> Vec<(String, f64)> {
    let obs = cfg.env.lookback as f64 * feature_cols as f64 + 2.0;
    let host = estimate(cfg, feature_cols);
    let params = host[0].1 / (PARAM_COPIES * 4.0);
    let capacity = cfg.dqn.replay_capacity as f64;
    let envs = cfg.envs as f64;
    let batch = cfg.dqn.batch_size as f64;
    let eval_per_bar = foxhunt_memory::eval_bytes_per_bar(cfg.dqn.first_width());
    let slot = foxhunt_memory::gradient_slot_floats(params as usize) as f64;
    vec![
        (
            format!(
                "network: ({params:.0} parameters x {PARAM_COPIES} copies + up to \
                 {EPOCH_BLOCKS} gradient slots of {slot:.0} floats) x 4 bytes"
            ),
            (params * PARAM_COPIES + slot * EPOCH_BLOCKS) * 4.0,
        ),
        (
            format!("replay ring: capacity {capacity} x 24 bytes (replay_capacity)"),
            capacity * 24.0,
        ),
        (
            format!(
                "environments and batch: {envs} x ({obs:.0} floats + 32 bytes) + batch {batch} x \
                 (2 x {obs:.0} + 5) floats (envs, batch_size)"
            ),
            envs * (obs * 4.0 + 32.0) + batch * (2.0 * obs + 5.0) * 4.0,
        ),
        (
            format!(
                "greedy evaluation: {eval_bars} bars (the largest validation or test split) x \
                 {eval_per_bar} bytes"
            ),
            eval_bars as f64 * eval_per_bar as f64,
        ),
    ]
}

/// Refuses settings whose estimated memory, for `workers` workers that each hold `agents`
/// agents at once (a population's members on threads) with all of it each, exceeds
/// `available` bytes, listing the parts.
pub(crate) fn check(
    cfg: &TrainConfig,
    feature_cols: usize,
    workers: usize,
    agents: usize,
    available: Option<f64>,
) -> Result<(), TrainError> {
    check_parts(
        &estimate(cfg, feature_cols),
        "memory",
        workers,
        agents,
        available,
    )
}

/// [`check`] for the device: what [`device_estimate`] counts, for `agents` agents on one GPU
/// at once, against its free memory.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn check_device(
    cfg: &TrainConfig,
    feature_cols: usize,
    eval_bars: usize,
    agents: usize,
    free: f64,
) -> Result<(), TrainError> {
    check_parts(
        &device_estimate(cfg, feature_cols, eval_bars),
        "GPU memory",
        1,
        agents,
        Some(free),
    )
}

fn check_parts(
    parts: &[(String, f64)],
    memory: &str,
    workers: usize,
    agents: usize,
    available: Option<f64>,
) -> Result<(), TrainError> {
    let held = workers * agents;
    let total = parts.iter().map(|p| p.1).sum::<f64>() * held as f64;
    let Some(available) = available else {
        return Ok(());
    };
    if total <= available {
        return Ok(());
    }
    let lines: Vec<String> = parts
        .iter()
        .map(|(what, bytes)| format!("  {} for {what}", gib(*bytes)))
        .collect();
    Err(TrainError::Options(format!(
        "these settings need about {} of {memory}{}, but {} is available:\n{}\nreduce the sizes \
         named",
        gib(total),
        match (workers, agents) {
            (1, 1) => String::new(),
            (w, 1) => format!(" ({w} workers, each with its own)"),
            (w, a) => format!(
                " ({held} agents held at once: {w} worker(s) x {a} members of the population on \
                 threads, each with its own)"
            ),
        },
        gib(available),
        lines.join("\n")
    )))
}

/// Memory this process may still take, from the operating system (`MemAvailable` on Linux);
/// `None` where it cannot be read (the check is then skipped).
pub(crate) fn available_memory() -> Option<f64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024.0)
}

fn gib(bytes: f64) -> String {
    format!("{:.2} GiB", bytes / (1u64 << 30) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_that_cannot_fit_are_refused_with_the_arithmetic() {
        let cfg = TrainConfig::default();
        // The defaults fit in a few hundred MiB.
        let total: f64 = estimate(&cfg, 15).iter().map(|p| p.1).sum();
        assert!(total < 512.0 * 1024.0 * 1024.0, "{total}");
        check(&cfg, 15, 1, 1, Some(total)).expect("fits exactly");
        let e = check(&cfg, 15, 1, 1, Some(total - 1.0))
            .expect_err("one byte short")
            .to_string();
        assert!(e.contains("need about") && e.contains("replay"), "{e}");

        let mut big = TrainConfig::default();
        big.dqn.hidden = vec![100_000, 100_000];
        let e = check(&big, 15, 1, 1, Some(64e9))
            .expect_err("10^10 weights")
            .to_string();
        assert!(e.contains("10000") && e.contains("network"), "{e}");
        let mut big = TrainConfig::default();
        big.env.lookback = 1_000_000;
        assert!(check(&big, 15, 1, 1, Some(64e9)).is_err());
        let big = TrainConfig {
            envs: 100_000_000,
            ..TrainConfig::default()
        };
        let e = check(&big, 15, 1, 1, Some(64e9))
            .expect_err("envs")
            .to_string();
        assert!(e.contains("(envs)"), "{e}");
        // Three workers need three times the memory.
        let e = check(&cfg, 15, 3, 1, Some(2.0 * total))
            .expect_err("three workers")
            .to_string();
        assert!(e.contains("3 workers"), "{e}");
        // A population's members on threads each hold theirs: one agent fits, four do not.
        check(&cfg, 15, 1, 1, Some(3.0 * total)).expect("one agent fits");
        let e = check(&cfg, 15, 1, 4, Some(3.0 * total))
            .expect_err("four agents at once")
            .to_string();
        assert!(
            e.contains("4 agents held at once: 1 worker(s) x 4 members") && e.contains("replay"),
            "{e}"
        );
        // A population on one GPU: each member's device state, with the arithmetic.
        let parts = device_estimate(&cfg, 15, 30_000);
        let one: f64 = parts.iter().map(|p| p.1).sum();
        let part = |parts: &[(String, f64)], what: &str| {
            parts
                .iter()
                .find(|p| p.0.starts_with(what))
                .map(|p| p.1)
                .expect(what)
        };
        assert!(
            4.0 * part(&parts, "replay ring:") < part(&estimate(&cfg, 15), "replay:"),
            "the ring holds indices, not observations"
        );
        check_device(&cfg, 15, 30_000, 16, 16.0 * one).expect("sixteen fit exactly");
        // The evaluation of a year's split is counted too.
        let year: f64 = device_estimate(&cfg, 15, 350_000).iter().map(|p| p.1).sum();
        assert_eq!(
            year - one,
            320_000.0 * foxhunt_memory::eval_bytes_per_bar(cfg.dqn.first_width()) as f64
        );
        let e = check_device(&cfg, 15, 30_000, 16, 15.0 * one)
            .expect_err("sixteen do not fit in fifteen's memory")
            .to_string();
        assert!(
            e.contains("of GPU memory (16 agents held at once") && e.contains("replay ring"),
            "{e}"
        );
        // Where the available memory is unknown nothing is refused.
        check(&big, 15, 1, 1, None).expect("unknown");
    }
}
