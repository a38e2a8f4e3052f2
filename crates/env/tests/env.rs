//! foxhunt-env's integration tests on the bundled real ES bars.

use foxhunt_env::backtest::{BuyAndHold, Decision, Flat, Momentum, Policy, backtest, baselines};
use foxhunt_env::exec::{SessionRule, transition};
use foxhunt_env::vec_env::{done, episode_start, observe};
use foxhunt_env::*;

fn es_market() -> MarketData {
    foxhunt_testkit::es_market(0..foxhunt_testkit::es_dataset().features.rows)
}

fn es_exec() -> Execution {
    let spec = SpecTable::default().get("ES").expect("ES").clone();
    Execution::new(
        &spec,
        Costs {
            commission: 2.5,
            slippage_ticks: 1.0,
        },
    )
}

#[test]
fn specs_are_built_in_and_overridable() {
    let t = SpecTable::default();
    let es = t.get("ES").expect("ES");
    assert_eq!(
        (es.multiplier, es.tick_size, es.tick_value()),
        (50.0, 0.25, 12.5)
    );
    assert_eq!(t.get("ZN").expect("ZN").tick_value(), 15.625);
    assert_eq!(t.get("6E").expect("6E").tick_value(), 6.25);
    for root in ["MES", "NQ", "MNQ", "CL", "GC"] {
        assert!(t.get(root).is_ok(), "{root}");
    }
    let err = t.get("XX").expect_err("unknown root").to_string();
    assert!(
        err.contains("no contract spec for XX") && err.contains("ES"),
        "{err}"
    );
    let dir = foxhunt_testkit::Scratch::new("env-specs");
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::write(dir.join("specs.toml"), "[contracts.ES]\nmultiplier = 5.0\ntick_size = 0.25\n[contracts.ZB]\nmultiplier = 1000.0\ntick_size = 0.03125\n").expect("write");
    let o = SpecTable::with_overrides(&dir.join("specs.toml")).expect("valid file");
    assert_eq!(o.get("ES").expect("ES").multiplier, 5.0);
    assert_eq!(o.get("ZB").expect("ZB").tick_value(), 31.25);
    assert_eq!(
        o.get("NQ").expect("NQ").multiplier,
        20.0,
        "untouched built-ins stay"
    );
    std::fs::write(
        dir.join("bad.toml"),
        "[contracts.ES]\nmultiplier = -1.0\ntick_size = 0.25\n",
    )
    .expect("write");
    let err = SpecTable::with_overrides(&dir.join("bad.toml"))
        .expect_err("negative multiplier")
        .to_string();
    assert!(
        err.contains("bad.toml") && err.contains("must be positive"),
        "{err}"
    );
}

#[test]
fn buy_and_hold_pnl_is_last_close_minus_first_fill_less_costs() {
    let m = es_market();
    let x = es_exec();
    let cfg = EnvConfig {
        session_rule: SessionRule::Hold,
        ..EnvConfig::default()
    };
    for split in [0..m.rows(), 100..5_000, 17_000..m.rows()] {
        let r = backtest(&m, &x, &cfg, split.clone(), 100_000.0, &mut BuyAndHold).expect("runs");
        // Independently: enter at the open after the first decision, hold to the last close.
        let (first_fill, last_close) = (m.open()[split.start + 1], m.close()[split.end - 1]);
        let rolls = (split.start + 2..split.end)
            .filter(|&t| m.contract()[t] != m.contract()[t - 1])
            .count() as f64;
        let round_trip = 2.0 * (2.5 + 1.0 * 12.5);
        let expected = (last_close - first_fill) * 50.0 - round_trip - rolls * round_trip;
        assert!(
            (r.metrics.total_pnl - expected).abs() < 1e-6,
            "{split:?}: {} vs {expected}",
            r.metrics.total_pnl
        );
        assert_eq!(r.metrics.trades, 1);
        assert_eq!(r.metrics.total_costs, round_trip * (1.0 + rolls));
    }
}

