//! Checkpoints: online and target networks, optimizer state, counters and config in one file,
//! written atomically (temporary file, then rename), checksummed, refused under a different
//! config.
//!
//! Layout (format 4): the magic `FOXHUNT-DQN4`, a length-prefixed (u64 little-endian) JSON
//! header (config, updates, env steps, parameter count), then the online parameters, the target
//! parameters and Adam's two moments as that many f32 little-endian each, in the flat order of
//! [`AgentState`]; then foxhunt-fs's seal (a SHA-256 of all before it), checked on load: a
//! damaged checkpoint is refused, never trained on. Encoding is a copy of the agent's state
//! (no per-tensor records), so a population's checkpoints cost little on the training threads.
//!
//! Format 3 (the same parts as burn binary records) is still read, so that runs written by the
//! previous version resume; formats 1 and 2 are refused by name.

use std::path::Path;

use burn::module::Module;
use burn::optim::Optimizer;
use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
use burn::tensor::backend::AutodiffBackend;
use serde::{Deserialize, Serialize};

use crate::agent::{AgentState, DqnAgent, Snapshot};
use crate::config::AgentConfig;
use crate::model::QNetwork;
use crate::{CpuBackend, DqnError};

const MAGIC: &[u8; 12] = b"FOXHUNT-DQN4";
/// The previous format (burn records), still read.
const MAGIC_3: &[u8; 12] = b"FOXHUNT-DQN3";
/// Earlier formats: 1 held the derived values among the settings, 2 had no checksum.
const OLD_MAGICS: [(&[u8; 12], u32); 2] = [(b"FOXHUNT-DQN1", 1), (b"FOXHUNT-DQN2", 2)];

/// Format 3's header.
#[derive(Serialize, Deserialize)]
struct Header {
    config: AgentConfig,
    updates: u64,
    env_steps: u64,
}

/// Format 4's header: format 3's and the length of each parameter vector that follows.
#[derive(Serialize, Deserialize)]
struct HeaderV4 {
    config: AgentConfig,
    updates: u64,
    env_steps: u64,
    params: u64,
}

