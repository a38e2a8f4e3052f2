//! Test support for foxhunt's crates (not published): where the bundled data lives, the bundled
//! ES data set loaded once per test process, the real part of it as a window's market data, and
//! scratch directories that remove themselves.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use foxhunt_data::{
    Adjustment, Dataset, FeatureConfig, LoadOptions, Normalizer, SessionCalendar, SymbolSelector,
};
use foxhunt_env::{Costs, Execution, MarketData, SpecTable};

/// The workspace's root directory.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The bundled data: `FOXHUNT_TEST_DATA`, else the workspace's test_data/.
pub fn test_data() -> PathBuf {
    std::env::var_os("FOXHUNT_TEST_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("test_data"))
}

/// test_data/futures-baseline as a continuous ES series (difference-adjusted), with its
/// features: loaded on first use, shared by every test of the process.
pub fn es_dataset() -> &'static Dataset {
    static ES: OnceLock<Dataset> = OnceLock::new();
    ES.get_or_init(|| {
        Dataset::load(
            &test_data().join("futures-baseline"),
            &SymbolSelector::parse("ES.FUT").expect("a valid selector"),
            &LoadOptions::default(),
            &SessionCalendar::cme(),
            Adjustment::Difference,
            &FeatureConfig::default(),
        )
        .expect("the bundled ES data loads")
    })
}

/// The rows of [`es_dataset`] that are real bars: after the synthetic lead-in, which ends on
/// 2013-09-06.
pub fn es_real_rows() -> Range<usize> {
    let f = &es_dataset().features;
    f.ts.partition_point(|&t| t < 1_380_000_000_000_000_000)..f.rows
}

/// Rows `rows` of [`es_dataset`] as a window's market data, features normalized on those rows.
pub fn es_market(rows: Range<usize>) -> MarketData {
    let f = &es_dataset().features;
    let n = Normalizer::fit(f, rows.clone());
    MarketData::from_features(f, rows, Some(&n)).expect("the bundled rows are valid market data")
}

/// ES's contract terms with the default costs (2.50 per side, one tick of slippage).
pub fn es_execution() -> Execution {
    let spec = SpecTable::default()
        .get("ES")
        .expect("ES is built in")
        .clone();
    Execution::new(&spec, Costs::default())
}

/// Whether this machine is declared to have a GPU for the tests (`FOXHUNT_GPU_TESTS=1`),
/// without a word: for tests that observe what happens where there is none.
pub fn gpu_machine() -> bool {
    std::env::var("FOXHUNT_GPU_TESTS").as_deref() == Ok("1")
}

/// Whether GPU tests run here ([`gpu_machine`]); says so when they do not.
pub fn gpu_tests() -> bool {
    let on = gpu_machine();
    if !on {
        eprintln!("skipped: set FOXHUNT_GPU_TESTS=1 to run on a CUDA device");
    }
    on
}

/// A fresh, empty directory under the system's temporary directory, removed with its contents
/// when dropped. Unique per process and call.
#[derive(Debug)]
pub struct Scratch {
    path: PathBuf,
}

impl Scratch {
    /// A new directory whose name starts with `foxhunt-{name}-`.
    pub fn new(name: &str) -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("foxhunt-{name}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("a scratch directory can be made");
        Self { path }
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.path
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        &self.path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}