/// Long for exactly one step at `at`, flat otherwise.
struct OneTrade {
    at: usize,
}
impl Policy for OneTrade {
    fn name(&self) -> String {
        "one-trade".into()
    }
    fn target(&mut self, d: &Decision<'_>) -> i32 {
        i32::from(d.t == self.at)
    }
}

#[test]
fn a_round_trip_costs_exactly_two_sides() {
    let m = es_market();
    let x = es_exec();
    let cfg = EnvConfig::default();
    let at = 2_000;
    let r = backtest(&m, &x, &cfg, 0..m.rows(), 100_000.0, &mut OneTrade { at }).expect("runs");
    let per_side = 2.5 + 12.5;
    assert_eq!(r.metrics.total_costs, 2.0 * per_side);
    assert_eq!(r.metrics.contracts_traded, 2);
    // Bought at open[at+1], held through close[at+1] and the gap to open[at+2], sold there.
    let gross = (m.open()[at + 2] - m.open()[at + 1]) * 50.0;
    assert!((r.metrics.total_pnl - (gross - 2.0 * per_side)).abs() < 1e-9);
    assert_eq!(
        (r.metrics.trades, r.metrics.avg_holding_bars),
        (1, Some(1.0))
    );
    let flat = backtest(&m, &x, &cfg, 0..m.rows(), 100_000.0, &mut Flat).expect("runs");
    assert_eq!(
        (
            flat.metrics.total_pnl,
            flat.metrics.trades,
            flat.metrics.total_costs
        ),
        (0.0, 0, 0.0)
    );
}

/// Records what it saw; decides from its observation only.
struct Recorder {
    seen: Vec<(usize, Vec<f32>, i32)>,
}
impl Policy for Recorder {
    fn name(&self) -> String {
        "recorder".into()
    }
    fn target(&mut self, d: &Decision<'_>) -> i32 {
        let a = if d.obs[0] > 0.0 {
            1
        } else if d.obs[1] < 0.0 {
            -1
        } else {
            0
        };
        self.seen.push((d.t, d.obs.to_vec(), a));
        a
    }
}

#[test]
fn nothing_after_t_reaches_decisions_or_rewards_up_to_t() {
    let m = es_market();
    let x = es_exec();
    let cfg = EnvConfig {
        lookback: 3,
        ..EnvConfig::default()
    };
    let run = |m: &MarketData| {
        let mut p = Recorder { seen: Vec::new() };
        let r = backtest(m, &x, &cfg, 0..m.rows(), 100_000.0, &mut p).expect("runs");
        (p.seen, r.equity)
    };
    let (seen0, eq0) = run(&m);
    for k in [10usize, 4_321, 12_000] {
        let mut c = m.clone().into_columns();
        for t in k + 1..m.rows() {
            c.open[t] += 7.25;
            c.close[t] -= 3.5;
            for v in &mut c.features[t * m.cols()..(t + 1) * m.cols()] {
                *v = -*v + 0.5;
            }
        }
        let changed = MarketData::new(c).expect("still valid");
        let (seen1, eq1) = run(&changed);
        let upto = |s: &[(usize, Vec<f32>, i32)]| {
            s.iter()
                .filter(|(t, _, _)| *t <= k)
                .cloned()
                .collect::<Vec<_>>()
        };
        assert_eq!(
            upto(&seen0),
            upto(&seen1),
            "observations and actions up to {k}"
        );
        let ts_k = m.ts()[k];
        let eq_upto = |e: &[(i64, f64)]| {
            e.iter()
                .filter(|(ts, _)| *ts <= ts_k)
                .copied()
                .collect::<Vec<_>>()
        };
        // The point at bar k itself may hold the cost of a flattening decided at k; both runs
        // decided the same there, so it must match too.
        assert_eq!(
            eq_upto(&eq0),
            eq_upto(&eq1),
            "equity (rewards) up to bar {k}"
        );
        assert_ne!(seen0.len(), 0);
        assert_ne!(
            upto(&seen0).len(),
            seen0.len(),
            "the perturbation must reach later decisions"
        );
    }
}

