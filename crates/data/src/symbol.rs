//! Futures symbology: contract codes (ESZ3), parent symbols (ES.FUT) and selections.

use std::fmt;

/// CME month codes, January to December.
pub const MONTH_CODES: [char; 12] = ['F', 'G', 'H', 'J', 'K', 'M', 'N', 'Q', 'U', 'V', 'X', 'Z'];

/// A parsed outright futures contract code such as `ESZ3` or `6EH24`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ContractCode {
    /// Root symbol, e.g. `ES`.
    pub root: String,
    /// Delivery month, 1..=12.
    pub month: u8,
    /// The year digits as written (one or two), e.g. 3 for `ESZ3`.
    pub year_digits: u16,
}

impl ContractCode {
    /// Parses `ROOT` + month code + 1 or 2 year digits. Spreads (`ESZ3-ESH4`), options and
    /// anything else return `None`.
    pub fn parse(symbol: &str) -> Option<Self> {
        let bytes = symbol.as_bytes();
        let digits = bytes
            .iter()
            .rev()
            .take_while(|b| b.is_ascii_digit())
            .count();
        if !(1..=2).contains(&digits) || bytes.len() < digits + 2 {
            return None;
        }
        let month_pos = bytes.len() - digits - 1;
        let month_char = bytes[month_pos] as char;
        let month = MONTH_CODES.iter().position(|&c| c == month_char)? as u8 + 1;
        let root = &symbol[..month_pos];
        if root.is_empty()
            || !root
                .bytes()
                .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit())
        {
            return None;
        }
        let year_digits = symbol[month_pos + 1..].parse().ok()?;
        Some(Self {
            root: root.to_owned(),
            month,
            year_digits,
        })
    }

    /// The CME code for a root and a delivery year and month, with one year digit (`ESZ3`).
    pub fn format(root: &str, year: i32, month: u8) -> String {
        assert!((1..=12).contains(&month), "month {month} out of range");
        format!(
            "{root}{}{}",
            MONTH_CODES[usize::from(month - 1)],
            year.rem_euclid(10)
        )
    }
}

/// Which contracts a user asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SymbolSelector {
    /// Every outright contract of a root (`ES.FUT`, Databento's parent symbology).
    Parent(String),
    /// Exactly one contract by its raw symbol (`ESZ3`).
    Raw(String),
}

impl SymbolSelector {
    /// Parses `ROOT.FUT` as a parent selection and anything else as a raw symbol.
    pub fn parse(s: &str) -> Result<Self, crate::DataError> {
        let s = s.trim();
        if s.is_empty() {
            return Err(crate::DataError::InvalidOption("empty --symbol".into()));
        }
        Ok(match s.strip_suffix(".FUT") {
            Some(root) if !root.is_empty() => Self::Parent(root.to_owned()),
            _ => Self::Raw(s.to_owned()),
        })
    }

    /// Whether a contract symbol from the data is selected.
    pub fn matches(&self, symbol: &str) -> bool {
        match self {
            Self::Raw(s) => s == symbol,
            Self::Parent(root) => {
                // Files with parent symbology label contracts ROOT.FUT#<instrument id>.
                if symbol
                    .strip_prefix(root.as_str())
                    .is_some_and(|rest| rest.starts_with(".FUT#"))
                {
                    return true;
                }
                ContractCode::parse(symbol).is_some_and(|c| &c.root == root)
            }
        }
    }

    /// The root symbol (`ES` for both `ES.FUT` and `ESZ3`), when it can be known.
    pub fn root(&self) -> String {
        match self {
            Self::Parent(root) => root.clone(),
            Self::Raw(s) => ContractCode::parse(s).map_or_else(|| s.clone(), |c| c.root),
        }
    }
}

impl fmt::Display for SymbolSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Parent(root) => write!(f, "{root}.FUT"),
            Self::Raw(s) => f.write_str(s),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_contract_codes() {
        let c = ContractCode::parse("ESZ3").expect("ESZ3 parses");
        assert_eq!((c.root.as_str(), c.month, c.year_digits), ("ES", 12, 3));
        let c = ContractCode::parse("6EH24").expect("6EH24 parses");
        assert_eq!((c.root.as_str(), c.month, c.year_digits), ("6E", 3, 24));
        for bad in ["ES", "ESZ", "ESZ3-ESH4", "Z3", "ESA3", "ESZ123", "es z3"] {
            assert!(ContractCode::parse(bad).is_none(), "{bad} must not parse");
        }
        assert_eq!(ContractCode::format("ES", 2013, 12), "ESZ3");
        assert_eq!(ContractCode::format("GC", 2020, 2), "GCG0");
    }

    #[test]
    fn parent_selects_outrights_of_its_root_only() {
        let sel = SymbolSelector::parse("ES.FUT").expect("valid");
        assert_eq!(sel, SymbolSelector::Parent("ES".into()));
        assert!(sel.matches("ESZ3") && sel.matches("ESH14") && sel.matches("ES.FUT#118"));
        assert!(!sel.matches("NQZ3") && !sel.matches("ESZ3-ESH4") && !sel.matches("MESZ3"));
        let raw = SymbolSelector::parse("ESZ3").expect("valid");
        assert!(raw.matches("ESZ3") && !raw.matches("ESH4"));
        assert_eq!(raw.root(), "ES");
    }
}
