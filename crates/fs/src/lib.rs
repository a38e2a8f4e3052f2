//! foxhunt-fs: how foxhunt writes the files a user keeps. One rule, used by every crate that
//! writes: a file is replaced atomically, so a crash, a full disk or a second writer leaves
//! either the old file or the new one, never a mix. And a directory one process works in: new
//! names reserved by creating them, an advisory lock held for the process's life.

use std::io::Write;
use std::path::{Path, PathBuf};

/// A file operation that failed, naming the file.
#[derive(Debug, thiserror::Error)]
#[error("{}: cannot {what}: {source}", path.display())]
pub struct FsError {
    /// The file.
    pub path: PathBuf,
    /// What was being done ("write", "create the directory", ...).
    pub what: &'static str,
    /// The operating system's error.
    #[source]
    pub source: std::io::Error,
}

fn err(path: &Path, what: &'static str) -> impl FnOnce(std::io::Error) -> FsError {
    let path = path.to_path_buf();
    move |source| FsError { path, what, source }
}

/// The settings that differ between what a file was written for (`saved`) and what is asked
/// for now (`wanted`), as `key.path: saved -> wanted`, one per differing leaf, comma-separated:
/// how a refusal to read a file under another configuration names the difference.
pub fn json_diff<T: serde::Serialize>(saved: &T, wanted: &T) -> String {
    let (a, b) = (
        serde_json::to_value(saved).unwrap_or_default(),
        serde_json::to_value(wanted).unwrap_or_default(),
    );
    let mut out = Vec::new();
    leaves_diff(&a, &b, "", &mut out);
    out.join(", ")
}

fn leaves_diff(a: &serde_json::Value, b: &serde_json::Value, at: &str, out: &mut Vec<String>) {
    use serde_json::Value;
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                let (u, v) = (
                    x.get(k).unwrap_or(&Value::Null),
                    y.get(k).unwrap_or(&Value::Null),
                );
                if u != v {
                    let path = if at.is_empty() {
                        k.clone()
                    } else {
                        format!("{at}.{k}")
                    };
                    leaves_diff(u, v, &path, out);
                }
            }
        }
        _ if a != b => out.push(format!("{at}: {a} -> {b}")),
        _ => {}
    }
}

/// Writes `bytes` to `path` atomically, creating its directory: the bytes go to a temporary
/// file of a unique name in the same directory, which is flushed to disk and renamed over
/// `path`; the directory is then flushed so that the rename itself survives a crash. Two
/// writers of the same file never share a temporary file; the last rename wins.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), FsError> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::create_dir_all(dir).map_err(err(dir, "create the directory"))?;
    let name = path
        .file_name()
        .ok_or_else(|| err(path, "write")(std::io::Error::other("not a file path")))?;
    let mut prefix = std::ffi::OsString::from(".");
    prefix.push(name);
    prefix.push(".");
    let mut tmp = tempfile::Builder::new()
        .prefix(&prefix)
        .suffix(".tmp")
        .tempfile_in(dir)
        .map_err(err(path, "write"))?;
    tmp.write_all(bytes).map_err(err(path, "write"))?;
    tmp.as_file().sync_all().map_err(err(path, "write"))?;
    tmp.persist(path).map_err(|e| err(path, "write")(e.error))?;
    sync_dir(dir);
    Ok(())
}

/// Sealed files: what foxhunt reads back to resume a run (checkpoints, replay, progress,
/// window reports) carries a SHA-256 of its contents, written with it in the same atomic
/// write and checked on every read, so a damaged or edited file is refused, never trusted.
/// A binary file ends with [`SEAL_MAGIC`] and the 32-byte digest of everything before it.
pub const SEAL_MAGIC: &[u8; 16] = b"\nFOXHUNT-SHA256\n";

/// The key of a sealed JSON object's digest.
pub const SEAL_KEY: &str = "sha256";

fn sha256(bytes: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).into()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn damaged(path: &Path, message: String) -> FsError {
    FsError {
        path: path.to_path_buf(),
        what: "trust the file",
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, message),
    }
}

/// `bytes` with the seal appended (see [`SEAL_MAGIC`]).
pub fn seal(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len() + 48);
    out.extend_from_slice(bytes);
    out.extend_from_slice(SEAL_MAGIC);
    out.extend_from_slice(&sha256(bytes));
    out
}

