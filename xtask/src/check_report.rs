//! `cargo xtask check-report`: report.html of a bundled-data run, looked at in a real browser.
//! Trains a small week-window run on the bundled ES data, renders its report.html in headless
//! Chromium (Debian's `chromium`), takes a screenshot for a person to look at
//! (target/check-report/report.png) and checks the DOM the browser built (`--dump-dom`) holds
//! every chart with its data, as the written file does (`foxhunt_trainer::html::check`).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use foxhunt_trainer::html;

use crate::tools::{foxhunt_binary, output, output_within, tool};

/// A run with every chart: several windows, enough epochs for training curves.
const FLAGS: &[&str] = &[
    "--symbol",
    "ES.FUT",
    "--train-weeks",
    "4",
    "--val-weeks",
    "1",
    "--test-weeks",
    "1",
    "--step-weeks",
    "4",
    "--epochs",
    "4",
    "--max-steps-per-epoch",
    "16",
    "--envs",
    "8",
    "--learning-starts",
    "32",
    "--batch-size",
    "32",
    "--hidden",
    "16",
    "--device",
    "cpu",
    "--no-progress",
];

/// Chromium's flags for a headless run as root on a machine with no network (background
/// services off, so it makes no connections of its own).
fn chromium(bin: &Path, profile: &Path) -> Command {
    let mut c = Command::new(bin);
    c.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
    ])
    .arg(format!("--user-data-dir={}", profile.display()));
    c
}

fn report_check(what: &str, html_text: &str) -> Result<()> {
    match html::check(html_text, html::CHARTS) {
        Ok(found) => {
            for (id, n) in found {
                tracing::info!("{what}: chart-{id}: {n} data marks");
            }
            Ok(())
        }
        Err(problems) => bail!("{what}:\n  {}", problems.join("\n  ")),
    }
}

pub fn run(root: &Path) -> Result<()> {
    let browser = tool("chromium", "chromium")?;
    let foxhunt = foxhunt_binary(root)?;
    let dir = root.join("target/check-report");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| dir.display().to_string())?;
    let run = dir.join("run");
    tracing::info!("training a small run on the bundled data");
    output(
        Command::new(&foxhunt)
            .arg("train")
            .arg("--data-dir")
            .arg(root.join("test_data/futures-baseline"))
            .args(FLAGS)
            .arg("--out")
            .arg(&run),
    )?;
    let page = run.join("report.html");
    let written = std::fs::read_to_string(&page).with_context(|| page.display().to_string())?;
    report_check("report.html as written", &written)?;

    let url = format!("file://{}", page.display());
    let limit = Duration::from_secs(120);
    let dom = output_within(
        chromium(&browser, &dir.join("profile-dom"))
            .arg("--dump-dom")
            .arg(&url),
        limit,
    )?;
    std::fs::write(dir.join("dom.html"), &dom)?;
    report_check("the DOM Chromium built", &dom)?;

    let shot = dir.join("report.png");
    output_within(
        chromium(&browser, &dir.join("profile-shot"))
            .arg(format!("--screenshot={}", shot.display()))
            .arg("--window-size=1280,5200")
            .arg(&url),
        limit,
    )?;
    let bytes =
        std::fs::read(&shot).with_context(|| format!("no screenshot {}", shot.display()))?;
    let decoder = png::Decoder::new(std::io::Cursor::new(bytes));
    let mut reader = decoder.read_info().context("the screenshot is not a PNG")?;
    let mut buf = vec![0; reader.output_buffer_size().context("screenshot size")?];
    let info = reader
        .next_frame(&mut buf)
        .context("the screenshot's pixels")?;
    let px = info.color_type.samples();
    let inked = buf[..info.buffer_size()]
        .chunks(px)
        .filter(|p| p.iter().take(3).any(|&v| v < 200))
        .count();
    let share = inked as f64 / (info.width as f64 * info.height as f64);
    ensure!(
        share > 0.01,
        "the screenshot {} is blank ({:.3}% of its pixels inked)",
        shot.display(),
        share * 100.0
    );
    tracing::info!(
        "report.html rendered by {}: every chart holds its data; screenshot {} ({}x{}, {:.1}% inked)",
        browser.display(),
        shot.display(),
        info.width,
        info.height,
        share * 100.0
    );
    Ok(())
}
