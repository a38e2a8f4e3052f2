//! The Q-network: an MLP over the flat observation with an optional dueling head and optional
//! layer norm.

use burn::module::{Module, ModuleVisitor, Param};
use burn::nn::{Initializer, LayerNorm, LayerNormConfig, Linear, LinearConfig};
use burn::tensor::activation::{gelu, relu};
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

use crate::config::{Activation, AgentConfig};

/// Q(s, .) for a batch of observations.
///
/// Shapes: input `[batch, obs_dim]`, output `[batch, actions]`.
#[derive(Module, Debug)]
pub struct QNetwork<B: Backend> {
    hidden: Vec<Linear<B>>,
    norms: Vec<LayerNorm<B>>,
    /// Q head, or the advantage head when dueling.
    head: Linear<B>,
    /// Value head (dueling only).
    value: Option<Linear<B>>,
    #[module(skip)]
    activation: Activation,
    #[module(skip)]
    full_f32: bool,
}

impl<B: Backend> QNetwork<B> {
    /// A freshly initialized network on `device`: dense layers drawn as burn's default
    /// (uniform in ±1/sqrt(fan_in), weights and biases) from a generator of this network's own,
    /// seeded with `cfg.seed`; layer norms start at scale 1, shift 0.
    ///
    /// burn's `Tensor::random` draws from one generator per backend, shared by every thread of
    /// the process: two networks built at the same time on two threads would take each other's
    /// numbers, and the same seed would not give the same network. A private generator does.
    pub fn init(cfg: &AgentConfig, device: &B::Device) -> Self {
        let mut rng = InitRng::new(cfg.seed);
        let mut hidden = Vec::new();
        let mut norms = Vec::new();
        let mut width = cfg.obs_dim;
        for &h in &cfg.hidden {
            hidden.push(rng.linear(width, h, device));
            if cfg.layer_norm {
                norms.push(LayerNormConfig::new(h).init(device));
            }
            width = h;
        }
        let head = rng.linear(width, cfg.actions, device);
        let value = cfg.dueling.then(|| rng.linear(width, 1, device));
        let net = Self {
            hidden,
            norms,
            head,
            value,
            activation: cfg.activation,
            full_f32: cfg.full_f32,
        };
        // burn initializes parameters lazily (the layer norms' here), and a clone of an
        // uninitialized parameter initializes on its own: make every value concrete now, so a
        // target network cloned from this one, or a recorded copy, is this network.
        net.visit(&mut Materialize);
        net
    }

    /// Q-values, `[batch, obs_dim] -> [batch, actions]`.
    pub fn forward(&self, obs: Tensor<B, 2>) -> Tensor<B, 2> {
        let mut x = obs;
        for (i, layer) in self.hidden.iter().enumerate() {
            x = self.dense(layer, x);
            if let Some(norm) = self.norms.get(i) {
                x = norm.forward(x);
            }
            x = match self.activation {
                Activation::Relu => relu(x),
                Activation::Tanh => x.tanh(),
                Activation::Gelu => gelu(x),
            };
        }
        let a = self.dense(&self.head, x.clone());
        match &self.value {
            Some(v) => dueling(self.dense(v, x), a),
            None => a,
        }
    }

    /// `x W + b`, `[batch, in] -> [batch, out]`: the backend's matmul, or with `full_f32` a
    /// broadcast product `[batch, in, out]` summed over `in`, which no backend computes in
    /// reduced precision.
    fn dense(&self, layer: &Linear<B>, x: Tensor<B, 2>) -> Tensor<B, 2> {
        if !self.full_f32 {
            return layer.forward(x);
        }
        let w = layer.weight.val();
        let y = (x.unsqueeze_dim::<3>(2) * w.unsqueeze_dim::<3>(0))
            .sum_dim(1)
            .squeeze_dim::<2>(1);
        match &layer.bias {
            Some(b) => y + b.val().unsqueeze_dim(0),
            None => y,
        }
    }
}

