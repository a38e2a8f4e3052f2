//! `foxhunt data fetch` against a local stand-in for Databento's historical API on 127.0.0.1:
//! recorded-style responses built from the bundled DBN files (each day's file is what the API
//! streams for that day), and the API's failures: bad key, refused request, rate limit, a
//! connection that breaks in the middle of a file, no server at all. No test leaves the machine.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};

const KEY: &str = "db-testkeytestkeytestkeytestkey0";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn bundled(day: &str) -> PathBuf {
    root().join(format!(
        "test_data/futures-baseline/glbx-mdp3-{day}.ohlcv-1m.dbn.zst"
    ))
}

/// How the stand-in answers.
#[derive(Clone, Copy)]
enum Mode {
    /// Costs `cost`; streams each day's bundled file.
    Serve { cost: f64 },
    /// Every request fails with this status and detail.
    Fail(u16, &'static str),
    /// As `Serve` (cost 0), but the stream of day `YYYYMMDD` stops halfway.
    BreakOn(&'static str),
}

/// The stand-in: its address and the requests it took (`path day`).
struct Api {
    addr: SocketAddr,
    log: Arc<Mutex<Vec<String>>>,
}

impl Api {
    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
    fn requests(&self) -> Vec<String> {
        self.log.lock().expect("log").clone()
    }
}

fn day_of_nanos(ns: &str) -> String {
    let ns: i128 = ns.parse().expect("start in nanoseconds");
    jiff::Timestamp::from_nanosecond(ns)
        .expect("a time")
        .strftime("%Y%m%d")
        .to_string()
}

fn respond(s: &mut TcpStream, status: u16, kind: &str, body: &[u8]) {
    let head = format!(
        "HTTP/1.1 {status} X\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = s.write_all(head.as_bytes());
    let _ = s.write_all(body);
}

fn handle(mut s: TcpStream, mode: Mode, log: &Mutex<Vec<String>>) {
    let mut r = BufReader::new(s.try_clone().expect("clone"));
    let mut line = String::new();
    if r.read_line(&mut line).is_err() {
        return;
    }
    let path = line.split_whitespace().nth(1).unwrap_or("").to_owned();
    let (mut len, mut auth) = (0usize, String::new());
    loop {
        let mut h = String::new();
        if r.read_line(&mut h).is_err() || h == "\r\n" || h.is_empty() {
            break;
        }
        let (k, v) = h.split_once(':').unwrap_or(("", ""));
        match k.to_ascii_lowercase().as_str() {
            "content-length" => len = v.trim().parse().unwrap_or(0),
            "authorization" => auth = v.trim().to_owned(),
            _ => {}
        }
    }
    let mut body = vec![0; len];
    let _ = r.read_exact(&mut body);
    let form = String::from_utf8_lossy(&body).into_owned();
    let field = |k: &str| {
        form.split('&')
            .find_map(|kv| kv.strip_prefix(&format!("{k}=")).map(str::to_owned))
    };
    let day = field("start").map(|s| day_of_nanos(&s)).unwrap_or_default();
    log.lock().expect("log").push(format!("{path} {day}"));
    // Basic auth with the key as the user name, as the API takes it.
    use base64_standin::encode;
    if auth != format!("Basic {}", encode(&format!("{KEY}:"))) {
        let detail = br#"{"detail": "Authorization failed: illegal chars in username."}"#;
        return respond(&mut s, 401, "application/json", detail);
    }
    match mode {
        Mode::Fail(status, detail) => {
            let body = format!("{{\"detail\": \"{detail}\"}}");
            respond(&mut s, status, "application/json", body.as_bytes());
        }
        Mode::Serve { .. } | Mode::BreakOn(_) if path.ends_with("metadata.get_cost") => {
            let cost = match mode {
                Mode::Serve { cost } => cost,
                _ => 0.0,
            };
            respond(&mut s, 200, "application/json", cost.to_string().as_bytes());
        }
        Mode::Serve { .. } | Mode::BreakOn(_) if path.ends_with("timeseries.get_range") => {
            let bytes = std::fs::read(bundled(&day)).expect("a bundled day");
            if matches!(mode, Mode::BreakOn(d) if d == day) {
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    bytes.len()
                );
                let _ = s.write_all(head.as_bytes());
                let _ = s.write_all(&bytes[..bytes.len() / 2]);
                let _ = s.flush();
                let _ = s.shutdown(std::net::Shutdown::Both);
                return;
            }
            respond(&mut s, 200, "application/octet-stream", &bytes);
        }
        _ => respond(
            &mut s,
            404,
            "application/json",
            br#"{"detail": "not found"}"#,
        ),
    }
}

/// Starts the stand-in on a free port of 127.0.0.1; it answers until the test process ends.
fn serve(mode: Mode) -> Api {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let log = Arc::new(Mutex::new(Vec::new()));
    let l = log.clone();
    std::thread::spawn(move || {
        for s in listener.incoming().flatten() {
            handle(s, mode, &l);
        }
    });
    Api { addr, log }
}

/// The smallest base64 encoder, for the Authorization header the stand-in expects.
mod base64_standin {
    pub fn encode(s: &str) -> String {
        const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let b = s.as_bytes();
        let mut out = String::new();
        for c in b.chunks(3) {
            let n = (u32::from(c[0]) << 16)
                | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
                | u32::from(*c.get(2).unwrap_or(&0));
            for i in 0..4 {
                if i <= c.len() {
                    out.push(T[((n >> (18 - 6 * i)) & 63) as usize] as char);
                } else {
                    out.push('=');
                }
            }
        }
        out
    }
}

fn fetch(url: &str, key: Option<&str>, out: &Path, extra: &[&str]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_foxhunt"));
    c.args([
        "data",
        "fetch",
        "--symbol",
        "ES.FUT",
        "--start",
        "2013-10-07",
    ])
    .args(["--end", "2013-10-10", "--out"])
    .arg(out)
    .args(["--api-url", url])
    .args(extra)
    .current_dir(root());
    match key {
        Some(k) => c.env("DATABENTO_API_KEY", k),
        None => c.env_remove("DATABENTO_API_KEY"),
    };
    c.output().expect("foxhunt runs")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn scratch(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("foxhunt-fetch-{name}-"))
        .tempdir()
        .expect("temp dir")
}

fn files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Records of a DBN file, decoded to its end.
fn records(path: &Path) -> Vec<Vec<u8>> {
    use dbn::decode::{DecodeRecordRef, DynDecoder};
    let mut d = DynDecoder::from_file(path, dbn::VersionUpgradePolicy::AsIs).expect("decodes");
    let mut out = Vec::new();
    while let Some(r) = d.decode_record_ref().expect("record") {
        out.push(r.as_ref().to_vec());
    }
    out
}

const DAYS: [&str; 3] = ["20131007", "20131008", "20131009"];

#[test]
fn fetched_days_are_the_apis_records_data_dir_reads_them_and_a_rerun_fetches_nothing() {
    let api = serve(Mode::Serve { cost: 0.0 });
    let tmp = scratch("ok");
    let out = tmp.path().join("es");
    let o = fetch(&api.url(), Some(KEY), &out, &[]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("estimated cost"), "{}", text(&o));
    let names: Vec<String> = DAYS
        .iter()
        .map(|d| format!("glbx-mdp3-{d}.ohlcv-1m.dbn.zst"))
        .collect();
    assert_eq!(files(&out), names);
    for (d, n) in DAYS.iter().zip(&names) {
        assert_eq!(records(&out.join(n)), records(&bundled(d)), "{n}");
    }
    // --data-dir reads the folder as it is.
    let inspect = Command::new(env!("CARGO_BIN_EXE_foxhunt"))
        .args(["data", "inspect", "--symbol", "ES.FUT", "--data-dir"])
        .arg(&out)
        .output()
        .expect("inspect");
    assert!(inspect.status.success(), "{}", text(&inspect));
    // Complete files are not fetched again: the second run asks the API nothing.
    let before = api.requests().len();
    let again = fetch(&api.url(), Some(KEY), &out, &[]);
    assert!(again.status.success(), "{}", text(&again));
    assert!(
        text(&again).contains("3 of 3 days already"),
        "{}",
        text(&again)
    );
    assert_eq!(api.requests().len(), before);
}

#[test]
fn above_the_cost_limit_nothing_is_downloaded_without_yes() {
    let api = serve(Mode::Serve { cost: 12.5 });
    let tmp = scratch("cost");
    let out = tmp.path().join("es");
    let o = fetch(&api.url(), Some(KEY), &out, &["--max-cost", "10"]);
    assert!(!o.status.success());
    let t = text(&o);
    assert!(t.contains("$12.50") && t.contains("--yes"), "{t}");
    assert!(files(&out).is_empty(), "{:?}", files(&out));
    assert!(
        api.requests().iter().all(|r| !r.contains("timeseries")),
        "{:?}",
        api.requests()
    );
    let yes = fetch(&api.url(), Some(KEY), &out, &["--max-cost", "10", "--yes"]);
    assert!(yes.status.success(), "{}", text(&yes));
    assert_eq!(files(&out).len(), 3);
}

#[test]
fn a_download_broken_off_mid_file_keeps_the_days_before_and_resumes_from_it() {
    let broken = serve(Mode::BreakOn("20131008"));
    let tmp = scratch("break");
    let out = tmp.path().join("es");
    let o = fetch(&broken.url(), Some(KEY), &out, &[]);
    assert!(!o.status.success());
    let t = text(&o);
    assert!(
        t.contains("2013-10-08") && t.contains("run the same command again"),
        "{t}"
    );
    // Day one is whole; day two has no file under any name (no partial file is left).
    assert_eq!(files(&out), vec!["glbx-mdp3-20131007.ohlcv-1m.dbn.zst"]);
    let healthy = serve(Mode::Serve { cost: 0.0 });
    let again = fetch(&healthy.url(), Some(KEY), &out, &[]);
    assert!(again.status.success(), "{}", text(&again));
    let fetched: Vec<String> = healthy
        .requests()
        .into_iter()
        .filter(|r| r.contains("timeseries"))
        .collect();
    assert_eq!(
        fetched,
        vec![
            "/v0/timeseries.get_range 20131008",
            "/v0/timeseries.get_range 20131009"
        ]
    );
    assert_eq!(files(&out).len(), 3);
}

#[test]
fn each_failure_is_one_clear_line_and_a_nonzero_exit() {
    let tmp = scratch("fail");
    let out = tmp.path().join("es");
    let cases: Vec<(Option<&str>, Mode, &str)> = vec![
        (
            None,
            Mode::Serve { cost: 0.0 },
            "DATABENTO_API_KEY is not set",
        ),
        (
            Some("db-wrongkeywrongkeywrongkeywrong"),
            Mode::Serve { cost: 0.0 },
            "authentication failed (HTTP 401)",
        ),
        (
            Some(KEY),
            Mode::Fail(422, "Could not resolve symbol ES.FUT in dataset GLBX.MDP3"),
            "refused the request for ES.FUT in GLBX.MDP3",
        ),
        (
            Some(KEY),
            Mode::Fail(429, "Too many requests"),
            "rate limited by the API (HTTP 429)",
        ),
        (
            Some(KEY),
            Mode::Fail(503, "Service unavailable"),
            "the API failed (HTTP 503)",
        ),
    ];
    for (key, mode, want) in cases {
        let api = serve(mode);
        let o = fetch(&api.url(), key, &out, &[]);
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(!o.status.success(), "{want}");
        assert!(err.contains(want), "{want}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    // No server at all: the port is closed.
    let port = TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let o = fetch(&format!("http://127.0.0.1:{port}"), Some(KEY), &out, &[]);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(
        !o.status.success() && err.contains("cannot reach the API"),
        "{err}"
    );
    assert!(files(&out).is_empty());
}
