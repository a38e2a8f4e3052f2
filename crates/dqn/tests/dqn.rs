//! foxhunt-dqn's correctness tests on the CPU (NdArray); the CUDA equivalence test runs with
//! `--features cuda` and FOXHUNT_GPU_TESTS=1.

use burn::backend::NdArray;
use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use foxhunt_dqn::agent::{td_loss, td_targets};
use foxhunt_dqn::config::{Loss, TargetUpdate};
use foxhunt_dqn::model::dueling;
use foxhunt_dqn::replay::{HostBatch, Replay, Transition};
use foxhunt_dqn::*;

type B = CpuBackend;
type Inner = NdArray<f32>;

fn dev() -> burn::tensor::Device<B> {
    Default::default()
}

fn onehot(i: usize, n: usize) -> Vec<f32> {
    (0..n).map(|k| f32::from(u8::from(k == i))).collect()
}

fn q_of(agent: &DqnAgent<B>, obs: Vec<f32>, dim: usize) -> Vec<f32> {
    let t = Tensor::<Inner, 1>::from_floats(obs.as_slice(), &dev()).reshape([1, dim]);
    agent.q_values(t).into_data().to_vec::<f32>().expect("f32")
}

fn train(agent: &mut DqnAgent<B>, replay: &mut Replay, updates: usize) {
    let (bs, dim) = (agent.config().batch_size, agent.config().obs_dim);
    for _ in 0..updates {
        let hb = replay.sample(bs, agent.updates());
        let stats = agent.train_step(Batch::from_host(&hb, dim, &dev()));
        if agent.config().prioritized.is_some() {
            replay.update_priorities(
                &hb.slots,
                &stats.td_errors.into_data().to_vec::<f32>().expect("f32"),
            );
        }
    }
}

/// A chain of N states; "right" moves on and reaching the last state pays 1 and ends the episode;
/// "left" moves back (or stays at 0) and pays nothing. Q*(s, right) = g^(N-2-s),
/// Q*(s, left) = g * V*(max(s-1, 0)), V*(s) = g^(N-2-s).
fn chain(
    n: usize,
    gamma: f64,
    prioritized: bool,
    dueling: bool,
) -> (DqnAgent<B>, Vec<(usize, [f64; 2])>) {
    let cfg = AgentConfig {
        obs_dim: n,
        actions: 2,
        seed: 3,
        dqn: DqnConfig {
            hidden: vec![32],
            gamma,
            lr: 5e-3,
            batch_size: 32,
            replay_capacity: 64,
            target_update: TargetUpdate::Hard { every: 50 },
            prioritized: prioritized.then(Default::default),
            dueling,
            ..DqnConfig::default()
        },
    };
    let mut agent = DqnAgent::<B>::new(cfg.clone(), &dev()).expect("valid config");
    let mut replay = Replay::new(64, 1, cfg.prioritized);
    for s in 0..n - 1 {
        for a in 0..2u8 {
            let next = if a == 1 { s + 1 } else { s.saturating_sub(1) };
            let end = next == n - 1;
            replay.push(Transition {
                obs: onehot(s, n),
                action: a,
                ret: f32::from(u8::from(end)),
                next_obs: onehot(next, n),
                discount: if end { 0.0 } else { gamma as f32 },
            });
        }
    }
    train(&mut agent, &mut replay, 2_000);
    let v = |s: usize| gamma.powi((n - 2 - s) as i32);
    let want = (0..n - 1)
        .map(|s| (s, [gamma * v(s.saturating_sub(1)), v(s)]))
        .collect();
    (agent, want)
}

#[test]
fn converges_to_the_optimal_q_values_of_a_chain() {
    for (prioritized, dueling) in [(false, false), (true, false), (false, true)] {
        let (agent, want) = chain(5, 0.9, prioritized, dueling);
        for (s, q_star) in want {
            let q = q_of(&agent, onehot(s, 5), 5);
            for a in 0..2 {
                assert!(
                    (f64::from(q[a]) - q_star[a]).abs() < 0.05,
                    "per {prioritized} dueling {dueling}: Q({s},{a}) = {} vs {}",
                    q[a],
                    q_star[a]
                );
            }
        }
    }
}