/// SplitMix64: the network's own seeded generator for its initial weights.
struct InitRng(u64);

impl InitRng {
    fn new(seed: u64) -> Self {
        Self(seed ^ 0x6A09_E667_F3BC_C908)
    }

    /// Uniform in `[-bound, bound)`.
    fn uniform(&mut self, bound: f64) -> f32 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        let u = (z >> 11) as f64 / (1u64 << 53) as f64;
        ((2.0 * u - 1.0) * bound) as f32
    }

    /// A dense layer `[d_in, d_out]` with burn's default bound 1/sqrt(d_in) for weights and
    /// biases (Kaiming uniform with gain 1/sqrt(3)).
    fn linear<B: Backend>(&mut self, d_in: usize, d_out: usize, device: &B::Device) -> Linear<B> {
        let bound = 1.0 / (d_in as f64).sqrt();
        let weight: Vec<f32> = (0..d_in * d_out).map(|_| self.uniform(bound)).collect();
        let bias: Vec<f32> = (0..d_out).map(|_| self.uniform(bound)).collect();
        // Zeros: the lazy initializer that is replaced at once never draws random numbers.
        let mut layer = LinearConfig::new(d_in, d_out)
            .with_initializer(Initializer::Zeros)
            .init(device);
        layer.weight = Param::from_tensor(Tensor::from_data(
            TensorData::new(weight, [d_in, d_out]),
            device,
        ));
        layer.bias = Some(Param::from_tensor(Tensor::from_data(
            TensorData::new(bias, [d_out]),
            device,
        )));
        layer
    }
}

/// Forces each parameter's lazy initialization.
struct Materialize;
impl<B: Backend> ModuleVisitor<B> for Materialize {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let _ = param.val();
    }
}

/// Q = V + A - mean(A): `[batch, 1]`, `[batch, actions]` -> `[batch, actions]`.
pub fn dueling<B: Backend>(value: Tensor<B, 2>, advantage: Tensor<B, 2>) -> Tensor<B, 2> {
    let mean = advantage.clone().mean_dim(1);
    value + advantage - mean
}

/// A dense layer on the host: `weight` row-major `[d_in, d_out]` as burn stores it.
#[derive(Debug, Clone)]
struct HostLinear {
    weight: Vec<f32>,
    bias: Option<Vec<f32>>,
    d_in: usize,
    d_out: usize,
    /// A narrow layer's weights with each input's row padded to [`NARROW`] (a head's few
    /// outputs summed side by side for several rows at once); empty for wider layers.
    narrow: Vec<f32>,
}

/// Outputs a narrow layer has at most.
const NARROW: usize = 4;

impl HostLinear {
    fn new(weight: Vec<f32>, bias: Option<Vec<f32>>, d_in: usize, d_out: usize) -> Self {
        let narrow = if d_out <= NARROW {
            let mut w = vec![0.0; d_in * NARROW];
            for (dst, src) in w.chunks_exact_mut(NARROW).zip(weight.chunks_exact(d_out)) {
                dst[..d_out].copy_from_slice(src);
            }
            w
        } else {
            Vec::new()
        };
        Self {
            weight,
            bias,
            d_in,
            d_out,
            narrow,
        }
    }

    fn from_burn<B: Backend>(l: &Linear<B>) -> Self {
        let w = l.weight.val();
        let [d_in, d_out] = w.dims();
        Self::new(
            w.into_data().iter::<f32>().collect(),
            l.bias
                .as_ref()
                .map(|b| b.val().into_data().iter::<f32>().collect()),
            d_in,
            d_out,
        )
    }
    fn forward(&self, x: &[f32], out: &mut Vec<f32>) {
        out.clear();
        match &self.bias {
            Some(b) => out.extend_from_slice(b),
            None => out.resize(self.d_out, 0.0),
        }
        // Row by row of the weight: contiguous, so the inner loop vectorizes.
        for (i, &xi) in x.iter().enumerate().take(self.d_in) {
            let row = &self.weight[i * self.d_out..(i + 1) * self.d_out];
            for (o, w) in out.iter_mut().zip(row) {
                *o += xi * w;
            }
        }
    }
}