/// The contents of sealed `bytes` (read from `path`, named in errors), checked against their
/// digest.
pub fn unseal<'a>(path: &Path, bytes: &'a [u8]) -> Result<&'a [u8], FsError> {
    let n = bytes.len();
    if n < 48 || &bytes[n - 48..n - 32] != SEAL_MAGIC {
        return Err(damaged(
            path,
            "no checksum at its end (truncated, damaged, or not written by this foxhunt)".into(),
        ));
    }
    let (body, digest) = (&bytes[..n - 48], &bytes[n - 32..]);
    let found = sha256(body);
    if found != digest {
        return Err(damaged(
            path,
            format!(
                "its contents changed after foxhunt wrote them (checksum {} recorded, {} found)",
                hex(digest),
                hex(&found)
            ),
        ));
    }
    Ok(body)
}

/// Writes `bytes` sealed, atomically.
pub fn write_sealed(path: &Path, bytes: &[u8]) -> Result<(), FsError> {
    write_atomic(path, &seal(bytes))
}

/// Reads a file written by [`write_sealed`], checked.
pub fn read_sealed(path: &Path) -> Result<Vec<u8>, FsError> {
    let bytes = std::fs::read(path).map_err(err(path, "read"))?;
    Ok(unseal(path, &bytes)?.to_vec())
}

/// The key of a wrapped value's digest: `{"value": [...], "value_sha256": ...}`.
const WRAPPED_KEY: &str = "value_sha256";

/// `value` as pretty JSON with its digest: an object gets [`SEAL_KEY`] beside its own keys;
/// any other value is wrapped as `{"value": ..., "value_sha256": ...}`. The digest is over the
/// compact JSON of the value as serde_json orders it, so a file that is only re-indented still
/// reads, and one whose content changed does not.
pub fn to_sealed_json<T: serde::Serialize>(value: &T) -> Result<Vec<u8>, serde_json::Error> {
    let v = serde_json::to_value(value)?;
    let digest = serde_json::Value::String(hex(&sha256(&serde_json::to_vec(&v)?)));
    let map = match v {
        serde_json::Value::Object(mut m) => {
            assert!(
                !m.contains_key(SEAL_KEY) && !m.contains_key(WRAPPED_KEY),
                "a sealed object has no key {SEAL_KEY} or {WRAPPED_KEY}"
            );
            m.insert(SEAL_KEY.into(), digest);
            m
        }
        other => serde_json::Map::from_iter([
            ("value".to_string(), other),
            (WRAPPED_KEY.to_string(), digest),
        ]),
    };
    serde_json::to_vec_pretty(&map)
}

/// The value of JSON written by [`to_sealed_json`], checked (read from `path`, named in
/// errors).
pub fn from_sealed_json<T: serde::de::DeserializeOwned>(
    path: &Path,
    bytes: &[u8],
) -> Result<T, FsError> {
    let bad = |m: String| damaged(path, m);
    let v: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| bad(format!("not JSON: {e}")))?;
    let serde_json::Value::Object(mut map) = v else {
        return Err(bad("not a JSON object".into()));
    };
    let (recorded, v) = match (map.remove(SEAL_KEY), map.remove(WRAPPED_KEY)) {
        (Some(serde_json::Value::String(d)), None) => (d, serde_json::Value::Object(map)),
        (None, Some(serde_json::Value::String(d))) if map.len() == 1 => {
            (d, map.remove("value").unwrap_or_default())
        }
        _ => {
            return Err(bad(format!(
                "no \"{SEAL_KEY}\" checksum (damaged, or not written by this foxhunt)"
            )));
        }
    };
    let found = hex(&sha256(
        &serde_json::to_vec(&v).expect("a parsed value serializes"),
    ));
    if found != recorded {
        return Err(bad(format!(
            "its contents changed after foxhunt wrote them (checksum {recorded} recorded, \
             {found} found)"
        )));
    }
    serde_json::from_value(v).map_err(|e| bad(format!("not what foxhunt wrote here: {e}")))
}

/// Creates a new directory `parent/stem`, or `parent/stem-2`, `stem-3`, ... where that name is
/// taken, and returns its path. Creating the directory is what reserves the name, so processes
/// started in the same second (names from a clock) never share one.
pub fn create_unique_dir(parent: &Path, stem: &str) -> Result<PathBuf, FsError> {
    std::fs::create_dir_all(parent).map_err(err(parent, "create the directory"))?;
    for n in 1u32.. {
        let path = if n == 1 {
            parent.join(stem)
        } else {
            parent.join(format!("{stem}-{n}"))
        };
        match std::fs::create_dir(&path) {
            Ok(()) => return Ok(path),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(err(&path, "create the directory")(e)),
        }
    }
    unreachable!("u32 names run out only after 4 billion directories")
}