#[test]
fn picks_the_best_arm_of_a_contextual_bandit() {
    let cfg = AgentConfig {
        obs_dim: 3,
        actions: 3,
        seed: 9,
        dqn: DqnConfig {
            hidden: vec![16],
            lr: 1e-2,
            batch_size: 16,
            replay_capacity: 32,
            ..DqnConfig::default()
        },
    };
    let mut agent = DqnAgent::<B>::new(cfg, &dev()).expect("valid");
    let mut replay = Replay::new(32, 2, None);
    for c in 0..3 {
        for a in 0..3u8 {
            let best = (c + 1) % 3;
            let r = if usize::from(a) == best {
                1.0
            } else {
                0.2 * f32::from(a)
            };
            replay.push(Transition {
                obs: onehot(c, 3),
                action: a,
                ret: r,
                next_obs: onehot(c, 3),
                discount: 0.0,
            });
        }
    }
    train(&mut agent, &mut replay, 600);
    let obs = Tensor::<Inner, 1>::from_floats(
        [1.0f32, 0., 0., 0., 1., 0., 0., 0., 1.].as_slice(),
        &dev(),
    )
    .reshape([3, 3]);
    let greedy = agent
        .act(obs, 0.0)
        .into_data()
        .to_vec::<i64>()
        .expect("i64");
    assert_eq!(greedy, vec![1, 2, 0]);
}

#[test]
fn targets_and_dueling_by_hand() {
    let d = dev();
    let t2 = |v: [[f32; 2]; 2]| Tensor::<Inner, 2>::from_floats(v, &d);
    let t1 = |v: [f32; 2]| Tensor::<Inner, 1>::from_floats(v, &d);
    let (online, target) = (
        t2([[1.0, 3.0], [2.0, 0.0]]),
        t2([[10.0, 20.0], [30.0, 40.0]]),
    );
    let (ret, disc) = (t1([1.0, 2.0]), t1([0.9, 0.5]));
    // Double: online picks actions 1 and 0, target values 20 and 30: 1 + 18, 2 + 15.
    let y = td_targets(
        online.clone(),
        target.clone(),
        ret.clone(),
        disc.clone(),
        true,
    );
    assert_eq!(
        y.into_data().to_vec::<f32>().expect("f32"),
        vec![19.0, 17.0]
    );
    // Vanilla: the target's max, 20 and 40: 1 + 18, 2 + 20.
    let y = td_targets(online, target, ret, disc, false);
    assert_eq!(
        y.into_data().to_vec::<f32>().expect("f32"),
        vec![19.0, 22.0]
    );
    // Dueling: V = 1, A = (1, 2, 3): Q = 1 + A - 2.
    let q = dueling(
        Tensor::<Inner, 2>::from_floats([[1.0]], &d),
        Tensor::<Inner, 2>::from_floats([[1.0, 2.0, 3.0]], &d),
    );
    assert_eq!(
        q.into_data().to_vec::<f32>().expect("f32"),
        vec![0.0, 1.0, 2.0]
    );
    // Huber(1): 0.5 * 0.5^2 and 1 * (3 - 0.5); MSE squares.
    let td = t1([0.5, -3.0]);
    assert_eq!(
        td_loss(td.clone(), Loss::Huber { delta: 1.0 })
            .into_data()
            .to_vec::<f32>()
            .expect("f32"),
        vec![0.125, 2.5]
    );
    assert_eq!(
        td_loss(td, Loss::Mse)
            .into_data()
            .to_vec::<f32>()
            .expect("f32"),
        vec![0.25, 9.0]
    );
}

fn weights(agent: &DqnAgent<B>) -> Vec<f32> {
    let mut w = param_values(&agent.online_net());
    w.extend(param_values(agent.target_net()));
    w
}