#[test]
fn vectorized_env_matches_the_scalar_reference_step_for_step() {
    let m = es_market();
    let x = es_exec();
    let cfg = EnvConfig {
        lookback: 2,
        max_position: 2,
        episode_steps: 300,
        risk_penalty: 1.0,
        ..EnvConfig::default()
    };
    let split = 1_000..15_000;
    let (n, seed) = (300, 42);
    let dim = cfg.obs_dim(m.cols());
    let mut env = VecEnv::new(&m, x, cfg.clone(), split.clone(), n, seed).expect("env");
    let mut obs = vec![0f32; n * dim];
    env.reset(&mut obs);
    let (mut rew, mut dn) = (vec![0f32; n], vec![0u8; n]);
    // Scalar reference state.
    let mut t: Vec<usize> = (0..n)
        .map(|i| episode_start(seed, i as u32, 0, &split))
        .collect();
    let (mut pos, mut entry, mut steps, mut episode) =
        (vec![0i32; n], vec![0f64; n], vec![0u32; n], vec![0u32; n]);
    let mut ref_obs = vec![0f32; dim];
    let (mut terminals, mut truncations) = (0, 0);
    for step in 0..1_500 {
        let actions: Vec<u8> = (0..n)
            .map(|i| ((obs[i * dim].to_bits() as usize + step + i) % cfg.actions()) as u8)
            .collect();
        env.step(&actions, &mut obs, &mut rew, &mut dn);
        for i in 0..n {
            let tr = transition(
                &m,
                &x,
                t[i],
                split.end,
                cfg.session_rule,
                pos[i],
                cfg.target(actions[i]),
            );
            let reward =
                ((tr.pnl() - f64::from(tr.position.unsigned_abs())) / cfg.reward_scale) as f32;
            assert_eq!(rew[i], reward, "env {i} step {step}");
            if !tr.terminal {
                assert_eq!(
                    m.session()[tr.next_t],
                    m.session()[t[i]],
                    "a running episode never crosses a session"
                );
            }
            entry[i] = foxhunt_env::exec::next_entry(entry[i], pos[i], &tr);
            pos[i] = tr.position;
            t[i] = tr.next_t;
            steps[i] += 1;
            let code = if tr.terminal {
                done::TERMINAL
            } else if steps[i] >= 300 {
                done::TRUNCATED
            } else {
                done::RUNNING
            };
            assert_eq!(dn[i], code, "env {i} step {step}");
            if code != done::RUNNING {
                terminals += usize::from(code == done::TERMINAL);
                truncations += usize::from(code == done::TRUNCATED);
                episode[i] += 1;
                t[i] = episode_start(seed, i as u32, episode[i], &split);
                (pos[i], entry[i], steps[i]) = (0, 0.0, 0);
            }
            observe(&m, &cfg, x.tick_size, t[i], pos[i], entry[i], &mut ref_obs);
            assert_eq!(
                &obs[i * dim..(i + 1) * dim],
                ref_obs.as_slice(),
                "env {i} step {step}"
            );
            assert_eq!(env.bar_index()[i] as usize, t[i]);
            assert_eq!(env.positions()[i], pos[i]);
        }
    }
    assert!(
        terminals > 0 && truncations > 0,
        "both episode ends must be exercised: {terminals} {truncations}"
    );
}

