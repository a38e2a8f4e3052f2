//! A population of agents per window: seeds (`agents`) times a grid of settings (`sweep`), each
//! member an ordinary agent with settings of its own, all trained on the window's one arena;
//! the best member on validation (by `select`) is the one tested, and optionally the majority
//! vote of the best few (`ensemble`) is tested as one more policy.
//!
//! A member's settings are the run's with the sweep's values laid over them at their TOML keys
//! and its seed: so member i of a population trains exactly as a standalone run with those
//! settings (the same seeds per window and epoch, the same engine), which the trainer's tests
//! check bit for bit.

use std::collections::BTreeMap;

use foxhunt_dqn::model::HostQNetwork;
use foxhunt_env::backtest::Decision;
use foxhunt_env::{EnvConfig, Metrics, Policy};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{TrainConfig, TrainError};

/// How the best (agent, epoch) of a window is chosen on validation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum Select {
    /// Net PnL of the validation split (default).
    #[default]
    Pnl,
    /// Sharpe ratio of the validation split's daily PnL; a split without one (no variation)
    /// scores below every split with one.
    Sharpe,
}

impl Select {
    /// The score of validation metrics `m`: higher is better.
    pub fn score(self, m: &Metrics) -> f64 {
        match self {
            Select::Pnl => m.total_pnl,
            Select::Sharpe => m.sharpe.unwrap_or(f64::NEG_INFINITY),
        }
    }
}

/// Settings that define how results are judged or how the run is laid out: the same for
/// every member, so they cannot be swept.
const FIXED: [&str; 7] = [
    "agents", "sweep", "select", "ensemble", "device", "capital", "costs",
];

/// The grid of a population: setting (its TOML key, dotted: `dqn.lr`, `env.lookback`) -> the
/// values it takes. In TOML a table whose leaves are lists (`[sweep]` then `dqn.lr = [1e-3,
/// 3e-4]`); on the command line `--sweep dqn.lr=1e-3,3e-4`. Keys are kept sorted: the
/// population's order is the grid's in key order, the last key varying fastest, then seeds.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Sweep(BTreeMap<String, Vec<Value>>);

impl Sweep {
    /// Whether no setting is swept.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Grid points (the product of the value counts; 1 for no sweep).
    pub fn points(&self) -> usize {
        self.0.values().map(Vec::len).product()
    }

    /// Sets `key`'s values (replacing earlier ones: a flag over the config file).
    pub fn set(&mut self, key: String, values: Vec<Value>) {
        self.0.insert(key, values);
    }

    /// Reads one `--sweep KEY=V1,V2,...`. Each value is a TOML value (`1e-3`, `true`, `[64,
    /// 64]`, `{kind = "soft", tau = 0.01}`) or a bare word taken as a string (`tanh`); commas
    /// inside brackets, braces or quotes do not split.
    pub fn parse_flag(text: &str) -> Result<(String, Vec<Value>), TrainError> {
        let bad = |m: String| TrainError::Options(format!("--sweep {text}: {m}"));
        let (key, list) = text
            .split_once('=')
            .ok_or_else(|| bad("expected KEY=V1,V2,... (e.g. dqn.lr=0.001,0.0003)".into()))?;
        let key = key.trim();
        let mut values = Vec::new();
        for item in split_top(list) {
            let item = item.trim();
            if item.is_empty() {
                return Err(bad("an empty value".into()));
            }
            let v = match toml::from_str::<toml::Table>(&format!("v = {item}")) {
                Ok(mut t) => t.remove("v").expect("the one key written"),
                Err(_)
                    if item
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "-_".contains(c)) =>
                {
                    toml::Value::String(item.to_string())
                }
                Err(e) => return Err(bad(format!("`{item}` is not a value: {}", e.message()))),
            };
            values.push(serde_json::to_value(v).map_err(|e| bad(e.to_string()))?);
        }
        Ok((key.to_string(), values))
    }
}

