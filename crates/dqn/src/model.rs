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
}

impl HostLinear {
    fn from_burn<B: Backend>(l: &Linear<B>) -> Self {
        let w = l.weight.val();
        let [d_in, d_out] = w.dims();
        Self {
            weight: w.into_data().iter::<f32>().collect(),
            bias: l
                .bias
                .as_ref()
                .map(|b| b.val().into_data().iter::<f32>().collect()),
            d_in,
            d_out,
        }
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
                let n = b.len() as f32;
                let mean = b.iter().sum::<f32>() / n;
                let var = b.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n;
                let inv = 1.0 / (var + 1e-5).sqrt();
                for (k, v) in b.iter_mut().enumerate() {
                    *v = (*v - mean) * inv * gamma[k] + beta.as_ref().map_or(0.0, |bt| bt[k]);
                }
            }
            for v in b.iter_mut() {
                *v = match self.activation {
                    Activation::Relu => v.max(0.0),
                    Activation::Tanh => v.tanh(),
                    Activation::Gelu => 0.5 * *v * (1.0 + erf(*v / std::f32::consts::SQRT_2)),
                };
            }
            std::mem::swap(&mut a, &mut b);
        }
        self.head.forward(&a, &mut b);
        if let Some(v) = &self.value {
            let mut val = Vec::with_capacity(1);
            v.forward(&a, &mut val);
            let mean = b.iter().sum::<f32>() / b.len() as f32;
            for (o, adv) in q.iter_mut().zip(&b) {
                *o = val[0] + adv - mean;
            }
        } else {
            q.copy_from_slice(&b[..q.len()]);
        }
        (self.a, self.b) = (a, b);
    }

    /// The greedy action of one observation (the first of equal maxima).
    pub fn greedy(&mut self, obs: &[f32]) -> usize {
        let mut q = vec![0f32; self.head.d_out];
        self.forward(obs, &mut q);
        let mut best = 0;
        for (k, v) in q.iter().enumerate() {
            if *v > q[best] {
                best = k;
            }
        }
        best
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
        }
    }
}