#[test]
fn seeds_make_runs_reproducible() {
    let m = es_market();
    let x = es_exec();
    let run = |seed: u64| {
        let cfg = EnvConfig::default();
        let n = 64;
        let dim = cfg.obs_dim(m.cols());
        let mut env = VecEnv::new(&m, x, cfg, 0..m.rows(), n, seed).expect("env");
        let (mut obs, mut rew, mut dn) = (vec![0f32; n * dim], vec![0f32; n], vec![0u8; n]);
        env.reset(&mut obs);
        let mut total = Vec::new();
        for s in 0..200u32 {
            let actions: Vec<u8> = (0..n as u32).map(|i| ((i * 7 + s) % 3) as u8).collect();
            env.step(&actions, &mut obs, &mut rew, &mut dn);
            total.extend_from_slice(&rew);
        }
        total
    };
    assert_eq!(run(7), run(7));
    assert_ne!(run(7), run(8));
}

#[test]
fn baselines_run_side_by_side() {
    let m = es_market();
    let r = baselines(
        &m,
        &es_exec(),
        &EnvConfig::default(),
        0..m.rows(),
        100_000.0,
        1,
    )
    .expect("runs");
    let names: Vec<&str> = r.iter().map(|b| b.policy.as_str()).collect();
    assert_eq!(names, ["flat", "buy-and-hold", "random", "momentum-30"]);
    assert_eq!(r[0].metrics.total_pnl, 0.0);
    assert!(r[2].metrics.trades > 100 && r[2].metrics.total_costs > 0.0);
    assert!(r[3].metrics.trades > 10);
    let again = baselines(
        &m,
        &es_exec(),
        &EnvConfig::default(),
        0..m.rows(),
        100_000.0,
        1,
    )
    .expect("runs");
    assert_eq!(
        r[2].metrics, again[2].metrics,
        "seeded random baseline is deterministic"
    );
    // Momentum decides from closes at or before t only.
    let mut mo = Momentum { lookback: 5 };
    let obs = vec![0f32; EnvConfig::default().obs_dim(m.cols())];
    let t = 3_000;
    let want = (m.close()[t] - m.close()[t - 5]).signum() as i32;
    assert_eq!(
        mo.target(&Decision {
            t,
            position: 0,
            obs: &obs,
            market: &m
        }),
        want
    );
}

#[test]
fn worked_example_of_docs_environment_md() {
    let m = MarketData::new(MarketColumns {
        cols: 1,
        features: vec![0.0; 4],
        open: vec![4500.00, 4501.25, 4502.50, 4490.00],
        close: vec![4501.00, 4503.00, 4502.00, 4491.00],
        session: vec![0, 0, 0, 1],
        contract: vec![0; 4],
        ts: vec![0, 1, 2, 3],
    })
    .expect("valid");
    let x = es_exec();
    assert_eq!(x.cost_per_side, 15.0);
    let cfg = EnvConfig::default();
    let rule = SessionRule::FlattenAtClose;
    let s1 = transition(&m, &x, 0, 4, rule, 0, 1);
    assert_eq!((s1.fill, s1.pnl()), (Some(4501.50), 72.50));
    let mut obs = vec![0f32; cfg.obs_dim(1)];
    observe(
        &m,
        &cfg,
        x.tick_size,
        1,
        1,
        foxhunt_env::exec::next_entry(0.0, 0, &s1),
        &mut obs,
    );
    assert_eq!(&obs[1..], &[1.0, 0.06]);
    let s2 = transition(&m, &x, 1, 4, rule, 1, 1);
    assert_eq!((s2.hold_pnl, s2.bar_pnl, s2.pnl()), (-25.0, -25.0, -50.0));
    let s3 = transition(&m, &x, 2, 4, rule, 1, 1);
    assert_eq!((s3.terminal, s3.pnl()), (true, -15.0));
    assert_eq!(s1.pnl() + s2.pnl() + s3.pnl(), 7.50);
    // The backtester agrees: bar 3 is the split's last bar, so no new position opens there.
    let r = backtest(&m, &x, &cfg, 0..4, 100_000.0, &mut BuyAndHold).expect("runs");
    assert_eq!(
        (r.metrics.total_pnl, r.metrics.trades, r.metrics.total_costs),
        (7.5, 1, 30.0)
    );
}

