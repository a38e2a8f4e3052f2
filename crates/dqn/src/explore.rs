//! Epsilon-greedy exploration: one rule for the host and the device. Each draw comes from
//! Philox4x32-10 keyed by the run's seed, with the counter (environment, step counter), so a
//! draw depends on where it is made in the run, never on what was drawn before, and the CPU
//! trainer and the fused engine's `select_actions` kernel (kernels/dqn.cu) draw the same numbers.

use foxhunt_gpu::philox::philox4x32_10;

/// The fourth counter word of exploration draws: keeps them apart from other Philox streams
/// (the replay sampler's is 0x5EED).
const STREAM: u32 = 0xAC7;

/// The counter of one step's exploration draws, unique per (window, epoch, step) for windows
/// below 2^24, epochs below 2^16 and steps below 2^24.
pub fn step_counter(window: usize, epoch: usize, step: usize) -> u64 {
    ((window as u64) << 40) ^ ((epoch as u64) << 24) ^ step as u64
}

/// The action environment `env` takes at the step of `counter`: `greedy`, or, where the draw
/// falls below `epsilon`, a uniform one of `actions`.
pub fn explore(seed: u64, counter: u64, env: u32, epsilon: f32, greedy: u32, actions: u32) -> u32 {
    if epsilon <= 0.0 {
        return greedy;
    }
    let v = philox4x32_10(
        [env, counter as u32, (counter >> 32) as u32, STREAM],
        [seed as u32, (seed >> 32) as u32],
    );
    // 24 bits: exactly representable, the same float the kernel computes.
    let u = (v[0] >> 8) as f32 * (1.0 / 16_777_216.0);
    if u < epsilon { v[1] % actions } else { greedy }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exploration_keeps_greedy_at_zero_and_explores_at_the_asked_rate() {
        let greedy: Vec<u32> = (0..20_000).map(|e| explore(3, 77, e, 0.0, 2, 3)).collect();
        assert!(greedy.iter().all(|&a| a == 2));
        let n = 20_000u32;
        let differ = (0..n)
            .filter(|&e| explore(3, 77, e, 0.3, 2, 3) != 2)
            .count() as f64;
        // A uniform action differs from the greedy one 2/3 of the time: 0.3 * 2/3 = 0.2.
        assert!((differ / f64::from(n) - 0.2).abs() < 0.01, "{differ}");
        // Every action is reachable, and other counters draw other numbers.
        let all: std::collections::BTreeSet<u32> =
            (0..n).map(|e| explore(3, 77, e, 1.0, 0, 3)).collect();
        assert_eq!(all.len(), 3);
        let same = (0..1000)
            .filter(|&e| explore(3, 77, e, 1.0, 0, 3) == explore(3, 78, e, 1.0, 0, 3))
            .count();
        assert!(same < 500, "{same} of 1000 equal under another counter");
    }

    #[test]
    fn step_counters_differ_across_windows_epochs_and_steps() {
        let mut seen = std::collections::HashSet::new();
        for w in 0..4 {
            for e in 0..4 {
                for s in 0..64 {
                    assert!(seen.insert(step_counter(w, e, s)), "({w}, {e}, {s})");
                }
            }
        }
    }
}
