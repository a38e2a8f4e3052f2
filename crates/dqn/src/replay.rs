//! Host replay: n-step accumulation per environment, a ring of transitions, uniform or
//! proportional prioritized sampling (sum tree). The device replay of foxhunt-memory samples by
//! index on the GPU; this one is the CPU path and the reference.

use crate::config::Prioritized;

/// One n-step transition.
#[derive(Debug, Clone, PartialEq)]
pub struct Transition {
    /// Observation at the start, `[obs_dim]`.
    pub obs: Vec<f32>,
    /// Action taken there.
    pub action: u8,
    /// Sum of gamma^k r_k over the k <= n steps.
    pub ret: f32,
    /// Observation after those steps, `[obs_dim]`.
    pub next_obs: Vec<f32>,
    /// gamma^k, or 0 when the episode terminated inside the k steps.
    pub discount: f32,
}

/// How a step ended its episode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepEnd {
    /// The episode goes on.
    Running,
    /// A true terminal state: nothing to bootstrap from.
    Terminal,
    /// Cut short by a step limit: the state had a future, but it is gone.
    Truncated,
}

/// Turns one environment's stream of 1-step transitions into n-step ones.
///
/// On a terminal step every pending start is emitted with discount 0. On a truncated step the
/// pending starts are dropped: the environment has already reset, so the state to bootstrap from
/// is gone, and dropping them is unbiased where bootstrapping from the wrong state is not.
#[derive(Debug, Clone)]
pub struct NStep {
    n: usize,
    gamma: f64,
    pending: std::collections::VecDeque<(Vec<f32>, u8, f32)>,
}

impl NStep {
    /// An accumulator for n-step returns with discount gamma.
    pub fn new(n: usize, gamma: f64) -> Self {
        assert!(n >= 1, "n-step needs n >= 1");
        Self {
            n,
            gamma,
            pending: Default::default(),
        }
    }

    /// Adds the step (obs, action, reward -> next_obs) and appends the transitions it completes
    /// to `out`.
    pub fn push(
        &mut self,
        obs: &[f32],
        action: u8,
        reward: f32,
        next_obs: &[f32],
        end: StepEnd,
        out: &mut Vec<Transition>,
    ) {
        self.pending.push_back((obs.to_vec(), action, reward));
        if end == StepEnd::Terminal {
            while !self.pending.is_empty() {
                out.push(self.emit(next_obs, 0.0));
                self.pending.pop_front();
            }
        } else if end == StepEnd::Truncated {
            self.pending.clear();
        } else if self.pending.len() == self.n {
            let discount = self.gamma.powi(self.n as i32) as f32;
            out.push(self.emit(next_obs, discount));
            self.pending.pop_front();
        }
    }

    fn emit(&self, next_obs: &[f32], discount: f32) -> Transition {
        let ret = self
            .pending
            .iter()
            .enumerate()
            .map(|(k, (_, _, r))| self.gamma.powi(k as i32) * f64::from(*r))
            .sum::<f64>();
        let (obs, action, _) = &self.pending[0];
        Transition {
            obs: obs.clone(),
            action: *action,
            ret: ret as f32,
            next_obs: next_obs.to_vec(),
            discount,
        }
    }
}

/// A sampled batch on the host, ready to become tensors.
#[derive(Debug, Clone, PartialEq)]
pub struct HostBatch {
    /// Slots sampled (for priority updates).
    pub slots: Vec<usize>,
    /// `[batch * obs_dim]`.
    pub obs: Vec<f32>,
    /// `[batch]`.
    pub actions: Vec<i64>,
    /// `[batch]`.
    pub returns: Vec<f32>,
    /// `[batch * obs_dim]`.
    pub next_obs: Vec<f32>,
    /// `[batch]`.
    pub discounts: Vec<f32>,
    /// Importance weights, `[batch]` (all 1 for uniform replay).
    pub weights: Vec<f32>,
}

/// Fixed-capacity ring of transitions with uniform or proportional prioritized sampling.
pub struct Replay {
    capacity: usize,
    items: Vec<Transition>,
    next: usize,
    rng: u64,
    per: Option<(Prioritized, SumTree, f64)>,
}

impl Replay {
    /// An empty replay; `prioritized` switches on proportional prioritized sampling.
    pub fn new(capacity: usize, seed: u64, prioritized: Option<Prioritized>) -> Self {
        assert!(capacity > 0, "replay capacity must be positive");
        Self {
            capacity,
            items: Vec::with_capacity(capacity.min(1 << 20)),
            next: 0,
            rng: (seed ^ 0x5DEE_CE66_D1CE_5EED).max(1),
            per: prioritized.map(|p| (p, SumTree::new(capacity), 1.0)),
        }
    }