impl HostLinear {
    fn from_parts(weight: Vec<f32>, bias: Vec<f32>, d_in: usize, d_out: usize) -> Self {
        Self::new(weight, Some(bias), d_in, d_out)
    }

    /// `rows` rows at once (`x` rows x d_in, `out` rows x d_out), each output the same sum as
    /// [`HostLinear::forward`]'s (bias first, then the inputs in order).
    fn forward_rows(&self, x: &[f32], rows: usize, out: &mut Vec<f32>, nonzero: &mut Vec<u32>) {
        out.clear();
        for _ in 0..rows {
            match &self.bias {
                Some(b) => out.extend_from_slice(b),
                None => out.extend(std::iter::repeat_n(0.0, self.d_out)),
            }
        }
        if self.narrow.is_empty() {
            dense_rows(&self.weight, self.d_in, self.d_out, x, rows, out, nonzero);
        } else {
            narrow_rows(&self.narrow, self.d_in, self.d_out, x, rows, out);
        }
    }
}

/// [`dense_rows`] for a narrow layer (at most [`NARROW`] outputs), from its padded weights
/// `w`: several rows advance together through the inputs, each row's outputs side by side in
/// one short vector, all in registers; each output still its own sum in input order.
#[multiversion::multiversion(targets("x86_64+avx512f", "x86_64+avx2"))]
fn narrow_rows(w: &[f32], d_in: usize, d_out: usize, x: &[f32], rows: usize, out: &mut [f32]) {
    let mut r0 = 0;
    while r0 < rows {
        r0 += match rows - r0 {
            8.. => narrow_group::<8>(w, d_in, d_out, x, r0, out),
            4.. => narrow_group::<4>(w, d_in, d_out, x, r0, out),
            2.. => narrow_group::<2>(w, d_in, d_out, x, r0, out),
            _ => narrow_group::<1>(w, d_in, d_out, x, r0, out),
        };
    }
}

/// Rows `r0..r0 + G` of [`narrow_rows`]; returns `G`.
#[inline(always)]
fn narrow_group<const G: usize>(
    w: &[f32],
    d_in: usize,
    d_out: usize,
    x: &[f32],
    r0: usize,
    out: &mut [f32],
) -> usize {
    let mut acc = [[0f32; NARROW]; G];
    for (r, a) in acc.iter_mut().enumerate() {
        a[..d_out].copy_from_slice(&out[(r0 + r) * d_out..(r0 + r + 1) * d_out]);
    }
    let xs: [&[f32]; G] = std::array::from_fn(|r| &x[(r0 + r) * d_in..(r0 + r + 1) * d_in]);
    for (i, wi) in w.chunks_exact(NARROW).enumerate().take(d_in) {
        let wi: &[f32; NARROW] = wi.try_into().expect("a padded row");
        for (a, xr) in acc.iter_mut().zip(&xs) {
            let u = xr[i];
            for k in 0..NARROW {
                a[k] += u * wi[k];
            }
        }
    }
    for (r, a) in acc.iter().enumerate() {
        out[(r0 + r) * d_out..(r0 + r + 1) * d_out].copy_from_slice(&a[..d_out]);
    }
    G
}

