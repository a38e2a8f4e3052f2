//! foxhunt-fs: how foxhunt writes the files a user keeps. One rule, used by every crate that
//! writes: a file is replaced atomically, so a crash, a full disk or a second writer leaves
//! either the old file or the new one, never a mix.

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