fn err(path: &Path, message: impl Into<String>) -> DqnError {
    DqnError::Checkpoint {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

/// Writes `agent` to `path` atomically: a crash leaves the old file or the new one, never half.
pub fn save<B: AutodiffBackend>(agent: &DqnAgent<B>, path: &Path) -> Result<(), DqnError> {
    write(path, &encode(agent, path)?)
}

/// Writes bytes made by [`encode`] or [`encode_snapshot`] to `path` as [`save`] does (for a
/// caller that encodes on one thread and writes on another).
pub fn write(path: &Path, bytes: &[u8]) -> Result<(), DqnError> {
    foxhunt_fs::write_sealed(path, bytes)
        .map_err(|e| err(path, format!("cannot {}: {}", e.what, e.source)))
}

/// The bytes [`save`] writes for `agent` (before the seal); `path` only names the file in
/// errors.
pub fn encode<B: AutodiffBackend>(agent: &DqnAgent<B>, path: &Path) -> Result<Vec<u8>, DqnError> {
    encode_snapshot(agent.config(), &agent.snapshot(), path)
}

/// The bytes [`save`] writes for the agent of `cfg` that `snapshot` holds (equal to
/// [`encode`]'s of the agent it was taken from): what a caller that keeps an agent's state
/// rather than the agent (the fused engine, a kept best epoch) writes. `path` only names the
/// file in errors.
///
/// # Panics
/// When the snapshot's vectors differ in length (a programmer error: one state is one
/// architecture's).
pub fn encode_snapshot(
    cfg: &AgentConfig,
    snapshot: &Snapshot,
    path: &Path,
) -> Result<Vec<u8>, DqnError> {
    let s = &snapshot.state;
    let n = s.online.len();
    for (what, v) in [
        ("target", &s.target),
        ("moment_1", &s.moment_1),
        ("moment_2", &s.moment_2),
    ] {
        assert_eq!(v.len(), n, "{what}: {} values for {n} parameters", v.len());
    }
    let header = serde_json::to_vec(&HeaderV4 {
        config: cfg.clone(),
        updates: s.updates,
        env_steps: snapshot.env_steps,
        params: n as u64,
    })
    .map_err(|e| err(path, e.to_string()))?;
    let mut bytes = Vec::with_capacity(MAGIC.len() + 8 + header.len() + 16 * n);
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(&(header.len() as u64).to_le_bytes());
    bytes.extend_from_slice(&header);
    for v in [&s.online, &s.target, &s.moment_1, &s.moment_2] {
        for x in v.iter() {
            bytes.extend_from_slice(&x.to_le_bytes());
        }
    }
    Ok(bytes)
}

/// Reads a checkpoint written by [`save`] for exactly `cfg`; anything else is an error that
/// names the differing settings.
pub fn load<B: AutodiffBackend>(
    path: &Path,
    cfg: &AgentConfig,
    device: &B::Device,
) -> Result<DqnAgent<B>, DqnError> {
    match read(path, cfg)? {
        Read::State(snapshot) => DqnAgent::restore(cfg.clone(), device, &snapshot),
        Read::Burn(parts) => load_burn(path, cfg, device, &parts),
    }
}

/// Reads the agent's state from a checkpoint written by [`save`] for exactly `cfg`, as
/// [`load`] (without making the agent where the format allows).
pub fn load_snapshot(path: &Path, cfg: &AgentConfig) -> Result<Snapshot, DqnError> {
    match read(path, cfg)? {
        Read::State(snapshot) => Ok(snapshot),
        Read::Burn(parts) => {
            Ok(load_burn::<CpuBackend>(path, cfg, &Default::default(), &parts)?.snapshot())
        }
    }
}

/// What a checked checkpoint holds.
enum Read {
    /// Format 4: the state.
    State(Snapshot),
    /// Format 3: the header's counters and the three burn records (online, target, optimizer).
    Burn(BurnParts),
}

struct BurnParts {
    updates: u64,
    env_steps: u64,
    records: [Vec<u8>; 3],
}

/// Reads `path`, checks its seal, format and config (`cfg`), and splits it.
fn read(path: &Path, cfg: &AgentConfig) -> Result<Read, DqnError> {
    let sealed = std::fs::read(path).map_err(|e| err(path, format!("cannot read: {e}")))?;
    if let Some((_, n)) = OLD_MAGICS.iter().find(|(m, _)| sealed.starts_with(*m)) {
        return Err(err(
            path,
            format!(
                "written by an earlier foxhunt (checkpoint format {n}), which this version does not read"
            ),
        ));
    }
    let bytes = foxhunt_fs::unseal(path, &sealed)
        .map_err(|e| err(path, format!("cannot {}: {}", e.what, e.source)))?;
    let same_config = |config: &AgentConfig| -> Result<(), DqnError> {
        if config != cfg {
            return Err(err(
                path,
                format!(
                    "written for another configuration; differing settings: {}",
                    foxhunt_fs::json_diff(config, cfg)
                ),
            ));
        }
        Ok(())
    };
    if let Some(rest) = bytes.strip_prefix(MAGIC.as_slice()) {
        let [header, values] = parts(path, rest, ["header"])?;
        let h: HeaderV4 =
            serde_json::from_slice(header).map_err(|e| err(path, format!("bad header: {e}")))?;
        same_config(&h.config)?;
        let n = DqnAgent::<CpuBackend>::new(cfg.clone(), &Default::default())?.num_params();
        if h.params != n as u64 {
            return Err(err(
                path,
                format!("holds {} parameters, the configuration {n}", h.params),
            ));
        }
        if values.len() != 16 * n {
            return Err(err(
                path,
                format!(
                    "{} bytes of parameters and moments where {} were expected (truncated?)",
                    values.len(),
                    16 * n
                ),
            ));
        }
        let vector = |k: usize| -> Vec<f32> {
            values[4 * n * k..4 * n * (k + 1)]
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")))
                .collect()
        };
        return Ok(Read::State(Snapshot {
            state: AgentState {
                online: vector(0),
                target: vector(1),
                moment_1: vector(2),
                moment_2: vector(3),
                updates: h.updates,
            },
            env_steps: h.env_steps,
        }));
    }
    let rest = bytes
        .strip_prefix(MAGIC_3.as_slice())
        .ok_or_else(|| err(path, "not a foxhunt DQN checkpoint (bad magic)"))?;
    let [header, online, target, optim, _] = parts(
        path,
        rest,
        ["header", "online network", "target network", "optimizer"],
    )?;
    let h: Header =
        serde_json::from_slice(header).map_err(|e| err(path, format!("bad header: {e}")))?;
    same_config(&h.config)?;
    Ok(Read::Burn(BurnParts {
        updates: h.updates,
        env_steps: h.env_steps,
        records: [online.to_vec(), target.to_vec(), optim.to_vec()],
    }))
}

/// Splits `at` into the length-prefixed parts `names` and what follows them.
fn parts<'a, const N: usize, const M: usize>(
    path: &Path,
    mut at: &'a [u8],
    names: [&str; N],
) -> Result<[&'a [u8]; M], DqnError> {
    debug_assert_eq!(M, N + 1, "the parts and the rest");
    let mut out = Vec::with_capacity(M);
    for name in names {
        let (len, tail) = at
            .split_first_chunk::<8>()
            .ok_or_else(|| err(path, format!("truncated before the {name}")))?;
        let len = usize::try_from(u64::from_le_bytes(*len))
            .map_err(|_| err(path, "length out of range"))?;
        if tail.len() < len {
            return Err(err(path, format!("truncated inside the {name}")));
        }
        out.push(&tail[..len]);
        at = &tail[len..];
    }
    out.push(at);
    Ok(out.try_into().expect("N parts and the rest"))
}

/// Makes the agent of a format-3 checkpoint from its burn records.
fn load_burn<B: AutodiffBackend>(
    path: &Path,
    cfg: &AgentConfig,
    device: &B::Device,
    p: &BurnParts,
) -> Result<DqnAgent<B>, DqnError> {
    let rec = BinBytesRecorder::<FullPrecisionSettings>::default();
    let online = QNetwork::<B>::init(cfg, device).load_record(
        Recorder::<B>::load(&rec, p.records[0].clone(), device)
            .map_err(|e| err(path, format!("online network: {e}")))?,
    );
    let target = QNetwork::<B::InnerBackend>::init(cfg, device).load_record(
        Recorder::<B::InnerBackend>::load(&rec, p.records[1].clone(), device)
            .map_err(|e| err(path, format!("target network: {e}")))?,
    );
    let optim = DqnAgent::<B>::fresh_optimizer(cfg).load_record(
        Recorder::<B>::load(&rec, p.records[2].clone(), device)
            .map_err(|e| err(path, format!("optimizer: {e}")))?,
    );
    Ok(DqnAgent::from_parts(
        cfg.clone(),
        device,
        online,
        target,
        optim,
        p.updates,
        p.env_steps,
    ))
}
