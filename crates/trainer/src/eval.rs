//! Judging a network: the decisions of its greedy policy at every bar of a split (validation
//! every epoch, test once), made on the host here or on the device (foxhunt-memory's
//! `DeviceEvaluator`), and booked as foxhunt-env's backtest books a policy that decides bar by
//! bar, beside the baselines.
//!
//! Deciding is where the time goes (a network forward per bar). The greedy policy is sequential
//! in the position it holds, but a flat trader sees only the bar, and under flatten-at-close
//! every session starts flat. Here sessions are walked apart on threads: flat decisions are made
//! many bars a network pass and kept, and in a position several bars are decided a pass on the
//! guess that it is held, stopping at the first bar that trades. The device (kernels/eval.cu)
//! also walks chunks of a session in parallel from a flat start and stitches them, and books the
//! decisions itself; on the host the booking is the backtest's own code.

use std::ops::Range;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use foxhunt_dqn::model::HostQNetwork;
use foxhunt_env::backtest::Decision;
use foxhunt_env::exec::{next_entry, transition};
use foxhunt_env::vec_env::observe;
use foxhunt_env::{
    BacktestReport, Baseline, EnvConfig, Execution, MarketData, Policy, SessionRule, backtest,
};

use crate::{TrainConfig, TrainError};

/// The most bars decided per network pass while flat.
const ROWS: usize = 16;

/// The most bars decided per network pass in a position: a pass cut short by a trade wastes the
/// rest, and the passes cost about the same per row whatever their length (the dense layers go
/// a row at a time), so shorter passes than the flat ones waste less (the bundled bars, a
/// briefly trained agent: 17% fewer rows with 8 a pass and flat passes growing from 1).
const HELD_ROWS: usize = 8;

// `walk`'s pass buffers hold ROWS rows, whichever kind of pass.
const _: () = assert!(HELD_ROWS <= ROWS);

/// The greedy policy deciding bar by bar inside the backtest, one forward per bar: the
/// reference the evaluation is checked against (and timed beside).
pub struct BarByBar {
    net: HostQNetwork,
    env: EnvConfig,
    /// The decisions, in bar order.
    pub decided: Vec<i32>,
}

impl BarByBar {
    /// The greedy policy of `net` in environment `env`.
    pub fn new(net: HostQNetwork, env: &EnvConfig) -> Self {
        Self {
            net,
            env: env.clone(),
            decided: Vec::new(),
        }
    }
}

impl Policy for BarByBar {
    fn name(&self) -> String {
        "agent".into()
    }
    fn target(&mut self, d: &Decision<'_>) -> i32 {
        let t = self.env.target(self.net.greedy(d.obs) as u8);
        self.decided.push(t);
        t
    }
}

/// Decisions made beforehand, one per bar of a split, replayed for the backtest's booking.
struct Decided<'a> {
    targets: &'a [i8],
    start: usize,
}

impl Policy for Decided<'_> {
    fn name(&self) -> String {
        "agent".into()
    }
    fn target(&mut self, d: &Decision<'_>) -> i32 {
        i32::from(self.targets[d.t - self.start])
    }
    fn observes(&self) -> bool {
        false
    }
}

/// The backtest of decisions `targets` (one per bar of `split`, `targets[t - split.start]`): the
/// agent's report.
pub fn book(
    targets: &[i8],
    market: &MarketData,
    exec: &Execution,
    cfg: &TrainConfig,
    split: Range<usize>,
) -> Result<BacktestReport, TrainError> {
    book_in(targets, market, exec, &cfg.env, split, cfg.capital)
}

/// [`book`] in environment `env` with `capital`.
pub(crate) fn book_in(
    targets: &[i8],
    market: &MarketData,
    exec: &Execution,
    env: &EnvConfig,
    split: Range<usize>,
    capital: f64,
) -> Result<BacktestReport, TrainError> {
    let mut policy = Decided {
        targets,
        start: split.start,
    };
    Ok(backtest(market, exec, env, split, capital, &mut policy)?)
}

/// The rows walked apart: the split's sessions under flatten-at-close, else the whole split.
fn runs(market: &MarketData, env: &EnvConfig, split: &Range<usize>) -> Vec<Range<usize>> {
    if env.session_rule != SessionRule::FlattenAtClose {
        return vec![split.clone()];
    }
    let s = market.session();
    let mut out = Vec::new();
    let mut start = split.start;
    for t in split.start + 1..split.end {
        if s[t] != s[t - 1] {
            out.push(start..t);
            start = t;
        }
    }
    out.push(start..split.end);
    out
}

