//! `cargo xtask slurm-test`: the shipped sbatch script on a real one-node Slurm cluster. Starts
//! munged, slurmctld and slurmd (a generated slurm.conf in a scratch folder, linuxproc process
//! tracking, no cgroups), submits deploy/slurm/foxhunt-array.sbatch as an array of 3 over the
//! bundled data, waits for it, runs `foxhunt report`, checks that the aggregate equals an
//! unsharded run's results, and stops the daemons it started. Needs Debian's slurmctld, slurmd,
//! slurm-client and munge, and root (the daemons run as root here).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

use crate::tools::{foxhunt_binary, output, tool};

/// The training flags every shard and the unsharded run take: week-sized windows over the
/// bundled ES data (about ten windows), a small network, so the whole test takes seconds a shard.
const FLAGS: &[&str] = &[
    "--train-weeks",
    "4",
    "--val-weeks",
    "1",
    "--test-weeks",
    "1",
    "--step-weeks",
    "2",
    "--epochs",
    "1",
    "--max-steps-per-epoch",
    "8",
    "--envs",
    "4",
    "--learning-starts",
    "16",
    "--batch-size",
    "16",
    "--hidden",
    "8",
    "--device",
    "cpu",
];

const SHARDS: usize = 3;

/// Daemons this test started, stopped (and reaped) however it ends.
struct Daemons(Vec<(String, Child)>);

impl Drop for Daemons {
    fn drop(&mut self) {
        // slurmd first, so that no step outlives the controller it reports to.
        for (name, child) in self.0.iter_mut().rev() {
            let _ = child.kill();
            match child.wait() {
                Ok(status) => tracing::info!("stopped {name} (pid {}): {status}", child.id()),
                Err(e) => tracing::warn!("{name} (pid {}): {e}", child.id()),
            }
        }
    }
}

impl Daemons {
    fn start(&mut self, name: &str, cmd: &mut Command, log: &Path) -> Result<()> {
        let out = std::fs::File::create(log).with_context(|| format!("{}", log.display()))?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("cannot start {name}"))?;
        tracing::info!("started {name} (pid {})", child.id());
        self.0.push((name.to_owned(), child));
        Ok(())
    }

    /// Fails when a daemon has already exited, naming its log.
    fn check(&mut self, dir: &Path) -> Result<()> {
        for (name, child) in &mut self.0 {
            if let Some(status) = child.try_wait()? {
                let log =
                    std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default();
                bail!("{name} exited ({status}):\n{log}");
            }
        }
        Ok(())
    }
}

/// A TCP port nothing listens on now.
fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The results of a run's report.json (`RunReport::results`).
fn results(dir: &Path) -> Result<serde_json::Value> {
    let r: foxhunt_trainer::RunReport =
        foxhunt_trainer::report::read_json(&dir.join("report.json"))?;
    Ok(r.results())
}

