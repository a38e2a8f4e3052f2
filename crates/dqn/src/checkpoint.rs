//! Checkpoints: online and target networks, optimizer state, counters and config in one file,
//! written atomically (temporary file, then rename), checksummed, refused under a different
//! config.
//!
//! Layout: the magic `FOXHUNT-DQN3`, then four length-prefixed (u64 little-endian) parts: a JSON
//! header (config, updates, env steps), and the online, target and optimizer records in burn's
//! binary recorder format at full precision; then foxhunt-fs's seal (a SHA-256 of all before
//! it), checked on load: a damaged checkpoint is refused, never trained on.

use std::path::Path;

use burn::module::Module;
use burn::optim::Optimizer;
use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
use burn::tensor::backend::AutodiffBackend;
use serde::{Deserialize, Serialize};

use crate::DqnError;
use crate::agent::DqnAgent;
use crate::config::AgentConfig;
use crate::model::QNetwork;

const MAGIC: &[u8; 12] = b"FOXHUNT-DQN3";
/// Earlier formats: 1 held the derived values among the settings, 2 had no checksum.
const OLD_MAGICS: [(&[u8; 12], u32); 2] = [(b"FOXHUNT-DQN1", 1), (b"FOXHUNT-DQN2", 2)];

#[derive(Serialize, Deserialize)]
struct Header {
    config: AgentConfig,
    updates: u64,
    env_steps: u64,
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

/// Writes bytes made by [`encode`] to `path` as [`save`] does (for a caller that encodes on
/// one thread and writes on another).
pub fn write(path: &Path, bytes: &[u8]) -> Result<(), DqnError> {
    foxhunt_fs::write_sealed(path, bytes)
        .map_err(|e| err(path, format!("cannot {}: {}", e.what, e.source)))
}

/// The bytes [`save`] writes for `agent` (before the seal); `path` only names the file in
/// errors.
pub fn encode<B: AutodiffBackend>(agent: &DqnAgent<B>, path: &Path) -> Result<Vec<u8>, DqnError> {
    let crate::agent::Parts {
        online,
        target,
        optim,
        updates,
        env_steps,
    } = agent.parts();
    let rec = BinBytesRecorder::<FullPrecisionSettings>::default();
    let header = serde_json::to_vec(&Header {
        config: agent.config().clone(),
        updates,
        env_steps,
    })
    .map_err(|e| err(path, e.to_string()))?;
    let parts: [Vec<u8>; 4] = [
        header,
        Recorder::<B>::record(&rec, online.clone().into_record(), ())
            .map_err(|e| err(path, format!("online network: {e}")))?,
        Recorder::<B::InnerBackend>::record(&rec, target.clone().into_record(), ())
            .map_err(|e| err(path, format!("target network: {e}")))?,
        Recorder::<B>::record(&rec, optim.to_record(), ())
            .map_err(|e| err(path, format!("optimizer: {e}")))?,
    ];
    let mut bytes = MAGIC.to_vec();
    for p in &parts {
        bytes.extend_from_slice(&(p.len() as u64).to_le_bytes());
        bytes.extend_from_slice(p);
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
    let rest = bytes
        .strip_prefix(MAGIC.as_slice())
        .ok_or_else(|| err(path, "not a foxhunt DQN checkpoint (bad magic)"))?;
    let mut parts = Vec::with_capacity(4);
    let mut at = rest;
    for name in ["header", "online network", "target network", "optimizer"] {
        let (len, tail) = at
            .split_first_chunk::<8>()
            .ok_or_else(|| err(path, format!("truncated before the {name}")))?;
        let len = usize::try_from(u64::from_le_bytes(*len))
            .map_err(|_| err(path, "length out of range"))?;
        if tail.len() < len {
            return Err(err(path, format!("truncated inside the {name}")));
        }
        parts.push(&tail[..len]);
        at = &tail[len..];
    }
    let header: Header =
        serde_json::from_slice(parts[0]).map_err(|e| err(path, format!("bad header: {e}")))?;
    if &header.config != cfg {
        return Err(err(
            path,
            format!(
                "written for another configuration; differing settings: {}",
                foxhunt_fs::json_diff(&header.config, cfg)
            ),
        ));
    }
    let rec = BinBytesRecorder::<FullPrecisionSettings>::default();
    let online = QNetwork::<B>::init(cfg, device).load_record(
        Recorder::<B>::load(&rec, parts[1].to_vec(), device)
            .map_err(|e| err(path, format!("online network: {e}")))?,
    );
    let target = QNetwork::<B::InnerBackend>::init(cfg, device).load_record(
        Recorder::<B::InnerBackend>::load(&rec, parts[2].to_vec(), device)
            .map_err(|e| err(path, format!("target network: {e}")))?,
    );
    let optim = DqnAgent::<B>::fresh_optimizer(cfg).load_record(
        Recorder::<B>::load(&rec, parts[3].to_vec(), device)
            .map_err(|e| err(path, format!("optimizer: {e}")))?,
    );
    Ok(DqnAgent::from_parts(
        cfg.clone(),
        device,
        online,
        target,
        optim,
        header.updates,
        header.env_steps,
    ))
}