/// `out[r][o] += x[r][i] * w[i][o]` over the inputs i in order, for every row r and output o.
/// Compiled for the widest vectors the processor has (chosen at run time). A row at a time: its
/// non-zero inputs are listed first, without a branch (after ReLU about half are zero, in no
/// pattern a branch predictor could learn), then each tile of outputs keeps its sums in
/// registers while the listed inputs stream past. Each output is still its own sum of products
/// in input order, each product and sum rounded alone (Rust never fuses a multiply and an add);
/// a zero input would only add zeros, so passing over it changes at most a zero's sign, which no
/// comparison reads. `nonzero` is scratch.
#[multiversion::multiversion(targets("x86_64+avx512f", "x86_64+avx2"))]
fn dense_rows(
    weight: &[f32],
    d_in: usize,
    d_out: usize,
    x: &[f32],
    rows: usize,
    out: &mut [f32],
    nonzero: &mut Vec<u32>,
) {
    nonzero.clear();
    nonzero.resize(d_in, 0);
    for (xr, yr) in x
        .chunks_exact(d_in)
        .zip(out.chunks_exact_mut(d_out))
        .take(rows)
    {
        let mut n = 0;
        for (i, &u) in xr.iter().enumerate() {
            nonzero[n] = i as u32;
            n += usize::from(u != 0.0);
        }
        let list = &nonzero[..n];
        let mut o0 = 0;
        o0 = tiles::<128>(weight, d_out, xr, list, yr, o0);
        o0 = tiles::<64>(weight, d_out, xr, list, yr, o0);
        o0 = tiles::<32>(weight, d_out, xr, list, yr, o0);
        o0 = tiles::<16>(weight, d_out, xr, list, yr, o0);
        for (o, y) in yr.iter_mut().enumerate().skip(o0) {
            let mut acc = *y;
            for &i in list {
                acc += xr[i as usize] * weight[i as usize * d_out + o];
            }
            *y = acc;
        }
    }
}

/// Outputs `o0..` of one row in tiles of `N` while whole tiles fit: each tile's sums in
/// registers over the listed inputs. Returns the first output left.
#[inline(always)]
fn tiles<const N: usize>(
    weight: &[f32],
    d_out: usize,
    xr: &[f32],
    list: &[u32],
    yr: &mut [f32],
    mut o0: usize,
) -> usize {
    while o0 + N <= d_out {
        let dst = &mut yr[o0..o0 + N];
        let mut a: [f32; N] = (&*dst).try_into().expect("a whole tile");
        for &i in list {
            let i = i as usize;
            let u = xr[i];
            let w: &[f32; N] = weight[i * d_out + o0..i * d_out + o0 + N]
                .try_into()
                .expect("a whole tile");
            for k in 0..N {
                a[k] += u * w[k];
            }
        }
        dst.copy_from_slice(&a);
        o0 += N;
    }
    o0
}

/// The Q-network's forward pass on the host for one observation at a time, from a snapshot of
/// the weights: no tensor allocation or dispatch per call, for backtests that decide bar by bar.
/// Agrees with [`QNetwork::forward`] to f32 rounding (summation order differs).
#[derive(Debug, Clone)]
pub struct HostQNetwork {
    hidden: Vec<HostLinear>,
    norms: Vec<(Vec<f32>, Option<Vec<f32>>)>,
    head: HostLinear,
    value: Option<HostLinear>,
    activation: Activation,
    a: Vec<f32>,
    b: Vec<f32>,
    /// Scratch of [`dense_rows`].
    nonzero: Vec<u32>,
}

/// Layer norm of one row in place: population variance, eps 1e-5, as burn (sums in order).
fn normalize(row: &mut [f32], gamma: &[f32], beta: Option<&[f32]>) {
    let n = row.len() as f32;
    let mean = row.iter().sum::<f32>() / n;
    let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n;
    let inv = 1.0 / (var + 1e-5).sqrt();
    for (k, v) in row.iter_mut().enumerate() {
        *v = (*v - mean) * inv * gamma[k] + beta.map_or(0.0, |bt| bt[k]);
    }
}

/// The hidden activation of one row in place.
fn activate(row: &mut [f32], activation: Activation) {
    for v in row.iter_mut() {
        *v = match activation {
            Activation::Relu => v.max(0.0),
            Activation::Tanh => v.tanh(),
            Activation::Gelu => 0.5 * *v * (1.0 + erf(*v / std::f32::consts::SQRT_2)),
        };
    }
}

/// Dueling's Q = V + A - mean(A), over one row of advantages in place.
fn dueling_row(value: f32, adv: &mut [f32]) {
    let mean = adv.iter().sum::<f32>() / adv.len() as f32;
    for a in adv.iter_mut() {
        *a = value + *a - mean;
    }
}