fn fixed_batches(dim: usize, count: usize) -> Vec<HostBatch> {
    let mut r = Replay::new(256, 5, None);
    for k in 0..256u32 {
        let x = |j: u32| ((k * 31 + j * 17) % 97) as f32 / 97.0 - 0.5;
        r.push(Transition {
            obs: (0..dim as u32).map(x).collect(),
            action: (k % 3) as u8,
            ret: x(7),
            next_obs: (0..dim as u32).map(|j| x(j + 3)).collect(),
            discount: 0.9,
        });
    }
    (0..count).map(|u| r.sample(32, u as u64)).collect()
}

#[test]
fn same_seed_same_weights_bit_for_bit() {
    let cfg = AgentConfig {
        obs_dim: 8,
        seed: 21,
        dqn: DqnConfig {
            hidden: vec![16, 16],
            target_update: TargetUpdate::Soft { tau: 0.05 },
            ..DqnConfig::default()
        },
        ..AgentConfig::default()
    };
    let batches = fixed_batches(8, 40);
    let run = |cfg: &AgentConfig| {
        let mut a = DqnAgent::<B>::new(cfg.clone(), &dev()).expect("valid");
        for b in &batches {
            a.train_step(Batch::from_host(b, 8, &dev()));
        }
        weights(&a)
    };
    let (w1, w2) = (run(&cfg), run(&cfg));
    assert_eq!(w1, w2);
    assert_ne!(w1, run(&AgentConfig { seed: 22, ..cfg }));
}

/// An agent's exported learning state, imported into another agent (another seed), makes it
/// train exactly like the first: networks, Adam's moments and the update count all carry over.
#[test]
fn exported_state_imported_elsewhere_trains_identically() {
    for (layer_norm, dueling, target_update) in [
        (false, false, TargetUpdate::Hard { every: 3 }),
        (true, true, TargetUpdate::Soft { tau: 0.1 }),
    ] {
        let cfg = AgentConfig {
            obs_dim: 8,
            seed: 4,
            dqn: DqnConfig {
                hidden: vec![16, 16],
                layer_norm,
                dueling,
                target_update,
                weight_decay: 1e-3,
                ..DqnConfig::default()
            },
            ..AgentConfig::default()
        };
        let batches = fixed_batches(8, 12);
        let mut a = DqnAgent::<B>::new(cfg.clone(), &dev()).expect("valid");
        let mut b = DqnAgent::<B>::new(
            AgentConfig {
                seed: 9,
                ..cfg.clone()
            },
            &dev(),
        )
        .expect("valid");
        // Before any update: no optimizer state to carry.
        b.import_state(&a.export_state());
        assert_eq!(b.export_state(), a.export_state());
        for hb in &batches[..5] {
            a.train_step(Batch::from_host(hb, 8, &dev()));
        }
        let s = a.export_state();
        assert_eq!(s.updates, 5);
        assert_eq!(s.online.len(), a.num_params());
        assert!(
            s.moment_2.iter().any(|&v| v > 0.0),
            "Adam has state after updates"
        );
        b.import_state(&s);
        assert_eq!(b.export_state(), s);
        for hb in &batches[5..] {
            a.train_step(Batch::from_host(hb, 8, &dev()));
            b.train_step(Batch::from_host(hb, 8, &dev()));
        }
        assert_eq!(weights(&a), weights(&b));
        assert_eq!(a.export_state(), b.export_state());
    }
}

/// Agents built while other threads draw from the backend's shared generator (as tests and
/// parallel trainers do) still get the weights their seed gives.
#[test]
fn initial_weights_depend_on_the_seed_alone_whatever_other_threads_draw() {
    let cfg = AgentConfig {
        obs_dim: 8,
        seed: 3,
        dqn: DqnConfig {
            hidden: vec![64, 64],
            layer_norm: true,
            dueling: true,
            ..DqnConfig::default()
        },
        ..AgentConfig::default()
    };
    let reference = weights(&DqnAgent::<B>::new(cfg.clone(), &dev()).expect("valid"));
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let noise = s.spawn(|| {
            let mut draws = 0usize;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) || draws == 0 {
                Inner::seed(&dev(), draws as u64);
                let t =
                    Tensor::<Inner, 1>::random([256], burn::tensor::Distribution::Default, &dev());
                draws += t.dims()[0];
            }
            draws
        });
        let differ: Vec<usize> = (0..50)
            .filter(|_| {
                weights(&DqnAgent::<B>::new(cfg.clone(), &dev()).expect("valid")) != reference
            })
            .collect();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(noise.join().expect("noise thread") > 0);
        assert!(differ.is_empty(), "builds {differ:?} of 50 differ");
    });
}

