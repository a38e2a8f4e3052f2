//! Contract specifications: multiplier, tick size and currency per root symbol, built in for the
//! common CME contracts and overridable from a TOML file.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::EnvError;

/// One futures contract's economics.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContractSpec {
    /// Currency per point of price (ES: 50 USD).
    pub multiplier: f64,
    /// Minimum price increment (ES: 0.25).
    pub tick_size: f64,
    /// Settlement currency.
    #[serde(default = "usd")]
    pub currency: String,
}

fn usd() -> String {
    "USD".to_owned()
}

impl ContractSpec {
    /// Currency value of one tick for one contract (ES: 12.50 USD).
    pub fn tick_value(&self) -> f64 {
        self.multiplier * self.tick_size
    }

    fn validate(&self, root: &str) -> Result<(), EnvError> {
        if !(self.multiplier.is_finite()
            && self.multiplier > 0.0
            && self.tick_size.is_finite()
            && self.tick_size > 0.0)
        {
            return Err(EnvError::Spec(format!(
                "{root}: multiplier ({}) and tick_size ({}) must be positive numbers",
                self.multiplier, self.tick_size
            )));
        }
        Ok(())
    }
}

/// Contract specs by root symbol.
#[derive(Debug, Clone, PartialEq)]
pub struct SpecTable {
    specs: BTreeMap<String, ContractSpec>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SpecFile {
    contracts: BTreeMap<String, ContractSpec>,
}

impl Default for SpecTable {
    /// ES, MES, NQ, MNQ, CL, GC, 6E and ZN as specified by CME Group.
    fn default() -> Self {
        let spec = |multiplier: f64, tick_size: f64| ContractSpec {
            multiplier,
            tick_size,
            currency: usd(),
        };
        let specs = [
            ("ES", spec(50.0, 0.25)),
            ("MES", spec(5.0, 0.25)),
            ("NQ", spec(20.0, 0.25)),
            ("MNQ", spec(2.0, 0.25)),
            ("CL", spec(1_000.0, 0.01)),
            ("GC", spec(100.0, 0.10)),
            ("6E", spec(125_000.0, 0.000_05)),
            ("ZN", spec(1_000.0, 1.0 / 64.0)),
        ];
        Self {
            specs: specs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
        }
    }
}

impl SpecTable {
    /// The built-in specs with those of a TOML file laid over them:
    ///
    /// ```toml
    /// [contracts.ES]
    /// multiplier = 50.0
    /// tick_size = 0.25
    /// currency = "USD"
    /// ```
    pub fn with_overrides(path: &Path) -> Result<Self, EnvError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| EnvError::Spec(format!("{}: cannot read: {e}", path.display())))?;
        let file: SpecFile = toml::from_str(&text)
            .map_err(|e| EnvError::Spec(format!("{}: {e}", path.display())))?;
        let mut table = Self::default();
        for (root, spec) in file.contracts {
            spec.validate(&root)
                .map_err(|e| EnvError::Spec(format!("{}: {e}", path.display())))?;
            table.specs.insert(root, spec);
        }
        Ok(table)
    }

    /// The spec of a root symbol (`ES`), or an error listing the known roots.
    pub fn get(&self, root: &str) -> Result<&ContractSpec, EnvError> {
        self.specs.get(root).ok_or_else(|| {
            EnvError::Spec(format!(
                "no contract spec for {root}; known: {} (add one with a specs file)",
                self.specs.keys().cloned().collect::<Vec<_>>().join(", ")
            ))
        })
    }
}