/// The first of the largest values (what greedy takes on ties).
fn first_max(q: &[f32]) -> usize {
    let mut best = 0;
    for (k, v) in q.iter().enumerate() {
        if *v > q[best] {
            best = k;
        }
    }
    best
}

/// erf to about 1.2e-7 (Numerical Recipes' erfc by Chebyshev fit), for GELU on the host.
fn erf(x: f32) -> f32 {
    let z = f64::from(x.abs());
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -z * z - 1.265_512_23
        + t * (1.000_023_68
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_203_98
                                + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let erfc = t * poly.exp();
    let v = (1.0 - erfc) as f32;
    if x >= 0.0 { v } else { -v }
}

impl HostQNetwork {
    /// Q-values of one observation `[obs_dim]` into `q` `[actions]`.
    pub fn forward(&mut self, obs: &[f32], q: &mut [f32]) {
        let (mut a, mut b) = (std::mem::take(&mut self.a), std::mem::take(&mut self.b));
        a.clear();
        a.extend_from_slice(obs);
        for (i, layer) in self.hidden.iter().enumerate() {
            layer.forward(&a, &mut b);
            if let Some((gamma, beta)) = self.norms.get(i) {
                normalize(&mut b, gamma, beta.as_deref());
            }
            activate(&mut b, self.activation);
            std::mem::swap(&mut a, &mut b);
        }
        self.head.forward(&a, &mut b);
        if let Some(v) = &self.value {
            let mut val = Vec::with_capacity(1);
            v.forward(&a, &mut val);
            dueling_row(val[0], &mut b);
        }
        q.copy_from_slice(&b[..q.len()]);
        (self.a, self.b) = (a, b);
    }

    /// Inputs an observation holds.
    pub fn obs_dim(&self) -> usize {
        self.hidden.first().unwrap_or(&self.head).d_in
    }

    /// Actions (outputs).
    pub fn actions(&self) -> usize {
        self.head.d_out
    }

    /// The greedy actions of `rows` observations (`obs` rows x obs_dim) into `actions`: each the
    /// action [`HostQNetwork::greedy`] gives that observation alone (the same sums in the same
    /// order), with every weight read once per call instead of once per row.
    pub fn greedy_rows(&mut self, obs: &[f32], rows: usize, actions: &mut [usize]) {
        let (mut a, mut b) = (std::mem::take(&mut self.a), std::mem::take(&mut self.b));
        a.clear();
        a.extend_from_slice(&obs[..rows * self.obs_dim()]);
        for (i, layer) in self.hidden.iter().enumerate() {
            layer.forward_rows(&a, rows, &mut b, &mut self.nonzero);
            for row in b.chunks_exact_mut(layer.d_out) {
                if let Some((gamma, beta)) = self.norms.get(i) {
                    normalize(row, gamma, beta.as_deref());
                }
                activate(row, self.activation);
            }
            std::mem::swap(&mut a, &mut b);
        }
        let n = self.head.d_out;
        self.head.forward_rows(&a, rows, &mut b, &mut self.nonzero);
        let mut val = Vec::new();
        if let Some(v) = &self.value {
            v.forward_rows(&a, rows, &mut val, &mut self.nonzero);
        }
        for (r, q) in b.chunks_exact_mut(n).enumerate() {
            if self.value.is_some() {
                dueling_row(val[r], q);
            }
            actions[r] = first_max(q);
        }
        (self.a, self.b) = (a, b);
    }

    /// The greedy action of one observation (the first of equal maxima).
    pub fn greedy(&mut self, obs: &[f32]) -> usize {
        let mut q = vec![0f32; self.head.d_out];
        self.forward(obs, &mut q);
        first_max(&q)
    }
}

impl HostQNetwork {
    /// The network of `cfg` with parameters `params`, flat in `AgentState` order (hidden
    /// layers' weights and biases, the layer norms' scales and shifts, the head, the value
    /// head), as an agent exports them.
    ///
    /// # Panics
    /// When `params` is not of `cfg`'s size (a programmer error).
    pub fn from_flat(cfg: &AgentConfig, params: &[f32]) -> Self {
        let mut rest = params;
        let mut take = |n: usize| {
            let (v, tail) = rest.split_at(n);
            rest = tail;
            v.to_vec()
        };
        let mut width = cfg.obs_dim;
        let mut hidden = Vec::new();
        for &h in &cfg.hidden {
            hidden.push(HostLinear::from_parts(take(width * h), take(h), width, h));
            width = h;
        }
        let norms = if cfg.layer_norm {
            cfg.hidden
                .iter()
                .map(|&h| (take(h), Some(take(h))))
                .collect()
        } else {
            Vec::new()
        };
        let head = HostLinear::from_parts(
            take(width * cfg.actions),
            take(cfg.actions),
            width,
            cfg.actions,
        );
        let value = cfg
            .dueling
            .then(|| HostLinear::from_parts(take(width), take(1), width, 1));
        assert!(rest.is_empty(), "parameters of another network");
        Self {
            hidden,
            norms,
            head,
            value,
            activation: cfg.activation,
            a: Vec::new(),
            b: Vec::new(),
            nonzero: Vec::new(),
        }
    }
}

impl<B: Backend> QNetwork<B> {
    /// A host snapshot of the weights for one-observation forwards (see [`HostQNetwork`]).
    pub fn to_host(&self) -> HostQNetwork {
        HostQNetwork {
            hidden: self.hidden.iter().map(HostLinear::from_burn).collect(),
            norms: self
                .norms
                .iter()
                .map(|n| {
                    (
                        n.gamma.val().into_data().iter::<f32>().collect(),
                        n.beta
                            .as_ref()
                            .map(|b| b.val().into_data().iter::<f32>().collect()),
                    )
                })
                .collect(),
            head: HostLinear::from_burn(&self.head),
            value: self.value.as_ref().map(HostLinear::from_burn),
            activation: self.activation,
            a: Vec::new(),
            b: Vec::new(),
            nonzero: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Many rows at once give every output the one-row forward's value exactly, whatever mix
    /// of two-row, one-row and narrow tiles the row count and width take, with
    /// inputs that are zero in some rows (ReLU's) and in all.
    #[test]
    fn rows_at_once_sum_as_one_row_at_a_time() {
        // Every tile width (128, 64, 32, 16) and a remainder; a head's narrow layer.
        for d_out in [128 + 64 + 32 + 16 + 13, 3] {
            rows_at_once_sum_as_one_row_at_a_time_for(d_out);
        }
    }

    fn rows_at_once_sum_as_one_row_at_a_time_for(d_out: usize) {
        let d_in = 37;
        let weight: Vec<f32> = (0..d_in * d_out)
            .map(|i| ((i * 7919 % 1013) as f32 / 1013.0 - 0.5) * 0.3)
            .collect();
        let bias: Vec<f32> = (0..d_out).map(|o| (o as f32 * 0.11).cos()).collect();
        let layer = HostLinear::from_parts(weight, bias, d_in, d_out);
        for rows in 1..=11 {
            let x: Vec<f32> = (0..rows * d_in)
                .map(|k| {
                    let (r, i) = (k / d_in, k % d_in);
                    // Input 5 is zero in every row; others zero in some rows.
                    if i == 5 || (i + r) % 3 == 0 {
                        0.0
                    } else {
                        (k as f32 * 0.37).sin() * 2.0
                    }
                })
                .collect();
            let mut all = Vec::new();
            layer.forward_rows(&x, rows, &mut all, &mut Vec::new());
            let mut one = Vec::new();
            for r in 0..rows {
                layer.forward(&x[r * d_in..(r + 1) * d_in], &mut one);
                assert_eq!(
                    &all[r * d_out..(r + 1) * d_out],
                    &one[..],
                    "{rows} rows, row {r}"
                );
            }
        }
    }
}
