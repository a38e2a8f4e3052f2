//! Gradients of the TD loss against central finite differences, in f64. A test binary of its
//! own: burn 0.21 keeps one default float dtype per device, and NdArray<f32> and NdArray<f64>
//! share the CPU device, so in a process where f32 tests ran first this check would silently
//! run in f32.

use burn::backend::{Autodiff, NdArray};
use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::backend::Backend;
use burn::tensor::{ElementConversion, Int, Tensor, TensorData};
use foxhunt_dqn::agent::td_loss;
use foxhunt_dqn::config::{Activation, Loss};
use foxhunt_dqn::{AgentConfig, DqnConfig, QNetwork};

/// Adds `h` to element `index` of the `which`-th float parameter.
struct Nudge {
    which: usize,
    index: usize,
    h: f64,
    seen: usize,
}
impl<Bk: Backend> ModuleMapper<Bk> for Nudge {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<Bk, D>>) -> Param<Tensor<Bk, D>> {
        let (id, t, mapper) = param.consume();
        let k = self.seen;
        self.seen += 1;
        if k != self.which {
            return Param::from_mapped_value(id, t, mapper);
        }
        let shape = t.shape();
        let mut v = t.into_data().convert::<f64>().to_vec::<f64>().expect("f64");
        v[self.index] += self.h;
        let dev = Default::default();
        Param::from_mapped_value(
            id,
            Tensor::<Bk, 1>::from_data(TensorData::new(v, [shape.num_elements()]), &dev)
                .reshape(shape),
            mapper,
        )
    }
}

/// The ids of the float parameters in visiting order.
struct Ids(Vec<burn::module::ParamId>);
impl<Bk: Backend> ModuleVisitor<Bk> for Ids {
    fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<Bk, D>>) {
        self.0.push(p.id);
    }
}

#[test]
fn gradients_agree_with_finite_differences() {
    type F = Autodiff<NdArray<f64>>;
    let d = Default::default();
    let cfg = AgentConfig {
        obs_dim: 3,
        actions: 2,
        dqn: DqnConfig {
            hidden: vec![4],
            activation: Activation::Tanh,
            layer_norm: true,
            dueling: true,
            ..DqnConfig::default()
        },
        ..AgentConfig::default()
    };
    F::seed(&d, 11);
    let net = QNetwork::<F>::init(&cfg, &d);
    // from_floats would store f32; f64 data keeps the whole check in double precision.
    let obs = Tensor::<F, 2>::from_data(
        TensorData::from([[0.3f64, -1.2, 0.5], [1.1, 0.4, -0.7], [-0.2, 0.9, 0.8]]),
        &d,
    );
    let actions = Tensor::<F, 1, Int>::from_ints([1, 0, 1], &d);
    let y = Tensor::<F, 1>::from_data(TensorData::from([0.5f64, -0.25, 2.0]), &d);
    let loss = |net: &QNetwork<F>| {
        let q = net
            .forward(obs.clone())
            .gather(1, actions.clone().unsqueeze_dim(1))
            .squeeze_dim::<1>(1);
        td_loss(q - y.clone(), Loss::Huber { delta: 1.0 }).mean()
    };
    let grads = GradientsParams::from_grads(loss(&net).backward(), &net);
    let mut ids = Ids(Vec::new());
    net.visit(&mut ids);
    let h = 1e-6;
    let mut checked = 0;
    for (which, id) in ids.0.iter().enumerate() {
        let as_f64 = |d: TensorData| {
            assert_eq!(
                d.dtype,
                burn::tensor::DType::F64,
                "the check must run in f64"
            );
            d.to_vec::<f64>().expect("f64")
        };
        let Some(g) = grads
            .get::<NdArray<f64>, 2>(*id)
            .map(|g| as_f64(g.into_data()))
            .or_else(|| {
                grads
                    .get::<NdArray<f64>, 1>(*id)
                    .map(|g| as_f64(g.into_data()))
            })
        else {
            continue;
        };
        for index in [0, g.len() / 2, g.len() - 1] {
            let at = |h: f64| {
                loss(&net.clone().map(&mut Nudge {
                    which,
                    index,
                    h,
                    seen: 0,
                }))
                .into_scalar()
                .elem::<f64>()
            };
            let fd = (at(h) - at(-h)) / (2.0 * h);
            assert!(
                (fd - g[index]).abs() < 1e-6 + 1e-4 * fd.abs(),
                "param {which}[{index}]: analytic {} vs numeric {fd}",
                g[index]
            );
            checked += 1;
        }
    }
    assert!(
        checked >= 18,
        "every layer's parameters were checked ({checked})"
    );
}