/// `text` split at the commas outside brackets, braces and quotes.
fn split_top(text: &str) -> Vec<&str> {
    let (mut depth, mut quote, mut start, mut out) = (0i32, None, 0, Vec::new());
    for (i, c) in text.char_indices() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '"' | '\'') => quote = Some(c),
            (None, '[' | '{') => depth += 1,
            (None, ']' | '}') => depth -= 1,
            (None, ',') if depth == 0 => {
                out.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&text[start..]);
    out
}

impl Serialize for Sweep {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl<'de> Deserialize<'de> for Sweep {
    /// A table whose leaves are lists of values, at any depth: `[sweep] dqn.lr = [..]` (a
    /// nested table in TOML) and `{"dqn.lr": [..]}` (config.json) give the same sweep.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        fn leaves(
            prefix: &str,
            v: Value,
            out: &mut BTreeMap<String, Vec<Value>>,
        ) -> Result<(), String> {
            match v {
                Value::Object(m) => {
                    for (k, v) in m {
                        let key = if prefix.is_empty() {
                            k
                        } else {
                            format!("{prefix}.{k}")
                        };
                        leaves(&key, v, out)?;
                    }
                    Ok(())
                }
                Value::Array(values) => {
                    out.insert(prefix.to_string(), values);
                    Ok(())
                }
                other => Err(format!(
                    "sweep: `{prefix}` takes a list of values (e.g. [{other}]), got {other}"
                )),
            }
        }
        let mut out = BTreeMap::new();
        leaves("", Value::deserialize(d)?, &mut out).map_err(serde::de::Error::custom)?;
        Ok(Sweep(out))
    }
}

/// One agent of a population.
#[derive(Debug, Clone)]
pub struct Member {
    /// Position in the population (grid point, then seed).
    pub index: usize,
    /// The swept settings' values of this member (TOML key -> value); its seed is in `cfg`.
    pub settings: BTreeMap<String, Value>,
    /// The member's whole configuration: what a standalone run with the same results takes.
    pub cfg: TrainConfig,
}

/// The population `cfg` asks for: `points x agents` members, each with its settings and the
/// seed `cfg.seed + s` for seed number `s`. A population of one is `cfg` itself (with the
/// population's own settings cleared). Refuses unknown or fixed keys, empty value lists, a
/// value listed twice, values a setting cannot take (naming the member's settings), and an
/// ensemble larger than the population or over members that observe differently.
pub fn members(cfg: &TrainConfig) -> Result<Vec<Member>, TrainError> {
    let bad = |m: String| Err(TrainError::Options(m));
    if cfg.agents == 0 {
        return bad("agents must be at least 1".into());
    }
    let mut base = cfg.clone();
    base.agents = 1;
    base.sweep = Sweep::default();
    base.ensemble = 0;
    let tree = serde_json::to_value(&base).expect("a config serializes");
    for (key, values) in &cfg.sweep.0 {
        let top = key.split('.').next().unwrap_or_default();
        if FIXED.contains(&top) {
            return bad(format!(
                "sweep: `{key}` cannot be swept: every agent of a population is judged with the \
                 same {top}"
            ));
        }
        if lookup(&tree, key).is_none() {
            return bad(format!(
                "sweep: unknown setting `{key}`; a swept setting is named by its key in the \
                 TOML config (e.g. dqn.lr, dqn.gamma, dqn.n_step, dqn.hidden, env.lookback; \
                 docs/TRAINING.md), and a setting that is off (e.g. dqn.prioritized) must be \
                 on in the base settings to sweep its parts"
            ));
        }
        if values.is_empty() {
            return bad(format!("sweep: `{key}` has no values"));
        }
        // A value listed twice would train the same agents twice and rank them as two.
        if let Some((i, v)) = values
            .iter()
            .enumerate()
            .find(|(i, v)| values[..*i].contains(*v))
        {
            return bad(format!(
                "sweep: `{key}` lists {v} twice (values {} and {}); each value once",
                values.iter().position(|u| u == v).expect("found before") + 1,
                i + 1
            ));
        }
    }
    let keys: Vec<(&String, &Vec<Value>)> = cfg.sweep.0.iter().collect();
    let points = cfg.sweep.points();
    let mut out = Vec::with_capacity(points * cfg.agents);
    for p in 0..points {
        // Point p in mixed radix, the last key fastest.
        let mut rest = p;
        let mut settings = BTreeMap::new();
        for (key, values) in keys.iter().rev() {
            settings.insert((*key).clone(), values[rest % values.len()].clone());
            rest /= values.len();
        }
        let mut t = tree.clone();
        for (key, v) in &settings {
            *lookup_mut(&mut t, key).expect("checked above") = v.clone();
        }
        let point: TrainConfig = serde_json::from_value(t)
            .map_err(|e| TrainError::Options(format!("sweep: {}: {e}", describe(&settings))))?;
        point
            .validate()
            .map_err(|e| TrainError::Options(format!("sweep: {}: {e}", describe(&settings))))?;
        for s in 0..cfg.agents {
            let mut c = point.clone();
            c.seed = point.seed.wrapping_add(s as u64);
            out.push(Member {
                index: out.len(),
                settings: settings.clone(),
                cfg: c,
            });
        }
    }
    if cfg.ensemble > out.len() {
        return bad(format!(
            "ensemble {} is larger than the population ({} agents)",
            cfg.ensemble,
            out.len()
        ));
    }
    if cfg.ensemble > 0
        && let Some(m) = out.iter().find(|m| m.cfg.env != base.env)
    {
        return bad(format!(
            "ensemble: the agents of a vote must observe and trade alike, but {} changes the \
             environment",
            describe(&m.settings)
        ));
    }
    Ok(out)
}