    /// Transitions held.
    pub fn len(&self) -> usize {
        self.items.len()
    }
    /// Whether none are held.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Adds a transition, replacing the oldest when full. New transitions get the largest
    /// priority seen so far, so each is sampled at least once soon.
    pub fn push(&mut self, t: Transition) {
        let slot = self.next;
        if self.items.len() < self.capacity {
            self.items.push(t);
        } else {
            self.items[slot] = t;
        }
        if let Some((_, tree, max_p)) = &mut self.per {
            tree.set(slot, *max_p);
        }
        self.next = (self.next + 1) % self.capacity;
    }

    /// xorshift64*: a seeded uniform in [0, 1) for sampling slots.
    fn uniform(&mut self) -> f64 {
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        (self.rng.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Samples `batch` transitions (with replacement). `update` is the learner's update count,
    /// which anneals the importance-weight exponent beta to 1.
    pub fn sample(&mut self, batch: usize, update: u64) -> HostBatch {
        assert!(!self.items.is_empty(), "cannot sample an empty replay");
        let n = self.items.len();
        let mut slots = Vec::with_capacity(batch);
        let mut weights = vec![1f32; batch];
        if self.per.is_some() {
            let total = self.per.as_ref().map_or(0.0, |(_, t, _)| t.total());
            for i in 0..batch {
                // Stratified: one draw per equal segment of the total priority.
                let u = (i as f64 + self.uniform()) * total / batch as f64;
                let tree = &self.per.as_ref().expect("prioritized").1;
                slots.push(tree.find(u).min(n - 1));
            }
            let (p, tree, _) = self.per.as_ref().expect("prioritized");
            let beta = (p.beta_start
                + (1.0 - p.beta_start) * (update as f64 / p.beta_steps.max(1) as f64))
                .min(1.0);
            let min_prob = tree.min_positive(n) / total;
            let max_w = (n as f64 * min_prob).powf(-beta);
            for (w, &s) in weights.iter_mut().zip(&slots) {
                let prob = tree.get(s) / total;
                *w = ((n as f64 * prob).powf(-beta) / max_w) as f32;
            }
        } else {
            for _ in 0..batch {
                slots.push(((self.uniform() * n as f64) as usize).min(n - 1));
            }
        }
        let mut b = HostBatch {
            slots: Vec::new(),
            obs: Vec::new(),
            actions: Vec::new(),
            returns: Vec::new(),
            next_obs: Vec::new(),
            discounts: Vec::new(),
            weights,
        };
        for &s in &slots {
            let t = &self.items[s];
            b.obs.extend_from_slice(&t.obs);
            b.actions.push(i64::from(t.action));
            b.returns.push(t.ret);
            b.next_obs.extend_from_slice(&t.next_obs);
            b.discounts.push(t.discount);
        }
        b.slots = slots;
        b
    }

    /// New priorities from the TD errors of a sampled batch (prioritized replay only).
    pub fn update_priorities(&mut self, slots: &[usize], td_errors: &[f32]) {
        if let Some((p, tree, max_p)) = &mut self.per {
            for (&s, &td) in slots.iter().zip(td_errors) {
                let pr = (f64::from(td.abs()) + p.eps).powf(p.alpha);
                *max_p = max_p.max(pr);
                tree.set(s, pr);
            }
        }
    }
}

const REPLAY_MAGIC: &[u8; 12] = b"FOXHUNT-RPL1";

impl Replay {
    /// The whole replay as bytes (transitions, write position, sampler state, priorities), so a
    /// resumed run samples exactly what an uninterrupted one would.
    ///
    /// Layout: magic `FOXHUNT-RPL1`, then little-endian u64 capacity, next, rng, len, obs_dim,
    /// f64 max priority (NaN without prioritized replay), then per transition obs, action (u8),
    /// return, next_obs, discount (f32s) and its priority (f64, prioritized only).
    pub fn to_bytes(&self) -> Vec<u8> {
        let dim = self.items.first().map_or(0, |t| t.obs.len());
        let mut b = REPLAY_MAGIC.to_vec();
        for v in [
            self.capacity as u64,
            self.next as u64,
            self.rng,
            self.items.len() as u64,
            dim as u64,
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        let max_p = self.per.as_ref().map_or(f64::NAN, |p| p.2);
        b.extend_from_slice(&max_p.to_le_bytes());
        for (i, t) in self.items.iter().enumerate() {
            t.obs
                .iter()
                .for_each(|v| b.extend_from_slice(&v.to_le_bytes()));
            b.push(t.action);
            b.extend_from_slice(&t.ret.to_le_bytes());
            t.next_obs
                .iter()
                .for_each(|v| b.extend_from_slice(&v.to_le_bytes()));
            b.extend_from_slice(&t.discount.to_le_bytes());
            if let Some((_, tree, _)) = &self.per {
                b.extend_from_slice(&tree.get(i).to_le_bytes());
            }
        }
        b
    }

    /// Rebuilds a replay written by [`Replay::to_bytes`] with the same capacity and prioritized
    /// setting; anything else is an error naming the problem.
    pub fn from_bytes(
        bytes: &[u8],
        capacity: usize,
        prioritized: Option<Prioritized>,
    ) -> Result<Self, crate::DqnError> {
        let bad = |m: &str| crate::DqnError::Config(format!("replay state: {m}"));
        let mut at = bytes
            .strip_prefix(REPLAY_MAGIC.as_slice())
            .ok_or_else(|| bad("bad magic"))?;
        let mut take = |n: usize| -> Result<&[u8], crate::DqnError> {
            if at.len() < n {
                return Err(bad("truncated"));
            }
            let (head, tail) = at.split_at(n);
            at = tail;
            Ok(head)
        };
        let mut u64s = [0u64; 5];
        for v in &mut u64s {
            *v = u64::from_le_bytes(take(8)?.try_into().expect("8 bytes"));
        }
        let [cap, next, rng, len, dim] = u64s.map(|v| v as usize);
        if cap != capacity || len > cap || next >= cap.max(1) {
            return Err(bad(&format!(
                "written for capacity {cap} (len {len}, next {next}), wanted {capacity}"
            )));
        }
        let max_p = f64::from_le_bytes(take(8)?.try_into().expect("8 bytes"));
        if max_p.is_nan() == prioritized.is_some() {
            return Err(bad("written with another prioritized-replay setting"));
        }
        let mut r = Replay::new(capacity, 0, prioritized);
        r.rng = rng as u64;
        r.next = next;
        let f32s = |b: &[u8]| -> Vec<f32> {
            b.chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
                .collect()
        };
        for i in 0..len {
            let obs = f32s(take(4 * dim)?);
            let action = take(1)?[0];
            let ret = f32s(take(4)?)[0];
            let next_obs = f32s(take(4 * dim)?);
            let discount = f32s(take(4)?)[0];
            r.items.push(Transition {
                obs,
                action,
                ret,
                next_obs,
                discount,
            });
            if let Some((_, tree, _)) = &mut r.per {
                tree.set(i, f64::from_le_bytes(take(8)?.try_into().expect("8 bytes")));
            }
        }
        if let Some((_, _, m)) = &mut r.per {
            *m = max_p;
        }
        if !at.is_empty() {
            return Err(bad("trailing bytes"));
        }
        Ok(r)
    }
}

/// Sum tree over priorities: O(log n) update and prefix-sum search.
struct SumTree {
    size: usize,
    nodes: Vec<f64>,
}

impl SumTree {
    fn new(capacity: usize) -> Self {
        let size = capacity.next_power_of_two();
        Self {
            size,
            nodes: vec![0.0; 2 * size],
        }
    }
    fn set(&mut self, slot: usize, p: f64) {
        let mut i = slot + self.size;
        self.nodes[i] = p;
        while i > 1 {
            i /= 2;
            self.nodes[i] = self.nodes[2 * i] + self.nodes[2 * i + 1];
        }
    }
    fn get(&self, slot: usize) -> f64 {
        self.nodes[slot + self.size]
    }
    fn total(&self) -> f64 {
        self.nodes[1]
    }
    /// The slot whose cumulative-priority interval holds `u`.
    fn find(&self, mut u: f64) -> usize {
        let mut i = 1;
        while i < self.size {
            if u < self.nodes[2 * i] || self.nodes[2 * i + 1] == 0.0 {
                i *= 2;
            } else {
                u -= self.nodes[2 * i];
                i = 2 * i + 1;
            }
        }
        i - self.size
    }
    fn min_positive(&self, n: usize) -> f64 {
        self.nodes[self.size..self.size + n]
            .iter()
            .copied()
            .filter(|&p| p > 0.0)
            .fold(f64::INFINITY, f64::min)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn n_step_returns_by_hand() {
        let mut acc = NStep::new(3, 0.5);
        let mut out = Vec::new();
        let o = |v: f32| vec![v];
        acc.push(&o(0.0), 1, 1.0, &o(1.0), StepEnd::Running, &mut out);
        acc.push(&o(1.0), 0, 2.0, &o(2.0), StepEnd::Running, &mut out);
        assert!(out.is_empty());
        acc.push(&o(2.0), 2, 3.0, &o(3.0), StepEnd::Running, &mut out);
        // 1 + 0.5 * 2 + 0.25 * 3 = 2.75, bootstrapped from obs 3 with 0.5^3.
        assert_eq!(
            out,
            vec![Transition {
                obs: o(0.0),
                action: 1,
                ret: 2.75,
                next_obs: o(3.0),
                discount: 0.125
            }]
        );
        acc.push(&o(3.0), 1, 4.0, &o(4.0), StepEnd::Terminal, &mut out);
        // Terminal: starts 1, 2, 3 flushed with discount 0: 2 + 1.5 + 1 = 4.5, 3 + 2 = 5, 4.
        let tail: Vec<(f32, f32, f32)> = out[1..]
            .iter()
            .map(|t| (t.obs[0], t.ret, t.discount))
            .collect();
        assert_eq!(
            tail,
            vec![(1.0, 4.5, 0.0), (2.0, 5.0, 0.0), (3.0, 4.0, 0.0)]
        );
        acc.push(&o(9.0), 0, 1.0, &o(10.0), StepEnd::Truncated, &mut out);
        assert_eq!(
            out.len(),
            4,
            "a truncated start is dropped, not bootstrapped from a reset state"
        );
    }

    #[test]
    fn replay_state_round_trips_and_samples_alike() {
        for per in [None, Some(Prioritized::default())] {
            let mut a = Replay::new(5, 9, per);
            for k in 0..7 {
                a.push(Transition {
                    obs: vec![k as f32, -1.0],
                    action: (k % 3) as u8,
                    ret: k as f32 * 0.5,
                    next_obs: vec![k as f32 + 1.0, 2.0],
                    discount: 0.9,
                });
            }
            a.update_priorities(&[1, 3], &[4.0, 0.5]);
            let mut b = Replay::from_bytes(&a.to_bytes(), 5, per).expect("round trip");
            assert_eq!(a.sample(16, 3), b.sample(16, 3));
            assert!(Replay::from_bytes(&a.to_bytes(), 6, per).is_err());
            let other = if per.is_some() {
                None
            } else {
                Some(Prioritized::default())
            };
            assert!(Replay::from_bytes(&a.to_bytes(), 5, other).is_err());
            let bytes = a.to_bytes();
            assert!(Replay::from_bytes(&bytes[..bytes.len() - 1], 5, per).is_err());
        }
    }

    #[test]
    fn prioritized_sampling_follows_priorities() {
        let p = Prioritized {
            alpha: 1.0,
            beta_start: 1.0,
            beta_steps: 1,
            eps: 0.0,
        };
        let mut r = Replay::new(4, 3, Some(p));
        for k in 0..4 {
            r.push(Transition {
                obs: vec![k as f32],
                action: 0,
                ret: 0.0,
                next_obs: vec![0.0],
                discount: 0.0,
            });
        }
        r.update_priorities(&[0, 1, 2, 3], &[1.0, 1.0, 1.0, 7.0]);
        let b = r.sample(1000, 0);
        let share = b.slots.iter().filter(|&&s| s == 3).count() as f64 / 1000.0;
        assert!(
            (share - 0.7).abs() < 0.03,
            "slot 3 holds 70% of the priority, sampled {share}"
        );
        // Importance weights: (N * P)^-beta normalized by the largest: slot 3 gets 1/7.
        let w3 = b
            .slots
            .iter()
            .zip(&b.weights)
            .find(|(s, _)| **s == 3)
            .map(|(_, w)| *w)
            .expect("sampled");
        assert!((w3 - 1.0 / 7.0).abs() < 1e-6);
        let mut u = Replay::new(8, 1, None);
        u.push(Transition {
            obs: vec![0.0],
            action: 0,
            ret: 1.0,
            next_obs: vec![0.0],
            discount: 0.5,
        });
        let b = u.sample(4, 0);
        assert_eq!(
            (b.weights, b.returns, b.discounts),
            (vec![1.0; 4], vec![1.0; 4], vec![0.5; 4])
        );
    }
}