/// The lock file a [`DirLock`] holds in its directory.
pub const LOCK_FILE: &str = ".lock";

/// A directory this process works in: an exclusive advisory lock on its [`LOCK_FILE`], held
/// until dropped. The operating system releases it when the process ends however it ends, so
/// a lock file left by a killed process never blocks the next one (no stale locks).
#[derive(Debug)]
pub struct DirLock {
    _file: std::fs::File,
}

/// Takes the lock of directory `dir` (which must exist), or fails at once, naming the process
/// that holds it.
pub fn lock_dir(dir: &Path) -> Result<DirLock, FsError> {
    lock_dir_within(dir, std::time::Duration::ZERO)
}

/// [`lock_dir`], waiting up to `patience` for a holder to let go: for short shared steps
/// (shards of one run checking its config) that several processes reach at the same moment.
pub fn lock_dir_within(dir: &Path, patience: std::time::Duration) -> Result<DirLock, FsError> {
    let start = std::time::Instant::now();
    loop {
        match try_lock_dir(dir) {
            Err(e)
                if e.source.kind() == std::io::ErrorKind::WouldBlock
                    && start.elapsed() < patience =>
            {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            other => return other,
        }
    }
}

fn try_lock_dir(dir: &Path) -> Result<DirLock, FsError> {
    use std::io::{Read, Seek};
    let path = dir.join(LOCK_FILE);
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(err(&path, "open"))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            let holder = holder.trim();
            let who = if holder.is_empty() {
                "another process".to_string()
            } else {
                format!("another process ({holder})")
            };
            return Err(err(&path, "take the lock")(std::io::Error::new(
                std::io::ErrorKind::WouldBlock,
                format!("{who} is using {}; wait for it to finish", dir.display()),
            )));
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(err(&path, "take the lock")(e)),
    }
    // Who holds it, for the message of the next process; the lock, not this text, is the rule.
    let _ = file.set_len(0);
    let _ = file.rewind();
    let _ = writeln!(file, "pid {}", std::process::id());
    Ok(DirLock { _file: file })
}