/// The decisions of `net`'s greedy policy at every bar of `split`, on the host: each the
/// decision the bar-by-bar backtest makes (the same observation, the same sums).
pub fn host_targets(
    net: &HostQNetwork,
    market: &MarketData,
    exec: &Execution,
    env: &EnvConfig,
    split: Range<usize>,
) -> Vec<i8> {
    let runs = runs(market, env, &split);
    let walked: Vec<OnceLock<Vec<i8>>> = runs.iter().map(|_| OnceLock::new()).collect();
    // The next run to walk: each walker takes one at a time, so that runs of unequal work even
    // out.
    let next = AtomicUsize::new(0);
    let walker = || {
        let mut net = net.clone();
        loop {
            let k = next.fetch_add(1, Ordering::Relaxed);
            let Some(run) = runs.get(k) else { break };
            walked[k]
                .set(walk(&mut net, market, exec, env, run.clone(), split.end))
                .expect("each run is taken once");
        }
    };
    // The calling thread walks too, beside the pool's threads. A parallel iterator would leave
    // it blocked while woken pool threads run: on a 2-core VM they were seen to take turns on
    // one core (the sessions walked one after another, no faster than one thread), where a
    // caller that keeps running leaves the woken thread the other core.
    let helpers = rayon::current_num_threads()
        .min(runs.len())
        .saturating_sub(1);
    rayon::in_place_scope(|s| {
        for _ in 0..helpers {
            s.spawn(|_| walker());
        }
        walker();
    });
    walked
        .into_iter()
        .flat_map(|w| w.into_inner().expect("every run is walked"))
        .collect()
}

/// A flat decision not made yet.
const UNDECIDED: i8 = i8::MIN;

/// The decisions at the bars of `run`, which starts flat (a session, or the whole split).
fn walk(
    net: &mut HostQNetwork,
    m: &MarketData,
    x: &Execution,
    env: &EnvConfig,
    run: Range<usize>,
    split_end: usize,
) -> Vec<i8> {
    let dim = env.obs_dim(m.cols());
    let mut out = vec![0i8; run.len()];
    // What a flat trader decides at each bar: made when the walk is first flat there, and kept
    // for every later time it is flat there.
    let mut flat = vec![UNDECIDED; run.len()];
    let mut obs = vec![0f32; ROWS * dim];
    let mut actions = [0usize; ROWS];
    let (mut t, mut position, mut entry) = (run.start, 0i32, 0.0f64);
    // Bars per pass in a position: doubled while the guess that it is held holds, back to one
    // after a trade, so that frequent trading wastes little. Flat passes likewise: from one bar
    // after a position, doubled while the walk stays flat, the rows past its next entry being
    // wasted unless it is flat there again.
    let (mut span, mut flat_span) = (1, 1);
    while t < run.end {
        if position == 0 {
            let k = t - run.start;
            if flat[k] == UNDECIDED {
                let rows = flat_span.min(run.end - t);
                flat_span = (2 * flat_span).min(ROWS);
                for (r, o) in obs.chunks_exact_mut(dim).take(rows).enumerate() {
                    observe(m, env, x.tick_size, t + r, 0, 0.0, o);
                }
                net.greedy_rows(&obs, rows, &mut actions);
                for (f, &a) in flat[k..k + rows].iter_mut().zip(&actions) {
                    *f = env.target(a as u8) as i8;
                }
            }
            let target = i32::from(flat[k]);
            out[k] = flat[k];
            let tr = transition(m, x, t, split_end, env.session_rule, 0, target);
            entry = next_entry(entry, 0, &tr);
            position = tr.position;
            if tr.terminal {
                break;
            }
            t = tr.next_t;
            span = 1;
            continue;
        }
        let rows = span.min(run.end - t);
        for (r, o) in obs.chunks_exact_mut(dim).take(rows).enumerate() {
            observe(m, env, x.tick_size, t + r, position, entry, o);
        }
        net.greedy_rows(&obs, rows, &mut actions);
        span = (2 * span).min(HELD_ROWS);
        flat_span = 1;
        for &a in &actions[..rows] {
            let target = env.target(a as u8);
            out[t - run.start] = target as i8;
            let tr = transition(m, x, t, split_end, env.session_rule, position, target);
            let held = position;
            entry = next_entry(entry, position, &tr);
            position = tr.position;
            if tr.terminal {
                // The run's last bar: under flatten-at-close a session's, else the split's.
                t = run.end;
                break;
            }
            t = tr.next_t;
            // A trade leaves the state the later rows were decided in.
            if target != held {
                span = 1;
                break;
            }
        }
    }
    out
}