#[test]
fn reported_grad_norm_is_the_norm_before_clipping_and_stats_are_sane() {
    let cfg = AgentConfig {
        obs_dim: 8,
        seed: 4,
        dqn: DqnConfig {
            hidden: vec![16],
            grad_clip: Some(1e-3),
            ..DqnConfig::default()
        },
        ..AgentConfig::default()
    };
    let b = &fixed_batches(8, 1)[0];
    let mut a = DqnAgent::<B>::new(cfg.clone(), &dev()).expect("valid");
    // The gradient the agent exposes for checks is the one its update takes the norm of.
    let g = a.gradients(Batch::from_host(b, 8, &dev()));
    assert_eq!(g.len(), a.num_params());
    let norm = g.iter().map(|v| v * v).sum::<f32>().sqrt();
    let stats = a.train_step(Batch::from_host(b, 8, &dev())).to_host();
    assert!(
        (norm - stats.grad_norm).abs() <= 1e-5 * norm,
        "{norm} vs {}",
        stats.grad_norm
    );
    assert!(
        stats.grad_norm > 1e-3,
        "the norm before clipping is reported: {}",
        stats.grad_norm
    );
    assert!(stats.loss > 0.0 && stats.td_abs_max >= stats.td_abs_mean && stats.mean_q.is_finite());
    assert_eq!(a.updates(), 1);
}

#[test]
fn checkpoints_resume_exactly_and_refuse_other_configs() {
    // 1234 environment steps, the first 10 of these batches learned.
    let (cfg, mut a) = format3_agent();
    let batches = fixed_batches(8, 20);
    let dir = foxhunt_testkit::Scratch::new("dqn-ckpt");
    let path = dir.join("agent.ckpt");
    checkpoint::save(&a, &path).expect("saves");
    let files: Vec<_> = std::fs::read_dir(&dir)
        .expect("dir")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(files, ["agent.ckpt"], "no temporary file left behind");
    let mut b = checkpoint::load::<B>(&path, &cfg, &dev()).expect("loads");
    assert_eq!((b.updates(), b.env_steps()), (10, 1234));
    assert_eq!(weights(&a), weights(&b));
    assert_eq!(
        checkpoint::load_snapshot(&path, &cfg).expect("loads"),
        a.snapshot(),
        "the state, moments included, as it was saved"
    );
    for batch in &batches[10..] {
        a.train_step(Batch::from_host(batch, 8, &dev()));
        b.train_step(Batch::from_host(batch, 8, &dev()));
    }
    assert_eq!(weights(&a), weights(&b), "optimizer state came back too");
    let other = AgentConfig {
        dqn: DqnConfig {
            hidden: vec![32],
            ..cfg.dqn.clone()
        },
        ..cfg.clone()
    };
    let e = checkpoint::load::<B>(&path, &other, &dev())
        .err()
        .expect("refused")
        .to_string();
    assert!(
        e.contains("agent.ckpt") && e.contains("hidden: [16] -> [32]"),
        "{e}"
    );
    // A checkpoint of the first format (settings and derived values in one table) is refused
    // by name, not misread.
    let mut v1 = std::fs::read(&path).expect("read");
    v1[..12].copy_from_slice(b"FOXHUNT-DQN1");
    let old = dir.join("v1.ckpt");
    std::fs::write(&old, v1).expect("write");
    let e = checkpoint::load::<B>(&old, &cfg, &dev())
        .err()
        .expect("refused")
        .to_string();
    assert!(
        e.contains("v1.ckpt") && e.contains("checkpoint format 1"),
        "{e}"
    );
    let bytes = std::fs::read(&path).expect("read");
    // One flipped byte anywhere is refused, naming the file: never trained on.
    let mut flipped = bytes.clone();
    flipped[bytes.len() / 3] ^= 1;
    std::fs::write(&path, &flipped).expect("write");
    let e = checkpoint::load::<B>(&path, &cfg, &dev())
        .err()
        .expect("damaged")
        .to_string();
    assert!(
        e.contains("agent.ckpt") && e.contains("changed after foxhunt wrote"),
        "{e}"
    );
    std::fs::write(&path, &bytes[..bytes.len() / 2]).expect("write");
    let e = checkpoint::load::<B>(&path, &cfg, &dev())
        .err()
        .expect("truncated")
        .to_string();
    assert!(e.contains("truncated"), "{e}");
}