/// `a=1, b=2` of a member's settings.
pub fn describe(settings: &BTreeMap<String, Value>) -> String {
    if settings.is_empty() {
        return "the base settings".into();
    }
    settings
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn lookup<'a>(v: &'a Value, key: &str) -> Option<&'a Value> {
    key.split('.').try_fold(v, |v, k| v.as_object()?.get(k))
}

fn lookup_mut<'a>(v: &'a mut Value, key: &str) -> Option<&'a mut Value> {
    key.split('.')
        .try_fold(v, |v, k| v.as_object_mut()?.get_mut(k))
}

/// The majority vote of several greedy networks (ranked best first): at each bar every voter
/// decides its target position from the observation of the position the vote holds; the target
/// most voters chose wins, a tie going to the best-ranked voter among the tied.
pub struct Vote {
    voters: Vec<HostQNetwork>,
    env: EnvConfig,
}

impl Vote {
    /// The vote of `voters` (best first) in environment `env`.
    pub fn new(voters: Vec<HostQNetwork>, env: &EnvConfig) -> Self {
        assert!(!voters.is_empty(), "a vote needs a voter");
        Self {
            voters,
            env: env.clone(),
        }
    }
}

/// The winner of `targets` (in rank order): most votes, ties to the earliest-ranked.
pub fn majority(targets: &[i32]) -> i32 {
    let count = |t: i32| targets.iter().filter(|&&x| x == t).count();
    let mut best = targets[0];
    for &t in targets {
        if count(t) > count(best) {
            best = t;
        }
    }
    best
}

impl Policy for Vote {
    fn name(&self) -> String {
        "ensemble".into()
    }
    fn target(&mut self, d: &Decision<'_>) -> i32 {
        let env = &self.env;
        let targets: Vec<i32> = self
            .voters
            .iter_mut()
            .map(|n| env.target(n.greedy(d.obs) as u8))
            .collect();
        majority(&targets)
    }
}

/// What a window's population report says of one member.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemberReport {
    /// Position in the population.
    pub index: usize,
    /// The member's seed.
    pub seed: u64,
    /// Its swept settings.
    pub settings: BTreeMap<String, Value>,
    /// Trained, or failed alone (the rest of the population went on).
    #[serde(flatten)]
    pub status: crate::report::WindowStatus,
    /// Its best epoch on validation.
    pub best_epoch: Option<usize>,
    /// That epoch's validation metrics (no member's test split is judged but the selected).
    pub validation: Option<Metrics>,
    /// Per epoch statistics.
    pub epochs: Vec<crate::report::EpochSummary>,
}