/// The window's test: the agent's decisions `targets` and then the baselines over rows `split`,
/// in report order.
pub(crate) fn test_with_baselines(
    targets: &[i8],
    market: &MarketData,
    exec: &Execution,
    cfg: &TrainConfig,
    split: Range<usize>,
) -> Result<Vec<BacktestReport>, TrainError> {
    let mut runs = vec![book(targets, market, exec, cfg, split.clone())?];
    for b in Baseline::ALL {
        runs.push(b.run(market, exec, &cfg.env, split.clone(), cfg.capital, cfg.seed)?);
    }
    Ok(runs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use foxhunt_dqn::replay::{Replay, Transition};
    use foxhunt_dqn::{AgentConfig, Batch, CpuBackend, DqnAgent, DqnConfig};

    fn agent(cfg: AgentConfig, updates: usize) -> DqnAgent<CpuBackend> {
        let dev = Default::default();
        let mut a = DqnAgent::<CpuBackend>::new(cfg.clone(), &dev).expect("valid");
        let mut r = Replay::new(256, 3, None);
        for k in 0..256u32 {
            let x = |j: u32| ((k * 37 + j * 11) % 89) as f32 / 44.5 - 1.0;
            r.push(Transition {
                obs: (0..cfg.obs_dim as u32).map(x).collect(),
                action: (k % cfg.actions as u32) as u8,
                ret: x(5),
                next_obs: (0..cfg.obs_dim as u32).map(|j| x(j + 1)).collect(),
                discount: 0.9,
            });
        }
        for u in 0..updates {
            let b = r.sample(32, u as u64);
            a.learn(Batch::from_host(&b, cfg.obs_dim, &dev));
        }
        a
    }

    /// The rewrite decides what the bar-by-bar evaluation decides at every bar, and books the
    /// same metrics and equity, for random, trained and near-tie weights, under several
    /// environment settings, on the bundled real bars.
    #[test]
    fn the_rewrite_decides_and_books_exactly_as_bar_by_bar() {
        let rows = foxhunt_testkit::es_real_rows();
        let market = foxhunt_testkit::es_market(rows.clone());
        let exec = foxhunt_testkit::es_execution();
        let n = market.rows();
        let envs = [
            EnvConfig::default(),
            EnvConfig {
                lookback: 3,
                max_position: 2,
                ..EnvConfig::default()
            },
            EnvConfig {
                session_rule: SessionRule::Hold,
                ..EnvConfig::default()
            },
        ];
        let mut compared = 0;
        for env in envs {
            let cfg = TrainConfig {
                env: env.clone(),
                ..TrainConfig::default()
            };
            let shape = |dqn: DqnConfig| {
                AgentConfig::new(env.obs_dim(market.cols()), env.actions(), 5, dqn)
            };
            let small = DqnConfig {
                hidden: vec![32, 32],
                ..DqnConfig::default()
            };
            let normed = DqnConfig {
                hidden: vec![24],
                layer_norm: true,
                dueling: true,
                ..DqnConfig::default()
            };
            let mut nets = vec![
                (
                    "random",
                    agent(shape(small.clone()), 0).online_net().to_host(),
                ),
                (
                    "trained",
                    agent(shape(small.clone()), 40).online_net().to_host(),
                ),
                (
                    "norm + dueling",
                    agent(shape(normed), 40).online_net().to_host(),
                ),
            ];
            // Near ties: a head whose outputs are all but equal.
            let mut tie = agent(shape(small), 10);
            let mut s = tie.export_state();
            let head = s.online.len() - (32 + 1) * env.actions();
            for v in &mut s.online[head..] {
                *v *= 1e-6;
            }
            tie.import_state(&s);
            nets.push(("near ties", tie.online_net().to_host()));
            for (name, net) in nets {
                for split in [0..n / 3, n / 3..n] {
                    let mut old = BarByBar::new(net.clone(), &env);
                    let want = backtest(&market, &exec, &env, split.clone(), cfg.capital, &mut old)
                        .expect("bar by bar");
                    let targets = host_targets(&net, &market, &exec, &env, split.clone());
                    let got = book(&targets, &market, &exec, &cfg, split.clone()).expect("booked");
                    let decided: Vec<i32> = old.decided.clone();
                    assert_eq!(decided.len(), split.len(), "{name}: one decision per bar");
                    assert!(
                        decided
                            .iter()
                            .zip(&targets)
                            .all(|(a, &b)| *a == i32::from(b)),
                        "{name} {split:?} {env:?}: decisions differ"
                    );
                    assert_eq!(got.metrics, want.metrics, "{name}: metrics");
                    assert_eq!(got.equity, want.equity, "{name}: equity");
                    assert_eq!(got.daily_pnl, want.daily_pnl, "{name}: daily PnL");
                    assert_eq!(got.trades, want.trades, "{name}: trades");
                    assert!(
                        want.metrics.trades > 0 || name == "near ties",
                        "{name}: it trades"
                    );
                    compared += 1;
                }
            }
        }
        assert_eq!(compared, 24);
    }
}