/// The agent of checkpoint format 3's sample (tests/data/SOURCE.txt), made again: 1234
/// environment steps counted, `fixed_batches(8, 20)[..10]` learned.
fn format3_agent() -> (AgentConfig, DqnAgent<B>) {
    let cfg = AgentConfig {
        obs_dim: 8,
        seed: 6,
        dqn: DqnConfig {
            hidden: vec![16],
            ..DqnConfig::default()
        },
        ..AgentConfig::default()
    };
    let mut a = DqnAgent::<B>::new(cfg.clone(), &dev()).expect("valid");
    a.count_env_steps(1234);
    for b in &fixed_batches(8, 20)[..10] {
        a.train_step(Batch::from_host(b, 8, &dev()));
    }
    (cfg, a)
}

#[test]
fn checkpoints_of_the_previous_format_still_load() {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/format3-agent.ckpt");
    let (cfg, made) = format3_agent();
    let old = checkpoint::load::<B>(&path, &cfg, &dev()).expect("format 3 loads");
    assert_eq!((old.updates(), old.env_steps()), (10, 1234));
    // The file was written on another machine: the same agent up to the rounding of its
    // matrix products.
    let s = old.snapshot();
    let m = made.snapshot();
    for (what, a, b) in [
        ("online", &s.state.online, &m.state.online),
        ("target", &s.state.target, &m.state.target),
        ("moment_1", &s.state.moment_1, &m.state.moment_1),
        ("moment_2", &s.state.moment_2, &m.state.moment_2),
    ] {
        assert_eq!(a.len(), b.len(), "{what}");
        for (x, y) in a.iter().zip(b) {
            assert!(
                (x - y).abs() <= 1e-5 * (1.0 + y.abs()),
                "{what}: {x} in the file, {y} made again"
            );
        }
    }
    assert!(
        s.state.moment_2.iter().any(|&v| v > 0.0),
        "Adam's moments came back"
    );
    assert_eq!(checkpoint::load_snapshot(&path, &cfg).expect("snapshot"), s);
}

#[test]
fn a_checkpoint_whose_contents_disagree_with_its_header_is_refused() {
    let (cfg, a) = format3_agent();
    let dir = foxhunt_testkit::Scratch::new("dqn-ckpt-header");
    let path = dir.join("agent.ckpt");
    let bytes = checkpoint::encode(&a, &path).expect("encodes");
    let n = a.num_params();
    // Sealed again after the edit, so that only the disagreement is left to find.
    let claim = |from: &str, to: &str| {
        let text = String::from_utf8_lossy(&bytes).into_owned();
        assert!(text.contains(from), "the header says {from}");
        let edited = bytes_replace(&bytes, from.as_bytes(), to.as_bytes());
        std::fs::write(&path, foxhunt_fs::seal(&edited)).expect("write");
        checkpoint::load::<B>(&path, &cfg, &dev())
            .err()
            .expect("refused")
            .to_string()
    };
    let e = claim(&format!("\"params\":{n}"), &format!("\"params\":{}", n + 1));
    assert!(
        e.contains("agent.ckpt") && e.contains(&format!("{}", n + 1)),
        "{e}"
    );
    std::fs::write(&path, foxhunt_fs::seal(&bytes[..bytes.len() - 4])).expect("write");
    let e = checkpoint::load_snapshot(&path, &cfg)
        .expect_err("refused")
        .to_string();
    assert!(e.contains("agent.ckpt") && e.contains("truncated"), "{e}");
}