pub fn run(root: &Path) -> Result<()> {
    let tool = |name| tool(name, "slurmctld slurmd slurm-client munge");
    let (munged, slurmctld, slurmd, sbatch, sinfo, mungekey) = (
        tool("munged")?,
        tool("slurmctld")?,
        tool("slurmd")?,
        tool("sbatch")?,
        tool("sinfo")?,
        tool("mungekey")?,
    );
    let foxhunt = foxhunt_binary(root)?;

    let dir = std::env::temp_dir().join(format!("foxhunt-slurm-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for sub in ["state", "spool", "runs"] {
        std::fs::create_dir_all(dir.join(sub))?;
    }
    let host = output(Command::new("hostname").arg("-s"))?
        .trim()
        .to_owned();
    let key = dir.join("munge.key");
    output(
        Command::new(&mungekey)
            .arg("--create")
            .arg(format!("--keyfile={}", key.display()))
            .arg("--force"),
    )?;
    let socket = dir.join("munge.sock");
    let conf = dir.join("slurm.conf");
    let (ctld_port, d_port) = (free_port()?, free_port()?);
    let p = |name: &str| dir.join(name).display().to_string();
    std::fs::write(
        &conf,
        format!(
            "ClusterName=foxhunt-test\n\
             SlurmctldHost={host}\n\
             SlurmUser=root\n\
             SlurmdUser=root\n\
             AuthType=auth/munge\n\
             AuthInfo=socket={socket}\n\
             CredType=cred/munge\n\
             MpiDefault=none\n\
             ProctrackType=proctrack/linuxproc\n\
             TaskPlugin=task/none\n\
             JobAcctGatherType=jobacct_gather/none\n\
             SelectType=select/cons_tres\n\
             SelectTypeParameters=CR_Core\n\
             ReturnToService=2\n\
             SlurmctldPort={ctld_port}\n\
             SlurmdPort={d_port}\n\
             StateSaveLocation={state}\n\
             SlurmdSpoolDir={spool}\n\
             SlurmctldPidFile={ctld_pid}\n\
             SlurmdPidFile={d_pid}\n\
             NodeName={host} CPUs=2 RealMemory=1000 State=UNKNOWN\n\
             PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n",
            socket = socket.display(),
            state = p("state"),
            spool = p("spool"),
            ctld_pid = p("slurmctld.pid"),
            d_pid = p("slurmd.pid"),
        ),
    )?;

    let mut daemons = Daemons(Vec::new());
    daemons.start(
        "munged",
        Command::new(&munged)
            .arg("-F")
            .arg("--force")
            .arg(format!("--key-file={}", key.display()))
            .arg(format!("--socket={}", socket.display()))
            .arg(format!("--pid-file={}", p("munged.pid")))
            .arg(format!("--seed-file={}", p("munge.seed")))
            .arg(format!("--log-file={}", p("munged.file.log"))),
        &dir.join("munged.log"),
    )?;
    let until = |what: &str, secs: u64, daemons: &mut Daemons, ok: &dyn Fn() -> bool| {
        let start = Instant::now();
        while !ok() {
            daemons.check(&dir)?;
            if start.elapsed() > Duration::from_secs(secs) {
                bail!(
                    "{what} not ready after {secs} s (logs in {})",
                    dir.display()
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(())
    };
    until("munged's socket", 30, &mut daemons, &|| socket.exists())?;
    for (name, bin) in [("slurmctld", &slurmctld), ("slurmd", &slurmd)] {
        daemons.start(
            name,
            Command::new(bin)
                .arg("-D")
                .arg("-f")
                .arg(&conf)
                .env("SLURM_CONF", &conf),
            &dir.join(format!("{name}.log")),
        )?;
    }
    let node_state = || {
        Command::new(&sinfo)
            .args(["-h", "-o", "%t"])
            .env("SLURM_CONF", &conf)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .unwrap_or_default()
    };
    until("the node", 60, &mut daemons, &|| node_state() == "idle")?;
    tracing::info!("one-node Slurm cluster up ({host}, slurmctld port {ctld_port})");

    let sharded = dir.join("runs/sharded");
    let t = Instant::now();
    let script = root.join("deploy/slurm/foxhunt-array.sbatch");
    let submitted = Command::new(&sbatch)
        .arg("--wait")
        .arg(format!("--array=0-{}", SHARDS - 1))
        .arg(format!("--output={}/shard-%a.out", dir.display()))
        .arg(&script)
        .args(FLAGS)
        .env("SLURM_CONF", &conf)
        .env("RUN_DIR", &sharded)
        .env("DATA_DIR", root.join("test_data/futures-baseline"))
        .env("FOXHUNT", &foxhunt)
        .current_dir(&dir)
        .output()
        .context("sbatch")?;
    let logs = || {
        (0..SHARDS)
            .map(|k| {
                let f = dir.join(format!("shard-{k}.out"));
                format!(
                    "--- {}\n{}",
                    f.display(),
                    std::fs::read_to_string(&f).unwrap_or_default()
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    ensure!(
        submitted.status.success(),
        "the job array failed ({}): {}\n{}",
        submitted.status,
        String::from_utf8_lossy(&submitted.stderr),
        logs()
    );
    tracing::info!(
        "job array of {SHARDS} done in {:.1} s: {}",
        t.elapsed().as_secs_f64(),
        String::from_utf8_lossy(&submitted.stdout).trim()
    );
    let shard_logs = logs();
    for k in 0..SHARDS {
        ensure!(
            shard_logs.contains(&format!("shard {k}/{SHARDS} owns")),
            "shard {k} did not report its windows:\n{shard_logs}"
        );
    }

    let summary = output(Command::new(&foxhunt).arg("report").arg(&sharded))?;
    print!("{summary}");
    let full = dir.join("runs/unsharded");
    output(
        Command::new(&foxhunt)
            .args(["train", "--data-dir"])
            .arg(root.join("test_data/futures-baseline"))
            .args(["--symbol", "ES.FUT", "--no-progress", "--out"])
            .arg(&full)
            .args(FLAGS),
    )?;
    let (a, b) = (results(&sharded)?, results(&full)?);
    let windows = a["windows"].as_array().map_or(0, Vec::len);
    ensure!(
        a == b,
        "the sharded run's results differ from the unsharded run's: {}",
        foxhunt_fs::json_diff(&a, &b)
    );
    ensure!(windows > SHARDS, "only {windows} windows: too few to shard");
    drop(daemons);
    std::fs::remove_dir_all(&dir)?;
    println!(
        "slurm-test: {SHARDS} array tasks trained {windows} windows; the aggregate equals the \
         unsharded run's results"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use foxhunt::args::TrainArgs;

    #[derive(Parser)]
    enum Cli {
        Train(TrainArgs),
    }

    fn root() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("workspace")
            .to_path_buf()
    }

    /// The fields of the shipped Indexed Job that the binary relies on: Indexed completions,
    /// JOB_COMPLETIONS equal to the completions, and a command line `foxhunt train` accepts,
    /// with a shared --out, --resume for retried pods, and the shard left to the environment.
    #[test]
    fn the_kubernetes_manifest_runs_one_shard_per_index() {
        let text = std::fs::read_to_string(root().join("deploy/k8s/foxhunt-indexed-job.yaml"))
            .expect("manifest");
        let job: serde_yaml::Value = serde_yaml::from_str(&text).expect("YAML");
        assert_eq!(job["kind"].as_str(), Some("Job"));
        let spec = &job["spec"];
        assert_eq!(spec["completionMode"].as_str(), Some("Indexed"));
        let completions = spec["completions"].as_u64().expect("completions");
        let container = &spec["template"]["spec"]["containers"][0];
        let env = container["env"].as_sequence().expect("env");
        let count = env
            .iter()
            .find(|e| e["name"].as_str() == Some("JOB_COMPLETIONS"))
            .and_then(|e| e["value"].as_str())
            .expect("JOB_COMPLETIONS");
        assert_eq!(
            count,
            completions.to_string(),
            "JOB_COMPLETIONS = completions"
        );
        let command: Vec<&str> = container["command"]
            .as_sequence()
            .expect("command")
            .iter()
            .map(|v| v.as_str().expect("a string"))
            .collect();
        assert_eq!(command[..2], ["foxhunt", "train"]);
        let Cli::Train(args) = Cli::try_parse_from(&command).expect("foxhunt train takes it");
        assert!(args.resume, "a retried pod continues its windows");
        assert!(args.exec.shard.is_none() && args.exec.shard_count.is_none());
        let out = args.out.as_ref().expect("--out");
        let mounts = container["volumeMounts"].as_sequence().expect("mounts");
        assert!(
            mounts.iter().any(|m| m["mountPath"]
                .as_str()
                .is_some_and(|p| out.starts_with(p) && m["readOnly"].as_bool() != Some(true))),
            "--out {} lies on a writable shared volume",
            out.display()
        );
        args.recorded().expect("a complete set of settings");
        let shard = foxhunt_trainer::Shard::from_env(
            |v| match v {
                "JOB_COMPLETION_INDEX" => Some("2".into()),
                "JOB_COMPLETIONS" => Some(count.into()),
                _ => None,
            },
            None,
        )
        .expect("valid")
        .expect("a shard");
        assert_eq!((shard.index, shard.count as u64), (2, completions));
    }
}
