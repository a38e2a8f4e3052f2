//! What xtask's end-to-end checks share: finding a system program, running a command for its
//! output (with a time limit), and building the foxhunt binary they drive.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

/// A system program by name, or an error saying which Debian packages bring it.
pub fn tool(name: &str, packages: &str) -> Result<PathBuf> {
    for dir in ["/usr/sbin", "/usr/bin", "/sbin", "/bin", "/usr/local/bin"] {
        let p = Path::new(dir).join(name);
        if p.is_file() {
            return Ok(p);
        }
    }
    bail!("{name} not found: install it (Debian: apt-get install {packages})")
}

/// Runs `cmd` to its end and returns its standard output; a failure names the command, its
/// status and its standard error.
pub fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().with_context(|| format!("{cmd:?}"))?;
    ensure!(
        out.status.success(),
        "{cmd:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// [`output`] for a program that may hang (a browser): killed after `limit`.
pub fn output_within(cmd: &mut Command, limit: Duration) -> Result<String> {
    // One folder per call: the process id and a count of this process's calls.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "foxhunt-xtask-{}-{}",
        std::process::id(),
        CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir)?;
    let (out_path, err_path) = (dir.join("stdout"), dir.join("stderr"));
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path)?)
        .stderr(std::fs::File::create(&err_path)?)
        .spawn()
        .with_context(|| format!("{cmd:?}"))?;
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break s;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            let _ = std::fs::remove_dir_all(&dir);
            bail!("{cmd:?}: still running after {limit:?}, stopped");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let stdout = std::fs::read_to_string(&out_path).unwrap_or_default();
    let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    ensure!(status.success(), "{cmd:?}: {status}\n{stderr}");
    Ok(stdout)
}

/// Builds the foxhunt binary (debug, CPU and CUDA support as the workspace builds it) and
/// returns its path.
pub fn foxhunt_binary(root: &Path) -> Result<PathBuf> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    tracing::info!("building the foxhunt binary");
    output(
        Command::new(&cargo)
            .args(["build", "--locked", "-p", "foxhunt", "--bin", "foxhunt"])
            .current_dir(root),
    )?;
    let foxhunt = root.join("target/debug/foxhunt");
    ensure!(foxhunt.is_file(), "{} was not built", foxhunt.display());
    Ok(foxhunt)
}