/// `bytes` with the first `from` replaced by `to`.
fn bytes_replace(bytes: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let at = bytes
        .windows(from.len())
        .position(|w| w == from)
        .expect("present");
    [&bytes[..at], to, &bytes[at + from.len()..]].concat()
}

#[test]
fn a_new_agent_starts_with_target_equal_to_online_and_records_what_it_uses() {
    use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
    let cfg = AgentConfig {
        obs_dim: 8,
        seed: 13,
        dqn: DqnConfig {
            hidden: vec![16],
            dueling: true,
            ..DqnConfig::default()
        },
        ..AgentConfig::default()
    };
    let agent = DqnAgent::<B>::new(cfg.clone(), &dev()).expect("valid");
    let w = weights(&agent);
    let (online, target) = w.split_at(w.len() / 2);
    assert_eq!(
        online, target,
        "target network starts as a copy of the online one"
    );
    // A fresh network recorded and loaded elsewhere computes what the original computes.
    let net = QNetwork::<Inner>::init(&cfg, &dev());
    let rec = BinBytesRecorder::<FullPrecisionSettings>::default();
    let bytes = Recorder::<Inner>::record(&rec, net.clone().into_record(), ()).expect("record");
    let copy = QNetwork::<Inner>::init(&cfg, &dev())
        .load_record(Recorder::<Inner>::load(&rec, bytes, &dev()).expect("load"));
    let x = Tensor::<Inner, 2>::ones([2, 8], &dev());
    assert_eq!(
        net.forward(x.clone()).into_data(),
        copy.forward(x).into_data()
    );
}

#[test]
fn schedules() {
    use foxhunt_dqn::config::{Decay, Epsilon, LrSchedule};
    let lin = Epsilon {
        start: 1.0,
        end: 0.1,
        steps: 100,
        decay: Decay::Linear,
    };
    assert!((lin.at(50) - 0.55).abs() < 1e-12 && lin.at(1_000) == 0.1);
    let exp = Epsilon {
        decay: Decay::Exponential,
        ..lin
    };
    assert!((exp.at(50) - 0.1f64.sqrt()).abs() < 1e-12);
    let c = AgentConfig {
        dqn: DqnConfig {
            lr: 1.0,
            lr_schedule: LrSchedule::Cosine {
                min_factor: 0.0,
                steps: 100,
            },
            ..DqnConfig::default()
        },
        ..AgentConfig::default()
    };
    assert!((c.lr_at(50) - 0.5).abs() < 1e-12 && c.lr_at(100).abs() < 1e-12);
    let l = AgentConfig {
        dqn: DqnConfig {
            lr: 1.0,
            lr_schedule: LrSchedule::Linear {
                end_factor: 0.5,
                steps: 10,
            },
            ..DqnConfig::default()
        },
        ..AgentConfig::default()
    };
    assert!((l.lr_at(5) - 0.75).abs() < 1e-12 && l.lr_at(20) == 0.5);
    assert!(
        AgentConfig {
            dqn: DqnConfig {
                hidden: vec![],
                ..DqnConfig::default()
            },
            ..AgentConfig::default()
        }
        .validate()
        .is_err()
    );
    assert!(
        AgentConfig {
            dqn: DqnConfig {
                target_update: TargetUpdate::Soft { tau: 0.0 },
                ..DqnConfig::default()
            },
            ..AgentConfig::default()
        }
        .validate()
        .is_err()
    );
}

