//! Compiled kernels cached on disk: NVRTC's CUBIN for a module, keyed by everything that decides
//! it (the source, the architecture, the compile options and NVRTC's version), so that a run
//! starts without compiling. An entry is checked before it is trusted: a file that is cut,
//! altered or of another format is ignored and rebuilt.
//!
//! Where: `FOXHUNT_KERNEL_CACHE` (a directory; `off` turns the cache off), else
//! `$XDG_CACHE_HOME/foxhunt/kernels`, else `$HOME/.cache/foxhunt/kernels`. The cache is a speed-up
//! only: a directory that cannot be read or written costs a compile, never a failure.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// The first bytes of an entry, naming its format.
const MAGIC: &[u8; 8] = b"FXCUBIN1";

/// Where compiled modules are kept between runs (or nowhere).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelCache {
    dir: Option<PathBuf>,
}

impl KernelCache {
    /// The cache the environment asks for (see the module docs).
    pub fn from_env() -> Self {
        let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
        let dir = match var("FOXHUNT_KERNEL_CACHE") {
            Some(v) if v == "off" => None,
            Some(v) => Some(PathBuf::from(v)),
            None => var("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| var("HOME").map(|h| PathBuf::from(h).join(".cache")))
                .map(|c| c.join("foxhunt").join("kernels")),
        };
        Self { dir }
    }

    /// A cache in `dir`.
    pub fn at(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: Some(dir.into()),
        }
    }

    /// No cache: every module is compiled.
    pub fn off() -> Self {
        Self { dir: None }
    }

    /// The directory, if there is a cache.
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// The entry's file for everything that decides a compiled module.
    pub fn path(
        &self,
        source: &str,
        arch: &str,
        options: &[String],
        nvrtc: (i32, i32),
    ) -> Option<PathBuf> {
        let dir = self.dir.as_ref()?;
        let mut h = Sha256::new();
        for part in [source, arch, &format!("nvrtc {}.{}", nvrtc.0, nvrtc.1)] {
            h.update((part.len() as u64).to_le_bytes());
            h.update(part.as_bytes());
        }
        for o in options {
            h.update((o.len() as u64).to_le_bytes());
            h.update(o.as_bytes());
        }
        let key: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
        Some(dir.join(format!("{key}.cubin")))
    }

    /// The CUBIN stored at `path`, if the entry is whole and of this format.
    pub fn load(path: &Path) -> Option<Vec<u8>> {
        let bytes = std::fs::read(path).ok()?;
        decode(&bytes).map(<[u8]>::to_vec)
    }

    /// Stores `cubin` at `path` (atomically); a failure only costs the next run a compile.
    pub fn store(path: &Path, cubin: &[u8]) -> Result<(), foxhunt_fs::FsError> {
        foxhunt_fs::write_atomic(path, &encode(cubin))
    }
}

fn encode(cubin: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(cubin.len() + 48);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&Sha256::digest(cubin));
    out.extend_from_slice(&(cubin.len() as u64).to_le_bytes());
    out.extend_from_slice(cubin);
    out
}

/// The payload of an entry, checked: magic, length and checksum.
fn decode(bytes: &[u8]) -> Option<&[u8]> {
    let rest = bytes.strip_prefix(MAGIC.as_slice())?;
    let (sum, rest) = rest.split_at_checked(32)?;
    let (len, payload) = rest.split_first_chunk::<8>()?;
    if u64::from_le_bytes(*len) != payload.len() as u64 || Sha256::digest(payload).as_slice() != sum
    {
        return None;
    }
    Some(payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_and_any_damage_is_refused() {
        let payload: Vec<u8> = (0..5000u32).map(|i| (i * 7 % 251) as u8).collect();
        let entry = encode(&payload);
        assert_eq!(decode(&entry), Some(payload.as_slice()));
        // One flipped bit anywhere, a cut, a longer file, another format: refused.
        for at in [0, 9, 40, 47, 48, entry.len() - 1] {
            let mut bad = entry.clone();
            bad[at] ^= 0x10;
            assert_eq!(decode(&bad), None, "flip at {at}");
        }
        assert_eq!(decode(&entry[..entry.len() - 1]), None);
        let mut longer = entry.clone();
        longer.push(0);
        assert_eq!(decode(&longer), None);
        assert_eq!(decode(b"FXCUBIN1"), None);
    }

    #[test]
    fn the_key_changes_with_everything_that_decides_the_module() {
        let c = KernelCache::at("/tmp/k");
        let opts = vec!["--fmad=false".to_owned()];
        let base = c.path("src", "sm_90", &opts, (13, 0));
        assert!(base.is_some());
        assert_ne!(base, c.path("src2", "sm_90", &opts, (13, 0)));
        assert_ne!(base, c.path("src", "sm_80", &opts, (13, 0)));
        assert_ne!(base, c.path("src", "sm_90", &[], (13, 0)));
        assert_ne!(base, c.path("src", "sm_90", &opts, (12, 8)));
        assert_eq!(base, c.path("src", "sm_90", &opts, (13, 0)));
        assert_eq!(
            KernelCache::off().path("src", "sm_90", &opts, (13, 0)),
            None
        );
    }

    #[test]
    fn entries_are_stored_atomically_and_read_back() {
        let dir = std::env::temp_dir().join(format!("foxhunt-kcache-{}", std::process::id()));
        let c = KernelCache::at(&dir);
        let p = c.path("x", "sm_90", &[], (1, 0)).expect("a path");
        assert_eq!(KernelCache::load(&p), None, "nothing stored yet");
        KernelCache::store(&p, b"cubin bytes").expect("store");
        assert_eq!(KernelCache::load(&p).as_deref(), Some(&b"cubin bytes"[..]));
        std::fs::write(&p, b"FXCUBIN1 garbage").expect("damage");
        assert_eq!(KernelCache::load(&p), None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
