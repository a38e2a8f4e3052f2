//! The Q-network: an MLP over the flat observation with an optional dueling head and optional
//! layer norm.

use burn::module::{Module, ModuleVisitor, Param};
use burn::nn::{LayerNorm, LayerNormConfig, Linear, LinearConfig};
use burn::tensor::Tensor;
use burn::tensor::activation::{gelu, relu};
use burn::tensor::backend::Backend;

use crate::config::{Activation, DqnConfig};

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
}

impl<B: Backend> QNetwork<B> {
    /// A freshly initialized network on `device` (burn's default initializers, seeded by the
    /// backend's seed).
    pub fn init(cfg: &DqnConfig, device: &B::Device) -> Self {
        let mut hidden = Vec::new();
        let mut norms = Vec::new();
        let mut width = cfg.obs_dim;
        for &h in &cfg.hidden {
            hidden.push(LinearConfig::new(width, h).init(device));
            if cfg.layer_norm {
                norms.push(LayerNormConfig::new(h).init(device));
            }
            width = h;
        }
        let net = Self {
            hidden,
            norms,
            head: LinearConfig::new(width, cfg.actions).init(device),
            value: cfg
                .dueling
                .then(|| LinearConfig::new(width, 1).init(device)),
            activation: cfg.activation,
        };
        // burn initializes parameters lazily, and a clone of an uninitialized parameter draws
        // its own random values: a target network cloned now would not equal the online one,
        // and a recorded copy would not equal the network in use. Draw every value now.
        net.visit(&mut Materialize);
        net
    }

    /// Q-values, `[batch, obs_dim] -> [batch, actions]`.
    pub fn forward(&self, obs: Tensor<B, 2>) -> Tensor<B, 2> {
        let mut x = obs;
        for (i, layer) in self.hidden.iter().enumerate() {
            x = layer.forward(x);
            if let Some(norm) = self.norms.get(i) {
                x = norm.forward(x);
            }
            x = match self.activation {
                Activation::Relu => relu(x),
                Activation::Tanh => x.tanh(),
                Activation::Gelu => gelu(x),
            };
        }
        let a = self.head.forward(x.clone());
        match &self.value {
            Some(v) => dueling(v.forward(x), a),
            None => a,
        }
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

impl<B: Backend> QNetwork<B> {
    /// The same weights on another backend (through burn's full-precision record), e.g. a copy
    /// on the CPU of a network trained on the GPU, for evaluation bar by bar where a device
    /// round trip per bar would dominate.
    pub fn to_backend<B2: Backend>(
        &self,
        cfg: &DqnConfig,
        device: &B2::Device,
    ) -> Result<QNetwork<B2>, crate::DqnError> {
        use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
        let rec = BinBytesRecorder::<FullPrecisionSettings>::default();
        let err = |e: burn::record::RecorderError| {
            crate::DqnError::Config(format!("copying the network between backends: {e}"))
        };
        let bytes = Recorder::<B>::record(&rec, self.clone().into_record(), ()).map_err(err)?;
        let record = Recorder::<B2>::load(&rec, bytes, device).map_err(err)?;
        Ok(QNetwork::<B2>::init(cfg, device).load_record(record))
    }
}