/// Flushes a directory's entries (a rename into it) to disk, where the platform allows it.
fn sync_dir(dir: &Path) {
    // Opening a directory for reading and fsyncing it is the POSIX way; elsewhere (or on file
    // systems that refuse it) the rename is as durable as the platform makes it.
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("foxhunt-fs-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn json_diff_names_each_differing_leaf_by_its_path() {
        let a =
            serde_json::json!({"train": {"seed": 11, "dqn": {"lr": 0.001, "hidden": [8]}}, "x": 1});
        let b = serde_json::json!({"train": {"seed": 12, "dqn": {"lr": 0.001, "hidden": [16]}}, "x": 1, "y": true});
        assert_eq!(
            json_diff(&a, &b),
            "train.dqn.hidden: [8] -> [16], train.seed: 11 -> 12, y: null -> true"
        );
        assert_eq!(json_diff(&a, &a), "");
    }

    #[test]
    fn writes_replace_whole_files_and_leave_no_temporary_files() {
        let dir = scratch("replace");
        let path = dir.join("sub/report.json");
        write_atomic(&path, b"first").expect("write");
        write_atomic(&path, b"second, longer").expect("rewrite");
        assert_eq!(std::fs::read(&path).expect("read"), b"second, longer");
        let entries: Vec<_> = std::fs::read_dir(dir.join("sub"))
            .expect("dir")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(entries, vec![std::ffi::OsString::from("report.json")]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn concurrent_writers_of_one_file_each_leave_a_whole_file() {
        let dir = scratch("race");
        let path = dir.join("state.bin");
        let payloads: Vec<Vec<u8>> = (0..8u8)
            .map(|k| vec![k; 100_000 + usize::from(k)])
            .collect();
        std::thread::scope(|s| {
            for p in &payloads {
                let path = &path;
                s.spawn(move || {
                    for _ in 0..20 {
                        write_atomic(path, p).expect("write");
                    }
                });
            }
        });
        let got = std::fs::read(&path).expect("read");
        assert!(
            payloads.contains(&got),
            "a mix of writers: {} bytes",
            got.len()
        );
        assert_eq!(
            std::fs::read_dir(&dir).expect("dir").count(),
            1,
            "no temporary left"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn sealed_files_read_back_and_any_changed_byte_is_refused() {
        let dir = scratch("sealed");
        let path = dir.join("state.bin");
        let body: Vec<u8> = (0..=255u8).cycle().take(1000).collect();
        write_sealed(&path, &body).expect("write");
        assert_eq!(read_sealed(&path).expect("read"), body);
        let good = std::fs::read(&path).expect("raw");
        // Every byte, body, magic or digest, flipped alone is caught.
        for i in (0..good.len()).step_by(7).chain([good.len() - 1]) {
            let mut bad = good.clone();
            bad[i] ^= 0x10;
            let e = unseal(&path, &bad).expect_err("flipped byte");
            assert_eq!(e.what, "trust the file", "byte {i}");
            assert!(e.to_string().contains("state.bin"), "{e}");
        }
        let e = unseal(&path, &good[..good.len() - 1]).expect_err("cut short");
        assert!(e.to_string().contains("no checksum"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn sealed_json_survives_reindenting_but_not_an_edit() {
        #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
        struct R {
            pnl: f64,
            trades: Vec<u32>,
            name: String,
        }
        let p = Path::new("report.json");
        let r = R {
            pnl: 0.1 + 0.2,
            trades: vec![1, 2, 3],
            name: "w".into(),
        };
        let bytes = to_sealed_json(&r).expect("json");
        assert_eq!(from_sealed_json::<R>(p, &bytes).expect("read"), r);
        let v: serde_json::Value = serde_json::from_slice(&bytes).expect("plain JSON");
        assert!(v[SEAL_KEY].is_string());
        let compact = serde_json::to_vec(&v).expect("compact");
        assert_eq!(from_sealed_json::<R>(p, &compact).expect("re-indented"), r);
        let edited = String::from_utf8(bytes.clone())
            .expect("utf8")
            .replace("0.30000000000000004", "0.4");
        let e = from_sealed_json::<R>(p, edited.as_bytes()).expect_err("edited");
        assert!(e.to_string().contains("changed after foxhunt wrote"), "{e}");
        let unsealed = serde_json::to_vec(&r).expect("plain");
        let e = from_sealed_json::<R>(p, &unsealed).expect_err("no digest");
        assert!(e.to_string().contains("no \"sha256\""), "{e}");
        // Values that are not objects are wrapped, and read back the same way.
        let list = vec![1.5f64, -2.0];
        let bytes = to_sealed_json(&list).expect("json");
        assert_eq!(from_sealed_json::<Vec<f64>>(p, &bytes).expect("read"), list);
        let edited = String::from_utf8(bytes)
            .expect("utf8")
            .replace("-2.0", "2.0");
        assert!(from_sealed_json::<Vec<f64>>(p, edited.as_bytes()).is_err());
    }

    #[test]
    fn unique_dirs_started_together_get_distinct_names() {
        let dir = scratch("unique");
        let made: Vec<PathBuf> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..8)
                .map(|_| s.spawn(|| create_unique_dir(&dir, "run-x").expect("create")))
                .collect();
            hs.into_iter().map(|h| h.join().expect("thread")).collect()
        });
        let mut names: Vec<String> = made
            .iter()
            .map(|p| p.file_name().expect("name").to_string_lossy().into_owned())
            .collect();
        names.sort();
        let mut want: Vec<String> = (1..=8)
            .map(|n| {
                if n == 1 {
                    "run-x".to_string()
                } else {
                    format!("run-x-{n}")
                }
            })
            .collect();
        want.sort();
        assert_eq!(names, want);
        assert!(made.iter().all(|p| p.is_dir()));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_held_lock_refuses_a_second_holder_until_dropped() {
        let dir = scratch("lock");
        std::fs::create_dir_all(&dir).expect("dir");
        let held = lock_dir(&dir).expect("first lock");
        // A second open file description is a second holder, even in this process.
        let e = lock_dir(&dir).expect_err("second lock");
        assert_eq!(e.what, "take the lock");
        let msg = e.to_string();
        assert!(
            msg.contains(&format!("pid {}", std::process::id())) && msg.contains("is using"),
            "{msg}"
        );
        drop(held);
        let again = lock_dir(&dir).expect("free after drop");
        drop(again);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_unwritable_place_is_an_error_naming_the_file() {
        let dir = scratch("blocked");
        std::fs::create_dir_all(&dir).expect("dir");
        // A file where a directory is needed.
        std::fs::write(dir.join("file"), b"x").expect("write");
        let path = dir.join("file/inside.json");
        let e = write_atomic(&path, b"y").expect_err("cannot write under a file");
        assert_eq!(
            (e.path.as_path(), e.what),
            (dir.join("file").as_path(), "create the directory")
        );
        assert!(
            e.to_string().starts_with(&format!(
                "{}: cannot create the directory: ",
                dir.join("file").display()
            )),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