#[test]
fn episodes_can_start_at_given_bars() {
    let m = es_market();
    let x = es_exec();
    let cfg = EnvConfig::default();
    let dim = cfg.obs_dim(m.cols());
    let mut env = VecEnv::new(&m, x, cfg.clone(), 100..5_000, 3, 1).expect("env");
    let mut obs = vec![0f32; 3 * dim];
    env.reset_to(&[100, 2_000, 4_998], &mut obs)
        .expect("valid starts");
    assert_eq!(env.bar_index(), &[100, 2_000, 4_998]);
    let mut want = vec![0f32; dim];
    observe(&m, &cfg, x.tick_size, 2_000, 0, 0.0, &mut want);
    assert_eq!(&obs[dim..2 * dim], want.as_slice());
    // Going long from the given bar earns exactly what the transition says.
    let (mut rew, mut dn) = (vec![0f32; 3], vec![0u8; 3]);
    env.step(&[1, 2, 1], &mut obs, &mut rew, &mut dn);
    let tr = transition(&m, &x, 2_000, 5_000, SessionRule::FlattenAtClose, 0, 1);
    assert_eq!(rew[1], (tr.pnl() / cfg.reward_scale) as f32);
    for bad in [[99usize, 100, 100], [100, 100, 4_999]] {
        assert!(env.reset_to(&bad, &mut obs).is_err(), "{bad:?}");
    }
}

/// PnL is the traded contract's: the same backtest, with a position carried through every
/// roll of the bundled data (four, one of them across a six-year hole), books the same money,
/// to the bit, whichever adjustment the continuous series is shown with; and within a contract
/// every move booked is that contract's raw move.
#[test]
fn pnl_is_the_same_under_every_adjustment() {
    use foxhunt_data::{Adjustment, Dataset, FeatureConfig, LoadOptions, SessionCalendar};
    let load = |adjustment| {
        Dataset::load(
            &foxhunt_testkit::test_data().join("futures-baseline"),
            &foxhunt_data::SymbolSelector::parse("ES.FUT").expect("valid"),
            &LoadOptions::default(),
            &SessionCalendar::cme(),
            adjustment,
            &FeatureConfig::default(),
        )
        .expect("loads")
    };
    let cfg = EnvConfig {
        session_rule: SessionRule::Hold,
        ..EnvConfig::default()
    };
    let x = es_exec();
    let mut results = Vec::new();
    for adjustment in [Adjustment::None, Adjustment::Difference, Adjustment::Ratio] {
        let d = load(adjustment);
        assert!(d.series.rolls.len() >= 4, "rolls to carry through");
        let m = MarketData::from_features(&d.features, 0..d.features.rows, None).expect("market");
        // Within a contract, the traded close moves exactly as the raw close.
        for t in 1..m.rows() {
            if m.contract()[t] == m.contract()[t - 1] {
                assert_eq!(
                    m.close()[t] - m.close()[t - 1],
                    d.series.raw[t].close() - d.series.raw[t - 1].close(),
                    "row {t}"
                );
            }
        }
        let r = backtest(&m, &x, &cfg, 0..m.rows(), 100_000.0, &mut BuyAndHold).expect("runs");
        assert!(r.metrics.trades > 0);
        results.push((adjustment, r.metrics.total_pnl, r.equity));
    }
    for (adjustment, pnl, equity) in &results[1..] {
        assert_eq!(
            pnl.to_bits(),
            results[0].1.to_bits(),
            "{adjustment:?}: {pnl} vs {}",
            results[0].1
        );
        assert_eq!(equity, &results[0].2, "{adjustment:?}");
    }
    // And the display adjustment does differ, so the test compares something.
    assert_ne!(
        load(Adjustment::None).series.adjusted(0).close(),
        load(Adjustment::Difference).series.adjusted(0).close()
    );
}