#[test]
fn epsilon_greedy_explores_at_the_asked_rate() {
    let cfg = AgentConfig {
        obs_dim: 4,
        actions: 3,
        seed: 8,
        dqn: DqnConfig {
            hidden: vec![8],
            ..DqnConfig::default()
        },
    };
    let agent = DqnAgent::<B>::new(cfg, &dev()).expect("valid");
    let n = 4000;
    let obs = Tensor::<Inner, 2>::zeros([n, 4], &dev());
    let greedy = agent
        .act(obs.clone(), 0.0)
        .into_data()
        .to_vec::<i64>()
        .expect("i64");
    let explored = agent
        .act(obs, 0.3)
        .into_data()
        .to_vec::<i64>()
        .expect("i64");
    let differ = greedy.iter().zip(&explored).filter(|(a, b)| a != b).count() as f64 / n as f64;
    // A random action differs from the greedy one 2/3 of the time: expect 0.3 * 2/3 = 0.2.
    assert!((differ - 0.2).abs() < 0.03, "{differ}");
}

#[cfg(feature = "cuda")]
#[test]
fn cuda_q_values_match_ndarray() {
    if !foxhunt_testkit::gpu_tests() {
        return;
    }
    use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
    type C = burn::backend::Cuda<f32, i32>;
    let cd = burn::backend::cuda::CudaDevice::default();
    let obs: Vec<f32> = (0..256 * 32)
        .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
        .collect();
    let mut failures = Vec::new();
    for (dueling, layer_norm, full_f32) in [
        (false, false, false),
        (false, true, false),
        (true, false, false),
        (true, true, false),
        (false, false, true),
        (false, true, true),
        (true, false, true),
        (true, true, true),
    ] {
        let cfg = AgentConfig {
            obs_dim: 32,
            seed: 5,
            dqn: DqnConfig {
                hidden: vec![128, 128],
                dueling,
                layer_norm,
                full_f32,
                ..DqnConfig::default()
            },
            ..AgentConfig::default()
        };
        let cpu = QNetwork::<Inner>::init(&cfg, &Default::default());
        let rec = BinBytesRecorder::<FullPrecisionSettings>::default();
        let bytes = Recorder::<Inner>::record(&rec, cpu.clone().into_record(), ()).expect("record");
        let gpu = QNetwork::<C>::init(&cfg, &cd)
            .load_record(Recorder::<C>::load(&rec, bytes, &cd).expect("load"));
        let (w_cpu, w_gpu) = (param_values(&cpu), param_values(&gpu));
        let w_diff = w_cpu
            .iter()
            .zip(&w_gpu)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        let q_cpu = cpu
            .forward(
                Tensor::<Inner, 1>::from_floats(obs.as_slice(), &Default::default())
                    .reshape([256, 32]),
            )
            .into_data()
            .to_vec::<f32>()
            .expect("f32");
        let q_gpu = gpu
            .forward(Tensor::<C, 1>::from_floats(obs.as_slice(), &cd).reshape([256, 32]))
            .into_data()
            .to_vec::<f32>()
            .expect("f32");
        // Relative to the scale of the Q-values, so that values near zero do not inflate it.
        let scale = q_cpu.iter().map(|v| v.abs()).fold(0f32, f32::max).max(1e-6);
        let worst = q_cpu
            .iter()
            .zip(&q_gpu)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max)
            / scale;
        println!(
            "cuda vs ndarray (dueling {dueling}, layer_norm {layer_norm}, full_f32 {full_f32}): {} weights (max diff {w_diff:e}), {} Q-values, worst |diff| / max|Q| = {worst:e}",
            w_cpu.len(),
            q_cpu.len()
        );
        // burn-cuda 0.21 stages f32 matmul operands as TF32 on tensor cores (cubek-matmul
        // 0.2, blueprint.rs; no switch in burn 0.21): 10-bit mantissas, about 5e-4 relative.
        // The full-f32 dense layers avoid the matmul and must meet 1e-4.
        let tolerance = if full_f32 { 1e-4 } else { TF32_TOLERANCE };
        if !(worst < tolerance && w_diff == 0.0 && w_cpu.len() == w_gpu.len()) {
            failures.push((dueling, layer_norm, full_f32, worst, w_diff));
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
}

/// Largest |Q_cuda - Q_ndarray| / max|Q| accepted: four TF32 roundings (2^-11 each).
#[cfg(feature = "cuda")]
const TF32_TOLERANCE: f32 = 2e-3;

/// Every float parameter of a network, in visiting order.
fn param_values<Bk: Backend>(net: &QNetwork<Bk>) -> Vec<f32> {
    struct All(Vec<f32>);
    impl<Bk: Backend> ModuleVisitor<Bk> for All {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<Bk, D>>) {
            self.0.extend(
                p.val()
                    .into_data()
                    .convert::<f32>()
                    .to_vec::<f32>()
                    .expect("f32"),
            );
        }
    }
    let mut all = All(Vec::new());
    net.visit(&mut all);
    all.0
}