/// A window's population: every member on validation, the one selected and the vote.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PopulationReport {
    /// The validation metric the selection maximized.
    pub select: Select,
    /// The member tested as `agent`.
    pub selected: usize,
    /// The members of the `ensemble` vote, best first (empty: no vote asked for).
    pub ensemble: Vec<usize>,
    /// Every member.
    pub members: Vec<MemberReport>,
}

/// The finished members ranked best first on validation by `select` (ties to the lower index).
pub fn ranked(members: &[MemberReport], select: Select) -> Vec<usize> {
    let mut ok: Vec<(usize, f64)> = members
        .iter()
        .filter_map(|m| Some((m.index, select.score(m.validation.as_ref()?))))
        .collect();
    // Stable: equal scores keep index order.
    ok.sort_by(|a, b| b.1.total_cmp(&a.1));
    ok.into_iter().map(|(i, _)| i).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(doc: &str) -> TrainConfig {
        toml::from_str(doc).unwrap_or_else(|e| panic!("{doc}: {e}"))
    }

    #[test]
    fn a_grid_times_seeds_in_key_order_with_the_last_key_fastest() {
        let c = cfg(
            "seed = 7\nagents = 2\n[sweep]\ndqn.lr = [0.001, 0.0005]\ndqn.hidden = [[8], [16, 16], [4]]\n",
        );
        let m = members(&c).expect("population");
        assert_eq!(m.len(), 12);
        // Keys sorted: dqn.hidden before dqn.lr, so lr varies fastest, then seeds.
        let shape: Vec<(Vec<usize>, f64, u64)> = m
            .iter()
            .map(|m| (m.cfg.dqn.hidden.clone(), m.cfg.dqn.lr, m.cfg.seed))
            .collect();
        assert_eq!(shape[0], (vec![8], 0.001, 7));
        assert_eq!(shape[1], (vec![8], 0.001, 8));
        assert_eq!(shape[2], (vec![8], 0.0005, 7));
        assert_eq!(shape[4], (vec![16, 16], 0.001, 7));
        assert_eq!(shape[11], (vec![4], 0.0005, 8));
        for (i, x) in m.iter().enumerate() {
            assert_eq!(x.index, i);
            assert_eq!((x.cfg.agents, x.cfg.sweep.is_empty()), (1, true));
            // Everything not swept is the base's.
            let mut y = x.cfg.clone();
            (y.dqn.hidden, y.dqn.lr, y.seed) = (c.dqn.hidden.clone(), c.dqn.lr, c.seed);
            assert_eq!(
                y,
                TrainConfig {
                    agents: 1,
                    sweep: Sweep::default(),
                    ..c.clone()
                }
            );
        }
        assert_eq!(m[5].settings["dqn.hidden"], serde_json::json!([16, 16]));
        // No sweep, one agent: the run's settings.
        let one = members(&TrainConfig::default()).expect("one");
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].cfg, TrainConfig::default());
    }

    #[test]
    fn the_flag_and_the_toml_table_give_one_sweep() {
        let mut c = TrainConfig::default();
        for f in [
            "dqn.lr=1e-3,0.0003",
            "dqn.hidden=[64,64],[32]",
            "dqn.activation=relu,tanh",
        ] {
            let (k, v) = Sweep::parse_flag(f).expect(f);
            c.sweep.set(k, v);
        }
        let t = cfg(
            "[sweep]\ndqn.lr = [0.001, 0.0003]\ndqn.hidden = [[64, 64], [32]]\n\
             dqn.activation = [\"relu\", \"tanh\"]\n",
        );
        assert_eq!(c.sweep, t.sweep);
        // config.json's flat keys read back to the same sweep.
        let json = serde_json::to_value(&t).expect("json");
        let back: TrainConfig = serde_json::from_value(json).expect("back");
        assert_eq!(back.sweep, t.sweep);
        let m = members(&c).expect("valid");
        assert_eq!(m.len(), 8);
        // Sorted keys: activation slowest, then hidden, lr fastest.
        use foxhunt_dqn::config::Activation;
        assert_eq!(m[3].cfg.dqn.activation, Activation::Relu);
        assert_eq!(m[4].cfg.dqn.activation, Activation::Tanh);
        assert_eq!(
            (m[1].cfg.dqn.hidden.clone(), m[1].cfg.dqn.lr),
            (vec![64, 64], 0.0003)
        );
        assert_eq!(m[2].cfg.dqn.hidden, vec![32]);
        let (_, v) = Sweep::parse_flag(
            "dqn.target_update={kind = \"soft\", tau = 0.01},{kind = \"hard\", every = 50}",
        )
        .expect("inline tables");
        assert_eq!(v.len(), 2);
    }

    #[test]
    fn bad_sweeps_are_refused_naming_the_setting() {
        let refused = |doc: &str, want: &str| {
            let e = members(&cfg(doc)).expect_err(doc).to_string();
            assert!(e.contains(want), "{doc}: {e}");
        };
        refused("[sweep]\ndqn.lrr = [1.0]\n", "unknown setting `dqn.lrr`");
        refused(
            "[sweep]\ncosts.commission = [1.0, 2.0]\n",
            "`costs.commission` cannot be swept",
        );
        refused("[sweep]\ncapital = [1.0]\n", "cannot be swept");
        refused("[sweep]\ndqn.lr = []\n", "`dqn.lr` has no values");
        // 1e-3 and 0.001 are one value.
        refused(
            "[sweep]\ndqn.lr = [0.001, 0.01, 1e-3]\n",
            "`dqn.lr` lists 0.001 twice (values 1 and 3)",
        );
        refused(
            "[sweep]\ndqn.lr = [0.001, \"fast\"]\n",
            "sweep: dqn.lr=\"fast\"",
        );
        refused("[sweep]\ndqn.gamma = [0.9, 1.5]\n", "dqn.gamma=1.5");
        refused(
            "[sweep]\ndqn.prioritized.alpha = [0.5]\n",
            "must be on in the base",
        );
        refused("agents = 0\n", "agents must be at least 1");
        refused(
            "agents = 2\nensemble = 3\n",
            "larger than the population (2 agents)",
        );
        refused(
            "ensemble = 2\n[sweep]\nenv.lookback = [1, 2]\n",
            "env.lookback=2 changes the environment",
        );
        let e = toml::from_str::<TrainConfig>("[sweep]\ndqn.lr = 0.001\n").expect_err("not a list");
        assert!(e.to_string().contains("`dqn.lr` takes a list"), "{e}");
        for f in ["dqn.lr", "dqn.lr=", "dqn.lr=1,,2", "dqn.lr=[1,2"] {
            assert!(Sweep::parse_flag(f).is_err(), "{f}");
        }
    }

    #[test]
    fn the_vote_is_the_majority_with_ties_to_the_best_ranked() {
        assert_eq!(majority(&[1, 0, 0]), 0);
        assert_eq!(majority(&[1, 0, -1]), 1, "all tied: the best-ranked");
        assert_eq!(
            majority(&[-1, 1, 1, -1]),
            -1,
            "tied: the best-ranked of the tied"
        );
        assert_eq!(majority(&[0, 1, -1, 1]), 1);
        assert_eq!(majority(&[0]), 0);
    }

    #[test]
    fn ranking_keeps_finished_members_best_first_ties_by_index() {
        let m = |index, pnl: Option<f64>| MemberReport {
            index,
            seed: 0,
            settings: BTreeMap::new(),
            status: crate::report::WindowStatus::Ok,
            best_epoch: pnl.map(|_| 0),
            validation: pnl.map(|p| Metrics {
                total_pnl: p,
                sharpe: Some(-p),
                ..Metrics::default()
            }),
            epochs: Vec::new(),
        };
        let ms = [
            m(0, Some(5.0)),
            m(1, None),
            m(2, Some(7.0)),
            m(3, Some(5.0)),
        ];
        assert_eq!(ranked(&ms, Select::Pnl), vec![2, 0, 3]);
        assert_eq!(ranked(&ms, Select::Sharpe), vec![0, 3, 2]);
    }
}