#[test]
fn full_f32_dense_layers_compute_what_the_matmul_computes() {
    for (dueling, layer_norm) in [(false, false), (true, true)] {
        let base = AgentConfig {
            obs_dim: 7,
            seed: 9,
            dqn: DqnConfig {
                hidden: vec![16, 8],
                dueling,
                layer_norm,
                ..DqnConfig::default()
            },
            ..AgentConfig::default()
        };
        let exact = AgentConfig {
            dqn: DqnConfig {
                full_f32: true,
                ..base.dqn.clone()
            },
            ..base.clone()
        };
        let a = DqnAgent::<B>::new(base, &dev()).expect("agent");
        let b = DqnAgent::<B>::new(exact, &dev()).expect("agent");
        for k in 0..16 {
            let obs: Vec<f32> = (0..7).map(|i| ((k * 7 + i) as f32).cos() * 2.0).collect();
            let (qa, qb) = (q_of(&a, obs.clone(), 7), q_of(&b, obs, 7));
            for (x, y) in qa.iter().zip(&qb) {
                assert!((x - y).abs() <= 1e-5 * x.abs().max(1.0), "{qa:?} vs {qb:?}");
            }
        }
    }
}

#[test]
fn the_host_forward_agrees_with_burn_for_every_architecture() {
    use foxhunt_dqn::config::Activation;
    for (activation, layer_norm, dueling) in [
        (Activation::Relu, false, false),
        (Activation::Tanh, true, false),
        (Activation::Gelu, false, true),
        (Activation::Relu, true, true),
    ] {
        let cfg = AgentConfig {
            obs_dim: 9,
            actions: 5,
            seed: 4,
            dqn: DqnConfig {
                hidden: vec![32, 16],
                activation,
                layer_norm,
                dueling,
                ..DqnConfig::default()
            },
        };
        let agent = DqnAgent::<B>::new(cfg.clone(), &dev()).expect("agent");
        let mut host = agent.online_net().to_host();
        // The same network made from the exported flat parameters, and decisions of many rows
        // at once, are the one-row host forward exactly.
        let mut flat =
            foxhunt_dqn::model::HostQNetwork::from_flat(&cfg, &agent.export_state().online);
        let mut worst = 0f32;
        let mut all_obs = Vec::new();
        let mut one_by_one = Vec::new();
        for k in 0..64 {
            let obs: Vec<f32> = (0..9)
                .map(|i| ((k * 9 + i) as f32 * 0.37).sin() * 3.0)
                .collect();
            let want = q_of(&agent, obs.clone(), 9);
            let mut got = vec![0f32; 5];
            host.forward(&obs, &mut got);
            let mut again = vec![0f32; 5];
            flat.forward(&obs, &mut again);
            assert_eq!(got, again, "from_flat is to_host");
            let scale = want.iter().fold(1e-3f32, |m, v| m.max(v.abs()));
            for (a, b) in want.iter().zip(&got) {
                worst = worst.max((a - b).abs() / scale);
            }
            one_by_one.push(host.greedy(&obs));
            all_obs.extend(obs);
        }
        let mut rows = vec![0usize; 64];
        for (chunk, out) in all_obs.chunks(9 * 8).zip(rows.chunks_mut(8)) {
            flat.greedy_rows(chunk, 8, out);
        }
        assert_eq!(rows, one_by_one, "greedy_rows decides as greedy");
        assert!(
            worst < 1e-5,
            "{activation:?} layer_norm={layer_norm} dueling={dueling}: worst relative difference {worst:e}"
        );
    }
}
