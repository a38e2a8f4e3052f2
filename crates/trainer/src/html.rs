//! report.html: a run's tearsheet in one self-contained file (inline SVG charts drawn by
//! [`crate::charts`], inline CSS, no script, nothing fetched when it is viewed), and the check
//! that a written or browser-rendered report holds every chart with its data ([`check`]).
//!
//! One source: every number in a table is report.json's; the curves are the windows'
//! curves.json, the same pieces report.json's aggregate was computed from.

use std::fmt::Write as _;

use crate::charts::{Chart, Histogram, Line, LineChart, Marks, StackedBars, XAxis, decimate};
use crate::report::{Curve, RunReport, WindowStatus, chained_equity};
use crate::{PhaseTimes, Shard};

/// The charts of a run with results, by figure id (`chart-<id>`): what [`check`] looks for.
pub const CHARTS: &[&str] = &[
    "equity",
    "drawdown",
    "daily-pnl",
    "train-loss",
    "train-mean-q",
    "train-td-abs",
    "train-grad-norm",
    "train-val-pnl",
    "phases",
];

/// Horizontal resolution a curve is kept at (x-buckets of [`decimate`]).
const CURVE_BUCKETS: usize = 1200;

/// Size of the equity chart, in the HTML and in equity.png.
pub const EQUITY_SIZE: (u32, u32) = (1200, 460);

/// What a report is drawn from.
pub struct Inputs<'a> {
    /// The run's name (its directory's).
    pub name: &'a str,
    /// report.json.
    pub report: &'a RunReport,
    /// Each finished window's test-period curves (agent first, then the baselines).
    pub curves: &'a [(usize, Vec<Curve>)],
    /// config.json.
    pub config: &'a serde_json::Value,
    /// The shards that worked on the run (from their markers), if it was sharded.
    pub shards: &'a [Shard],
}

fn ns_to_days(ns: i64) -> f64 {
    ns as f64 / 86_400e9
}

/// Each policy's equity chained over the test periods, as (days since epoch, USD).
fn chained(curves: &[(usize, Vec<Curve>)]) -> Vec<Line> {
    chained_ns(curves)
        .into_iter()
        .map(|(name, points)| Line {
            name,
            points: points
                .into_iter()
                .map(|(t, v)| (ns_to_days(t), v))
                .collect(),
        })
        .collect()
}

/// Each policy's name and equity chained over the test periods, at its bars' times (ns UTC).
fn chained_ns(curves: &[(usize, Vec<Curve>)]) -> Vec<(String, Vec<(i64, f64)>)> {
    let Some((_, first)) = curves.first() else {
        return Vec::new();
    };
    (0..first.len())
        .map(|k| {
            let parts: Vec<&Curve> = curves.iter().map(|(_, c)| &c[k]).collect();
            let values = chained_equity(&parts);
            let times = parts.iter().flat_map(|c| c.equity.iter().map(|&(t, _)| t));
            (first[k].policy.clone(), times.zip(values).collect())
        })
        .collect()
}

/// The out-of-sample equity chart: every policy chained over the test periods, each window's
/// start marked. equity.png is this chart.
pub fn equity_chart(curves: &[(usize, Vec<Curve>)]) -> LineChart {
    LineChart {
        title: "Out-of-sample equity, net of costs (all test periods)".into(),
        x: XAxis::Date,
        x_desc: "bar time (UTC)".into(),
        y_desc: "USD".into(),
        lines: chained(curves)
            .into_iter()
            .map(|l| Line {
                points: decimate(&l.points, CURVE_BUCKETS),
                name: l.name,
            })
            .collect(),
        markers: window_starts(curves),
        area: false,
        dots: false,
    }
}

fn window_starts(curves: &[(usize, Vec<Curve>)]) -> Vec<(f64, String)> {
    curves
        .iter()
        .filter_map(|(w, c)| {
            let &(t, _) = c.first()?.equity.first()?;
            Some((ns_to_days(t), format!("w{w}")))
        })
        .collect()
}

/// Drawdown (equity below its running maximum) of the agent and of buy-and-hold.
fn drawdown_chart(curves: &[(usize, Vec<Curve>)]) -> LineChart {
    let lines = chained(curves)
        .into_iter()
        .filter(|l| l.name == "agent" || l.name == "buy-and-hold")
        .map(|l| {
            let mut peak = 0.0f64;
            let dd: Vec<(f64, f64)> = l
                .points
                .iter()
                .map(|&(x, e)| {
                    peak = peak.max(e);
                    (x, e - peak)
                })
                .collect();
            Line {
                name: l.name,
                points: decimate(&dd, CURVE_BUCKETS),
            }
        })
        .collect();
    LineChart {
        title: "Drawdown from the running peak (all test periods)".into(),
        x: XAxis::Date,
        x_desc: "bar time (UTC)".into(),
        y_desc: "USD".into(),
        lines,
        markers: window_starts(curves),
        area: true,
        dots: false,
    }
}

fn daily_chart(curves: &[(usize, Vec<Curve>)]) -> Histogram {
    Histogram {
        title: "Agent's daily net PnL, all test days".into(),
        x_desc: "USD per day".into(),
        values: curves
            .iter()
            .flat_map(|(_, c)| c[0].daily_pnl.iter().copied())
            .collect(),
        bins: 30,
    }
}

/// One of an epoch's statistics, where it has one.
type EpochStat = fn(&crate::report::EpochSummary) -> Option<f64>;

/// One line per window of an epoch statistic.
fn training_chart(r: &RunReport, title: &str, y_desc: &str, f: EpochStat) -> LineChart {
    LineChart {
        title: title.into(),
        x: XAxis::Count,
        x_desc: "epoch".into(),
        y_desc: y_desc.into(),
        lines: r
            .windows
            .iter()
            .map(|w| Line {
                name: format!("w{}", w.index),
                points: w
                    .epochs
                    .iter()
                    .filter_map(|e| Some((e.epoch as f64, f(e)?)).filter(|p| p.1.is_finite()))
                    .collect(),
            })
            .collect(),
        markers: Vec::new(),
        area: false,
        dots: true,
    }
}

fn phases_chart(phases: &[PhaseTimes]) -> StackedBars {
    let layer = |name: &str, f: fn(&PhaseTimes) -> f64| {
        (name.to_string(), phases.iter().map(f).collect::<Vec<_>>())
    };
    StackedBars {
        title: "Where each epoch's time goes (ms)".into(),
        x_desc: "epoch of the run".into(),
        y_desc: "ms".into(),
        layers: vec![
            layer("init", |p| p.init),
            layer("collect", |p| p.collect),
            layer("train", |p| p.train),
            layer("sync", |p| p.sync),
            layer("eval", |p| p.eval),
        ],
        markers: phases
            .iter()
            .enumerate()
            .filter(|(i, p)| *i > 0 && p.epoch == 0)
            .map(|(i, p)| (i as f64 - 0.5, format!("w{}", p.window)))
            .collect(),
    }
}

/// Text made safe inside HTML elements and attribute values.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Money with thousands separators and cents: `-12,345.60`.
fn money(v: f64) -> String {
    crate::charts::grouped(v, 2)
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or("–".into(), |v| format!("{v:.digits$}"))
}

/// A number cell, classed by sign for colour.
/// The population of every window that trained one: each member's settings, seed and
/// validation result, the selected agent and the vote's members marked.
fn population_section(h: &mut String, r: &RunReport) {
    let with: Vec<_> = r
        .windows
        .iter()
        .filter_map(|w| Some((w.index, w.population.as_ref()?)))
        .collect();
    if with.is_empty() {
        return;
    }
    h.push_str("<section id=\"population\"><h2>Population (validation only)</h2>\n");
    for (index, p) in with {
        let _ = write!(
            h,
            "<h3>Window {index}: agent {} selected by validation {}</h3>\n\
             <table class=\"population-table\"><tr><th>agent</th><th>seed</th><th>settings</th>\
             <th>best epoch</th><th>validation PnL</th><th>validation Sharpe</th><th>role</th></tr>\n",
            p.selected,
            match p.select {
                crate::population::Select::Pnl => "net PnL",
                crate::population::Select::Sharpe => "Sharpe",
            }
        );
        for m in &p.members {
            let role = match (
                &m.status,
                m.index == p.selected,
                p.ensemble.contains(&m.index),
            ) {
                (WindowStatus::Failed { .. }, ..) => "failed",
                (_, true, true) => "selected, vote",
                (_, true, false) => "selected",
                (_, false, true) => "vote",
                _ => "",
            };
            let _ = write!(
                h,
                "<tr><td class=\"num\">{}</td><td class=\"num\">{}</td><td>{}</td>",
                m.index,
                m.seed,
                esc(&crate::population::describe(&m.settings))
            );
            match (&m.status, &m.validation) {
                (WindowStatus::Ok, Some(v)) => {
                    let _ = write!(
                        h,
                        "<td class=\"num\">{}</td>{}<td class=\"num\">{}</td>",
                        m.best_epoch.map_or("–".into(), |e| e.to_string()),
                        pnl_cell(v.total_pnl),
                        v.sharpe.map_or("–".into(), |s| format!("{s:.2}"))
                    );
                }
                (WindowStatus::Failed { error }, _) => {
                    let _ = write!(h, "<td class=\"failed\" colspan=\"3\">{}</td>", esc(error));
                }
                _ => h.push_str("<td>–</td><td>–</td><td>–</td>"),
            }
            let _ = writeln!(h, "<td>{role}</td></tr>");
        }
        h.push_str("</table>\n");
    }
    h.push_str("</section>\n");
}

fn pnl_cell(v: f64) -> String {
    let class = if v > 0.0 {
        "pos"
    } else if v < 0.0 {
        "neg"
    } else {
        "zero"
    };
    format!("<td class=\"num {class}\">{}</td>", money(v))
}

fn figure(out: &mut String, id: &str, chart: &Chart, size: (u32, u32)) {
    let (kind, marks) = match chart.marks() {
        Marks::Lines(n) => ("lines", n),
        Marks::Dots(n) => ("dots", n),
        Marks::Bars(n) => ("bars", n),
    };
    let _ = writeln!(
        out,
        "<figure class=\"chart\" id=\"chart-{id}\" data-kind=\"{kind}\" data-marks=\"{marks}\">{}</figure>",
        chart.svg(size)
    );
}

/// Month (UTC, `YYYY-MM`) of a bar time.
fn month_of(ns: i64) -> String {
    jiff::Timestamp::from_nanosecond(i128::from(ns))
        .map_or_else(|_| "?".into(), |t| t.strftime("%Y-%m").to_string())
}

/// Net PnL per calendar month (of the bars' UTC times) of each policy, from its chained curve.
fn monthly(curves: &[(usize, Vec<Curve>)]) -> (Vec<String>, Vec<(String, Vec<f64>)>) {
    let mut months: Vec<String> = Vec::new();
    let mut table: Vec<(String, Vec<f64>)> = Vec::new();
    for (policy, points) in chained_ns(curves) {
        let mut sums: Vec<f64> = vec![0.0; months.len()];
        let mut prev = 0.0;
        for (t, v) in points {
            let m = month_of(t);
            let at = match months.iter().position(|x| *x == m) {
                Some(at) => at,
                None => {
                    months.push(m);
                    for (_, s) in &mut table {
                        s.push(0.0);
                    }
                    sums.push(0.0);
                    months.len() - 1
                }
            };
            sums[at] += v - prev;
            prev = v;
        }
        table.push((policy, sums));
    }
    (months, table)
}

const STYLE: &str = "body{font-family:'DejaVu Sans',Verdana,sans-serif;margin:24px auto;max-width:1240px;color:#222;background:#fff}
h1{font-size:22px;margin-bottom:4px}h2{font-size:18px;margin-top:36px;border-bottom:1px solid #ddd;padding-bottom:4px}
p.meta{color:#555;margin-top:0}table{border-collapse:collapse;margin:12px 0;font-size:13px}
th,td{border:1px solid #ddd;padding:4px 8px}th{background:#f4f4f4;text-align:left}
td.num{text-align:right;font-variant-numeric:tabular-nums}.pos{color:#1a7f37}.neg{color:#c62828}
figure.chart{margin:12px 0}figure.chart svg{max-width:100%;height:auto}.grid{display:flex;flex-wrap:wrap;gap:8px}
.failed{color:#c62828}pre{background:#f7f7f7;border:1px solid #ddd;padding:12px;font-size:12px;overflow:auto;max-height:480px}";

/// The whole report.html.
pub fn render(i: &Inputs<'_>) -> String {
    let r = i.report;
    let mut h = String::new();
    let ok = r
        .windows
        .iter()
        .filter(|w| w.status == WindowStatus::Ok)
        .count();
    let instrument = i.config["source"]["loader"]["symbol"]
        .as_str()
        .unwrap_or("");
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>foxhunt report: {name}</title><style>{STYLE}</style></head><body>\n\
         <h1>foxhunt walk-forward report: {name}</h1>\n\
         <p class=\"meta\">{instrument} · device {device} · {ok} windows trained, {failed} failed, \
         {skipped} skipped, {empty} empty · every PnL is net of costs and slippage, in USD</p>\n",
        name = esc(i.name),
        instrument = esc(instrument),
        device = esc(&r.device),
        failed = r.windows.len() - ok,
        skipped = r.skipped.len(),
        empty = r.empty_windows,
    );

    h.push_str("<section id=\"summary\"><h2>Out of sample, all test periods</h2>\n");
    if r.aggregate.is_empty() {
        h.push_str(
            "<p class=\"failed\">No window finished: there is no out-of-sample result.</p>\n",
        );
    } else {
        h.push_str(
            "<table id=\"aggregate\"><tr><th>policy</th><th>net PnL</th><th>return on capital</th>\
             <th>Sharpe</th><th>Sortino</th><th>max drawdown</th><th>Calmar</th><th>hit rate</th>\
             <th>trades</th><th>contracts</th><th>costs</th><th>days</th></tr>\n",
        );
        for p in &r.aggregate {
            let m = &p.metrics;
            let _ = writeln!(
                h,
                "<tr><td>{}</td>{}<td class=\"num\">{:.2}%</td><td class=\"num\">{}</td>\
                 <td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>\
                 <td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>\
                 <td class=\"num\">{}</td><td class=\"num\">{}</td></tr>",
                esc(&p.policy),
                pnl_cell(m.total_pnl),
                m.return_on_capital * 100.0,
                opt(m.sharpe, 2),
                opt(m.sortino, 2),
                money(m.max_drawdown),
                opt(m.calmar, 2),
                opt(m.hit_rate.map(|v| v * 100.0), 1),
                m.trades,
                m.contracts_traded,
                money(m.total_costs),
                m.days
            );
        }
        h.push_str("</table>\n");
    }
    h.push_str("</section>\n");

    if !i.curves.is_empty() {
        h.push_str("<section id=\"curves\"><h2>Equity and drawdown</h2>\n");
        figure(
            &mut h,
            "equity",
            &Chart::Lines(equity_chart(i.curves)),
            EQUITY_SIZE,
        );
        figure(
            &mut h,
            "drawdown",
            &Chart::Lines(drawdown_chart(i.curves)),
            (1200, 280),
        );
        h.push_str("</section>\n<section id=\"days\"><h2>Daily and monthly PnL</h2>\n");
        figure(
            &mut h,
            "daily-pnl",
            &Chart::Histogram(daily_chart(i.curves)),
            (800, 320),
        );
        let (months, table) = monthly(i.curves);
        h.push_str(
            "<table id=\"monthly-pnl\"><caption>Net PnL per calendar month of the bars' UTC \
             times (test periods only)</caption><tr><th>month</th>",
        );
        for (p, _) in &table {
            let _ = write!(h, "<th>{}</th>", esc(p));
        }
        h.push_str("</tr>\n");
        for (m, month) in months.iter().enumerate() {
            let _ = write!(h, "<tr><td>{month}</td>");
            for (_, sums) in &table {
                h.push_str(&pnl_cell(sums[m]));
            }
            h.push_str("</tr>\n");
        }
        h.push_str("</table>\n</section>\n");
    }

    h.push_str(
        "<section id=\"windows\"><h2>Windows</h2>\n<table id=\"window-table\"><tr>\
        <th>window</th><th>train</th><th>validation</th><th>test</th><th>best epoch</th>\
        <th>validation PnL</th>",
    );
    let baselines: Vec<&str> = r
        .windows
        .iter()
        .find(|w| !w.test_results.is_empty())
        .map(|w| w.test_results.iter().map(|p| p.policy.as_str()).collect())
        .unwrap_or_default();
    for b in &baselines {
        let _ = write!(h, "<th>test: {}</th>", esc(b));
    }
    h.push_str("</tr>\n");
    let span = |s: &foxhunt_data::walkforward::Split| format!("{} – {}", s.start, s.end);
    for w in &r.windows {
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td>",
            w.index,
            span(&w.train),
            span(&w.val),
            span(&w.test)
        );
        match &w.status {
            WindowStatus::Ok => {
                let _ = write!(
                    h,
                    "<td class=\"num\">{}</td>{}",
                    w.best_epoch.map_or("–".into(), |e| e.to_string()),
                    w.validation
                        .as_ref()
                        .map_or("<td>–</td>".into(), |m| pnl_cell(m.total_pnl))
                );
                for b in &baselines {
                    match w.test_results.iter().find(|p| p.policy == *b) {
                        Some(p) => h.push_str(&pnl_cell(p.metrics.total_pnl)),
                        None => h.push_str("<td>–</td>"),
                    }
                }
            }
            WindowStatus::Failed { error } => {
                let _ = write!(
                    h,
                    "<td class=\"failed\" colspan=\"{}\">failed: {}</td>",
                    2 + baselines.len(),
                    esc(error)
                );
            }
        }
        h.push_str("</tr>\n");
    }
    h.push_str("</table>\n");
    if !r.skipped.is_empty() {
        h.push_str("<table id=\"skipped\"><tr><th>skipped window</th><th>why</th></tr>\n");
        for s in &r.skipped {
            let _ = writeln!(
                h,
                "<tr><td>{}</td><td>{}</td></tr>",
                s.index,
                esc(&s.reason)
            );
        }
        h.push_str("</table>\n");
    }
    h.push_str("</section>\n");
    population_section(&mut h, r);

    h.push_str("<section id=\"training\"><h2>Training curves (per epoch, one line per window)</h2><div class=\"grid\">\n");
    let training: [(&str, &str, &str, EpochStat); 5] = [
        (
            "train-loss",
            "Loss (mean over the epoch's updates)",
            "loss",
            |e| e.loss.map(f64::from),
        ),
        ("train-mean-q", "Mean Q of the chosen actions", "Q", |e| {
            e.mean_q.map(f64::from)
        }),
        ("train-td-abs", "Mean |TD error|", "|TD|", |e| {
            e.td_abs_mean.map(f64::from)
        }),
        (
            "train-grad-norm",
            "Gradient norm (before clipping)",
            "norm",
            |e| e.grad_norm.map(f64::from),
        ),
        (
            "train-val-pnl",
            "Validation net PnL of the greedy policy",
            "USD",
            |e| Some(e.val_pnl),
        ),
    ];
    for (id, title, y, f) in training {
        figure(
            &mut h,
            id,
            &Chart::Lines(training_chart(r, title, y, f)),
            (600, 300),
        );
    }
    h.push_str("</div></section>\n");

    h.push_str("<section id=\"phase-breakdown\"><h2>Phase breakdown</h2>\n");
    figure(
        &mut h,
        "phases",
        &Chart::Bars(phases_chart(&r.phases)),
        (1200, 340),
    );
    if let Some(m) = PhaseTimes::means(&r.phases) {
        h.push_str(
            "<table id=\"phase-means\"><tr><th>mean ms per epoch</th><th>init</th><th>collect</th>\
             <th>train</th><th>sync</th><th>eval</th><th>total</th></tr>",
        );
        let _ = write!(h, "<tr><td>{} epochs</td>", r.phases.len());
        for v in m {
            let _ = write!(h, "<td class=\"num\">{v:.3}</td>");
        }
        h.push_str("</tr></table>\n");
    }
    h.push_str("</section>\n");

    if !i.shards.is_empty() {
        h.push_str(
            "<section id=\"shards\"><h2>Shards</h2>\n<table id=\"shard-table\"><tr><th>shard</th>\
             <th>windows it owns</th><th>finished</th></tr>\n",
        );
        for s in i.shards {
            let owned: Vec<&crate::report::WindowReport> =
                r.windows.iter().filter(|w| s.owns(w.index)).collect();
            let list: Vec<String> = owned.iter().map(|w| w.index.to_string()).collect();
            let _ = writeln!(
                h,
                "<tr><td>{} of {}</td><td>{}</td><td class=\"num\">{}</td></tr>",
                s.index,
                s.count,
                list.join(", "),
                owned.len()
            );
        }
        h.push_str("</table>\n</section>\n");
    }

    let config = serde_json::to_string_pretty(i.config).unwrap_or_default();
    let _ = write!(
        h,
        "<section id=\"config\"><h2>Configuration (config.json)</h2><pre>{}</pre></section>\n\
         </body></html>\n",
        esc(&config)
    );
    h
}

/// The report's file name in the run directory.
pub const FILE: &str = "report.html";

/// Renders and writes `out`/report.html (atomically) for `report` and its curves, with the
/// run's config.json and its shards' markers.
pub fn write(
    out: &std::path::Path,
    report: &RunReport,
    curves: &[(usize, Vec<Curve>)],
) -> Result<(), crate::TrainError> {
    let config: serde_json::Value = crate::report::read_json(&out.join("config.json"))?;
    let shards = crate::rundir::shards_started(out);
    let name = out
        .canonicalize()
        .unwrap_or_else(|_| out.to_path_buf())
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let html = render(&Inputs {
        name: &name,
        report,
        curves,
        config: &config,
        shards: &shards,
    });
    Ok(foxhunt_fs::write_atomic(&out.join(FILE), html.as_bytes())?)
}

/// The attribute text of every `<name ...>` tag in `doc`.
fn tags<'a>(doc: &'a str, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
    let open = format!("<{name}");
    let mut rest = doc;
    std::iter::from_fn(move || {
        loop {
            let at = rest.find(&open)?;
            let after = &rest[at + open.len()..];
            let end = after.find('>')?;
            rest = &after[end..];
            // `<polyline` must not match `<polylines`: the name ends at a space, `/` or `>`.
            if after
                .chars()
                .next()
                .is_some_and(|c| c.is_whitespace() || c == '/' || c == '>')
            {
                return Some(&after[..end]);
            }
        }
    })
}

/// An attribute's value in a tag's text.
fn attr<'a>(tag: &'a str, key: &str) -> Option<&'a str> {
    let pat = format!(" {key}=\"");
    let at = tag.find(&pat)? + pat.len();
    let len = tag[at..].find('"')?;
    Some(&tag[at..at + len])
}

/// How many data marks of the kind `m` an SVG (as plotters writes it, or as a browser
/// serializes it) holds: polylines of at least three points, circles, or filled rectangles
/// other than white backgrounds.
pub fn marks_in(svg: &str, m: Marks) -> usize {
    match m {
        Marks::Lines(_) => tags(svg, "polyline")
            .filter(|t| attr(t, "points").is_some_and(|p| p.split_whitespace().count() >= 3))
            .count(),
        Marks::Dots(_) => tags(svg, "circle").count(),
        Marks::Bars(_) => tags(svg, "rect")
            .filter(|t| {
                attr(t, "fill").is_some_and(|f| {
                    !f.eq_ignore_ascii_case("none") && !f.eq_ignore_ascii_case("#ffffff")
                })
            })
            .count(),
    }
}

/// Checks that `html` (a written report.html, or the DOM a browser made of it) holds each
/// chart in `charts` as an SVG figure with at least the data marks the figure declares (and
/// at least one). Returns each chart's marks found, or every problem.
pub fn check(html: &str, charts: &[&str]) -> Result<Vec<(String, usize)>, Vec<String>> {
    let mut found = Vec::new();
    let mut problems = Vec::new();
    for id in charts {
        let want_id = format!("chart-{id}");
        let Some((start, tag)) = html
            .match_indices("<figure")
            .map(|(at, _)| (at, &html[at..]))
            .find(|(_, rest)| {
                let end = rest.find('>').unwrap_or(rest.len());
                attr(&rest[..end], "id") == Some(want_id.as_str())
            })
        else {
            problems.push(format!("no figure {want_id}"));
            continue;
        };
        let body = &html[start..start + tag.find("</figure>").unwrap_or(tag.len())];
        let head = &body[..body.find('>').unwrap_or(body.len())];
        let declared: usize = attr(head, "data-marks")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let marks = match attr(head, "data-kind") {
            Some("lines") => Marks::Lines(declared),
            Some("dots") => Marks::Dots(declared),
            Some("bars") => Marks::Bars(declared),
            other => {
                problems.push(format!("{want_id}: unknown data-kind {other:?}"));
                continue;
            }
        };
        if !body.contains("<svg") {
            problems.push(format!("{want_id}: no SVG"));
            continue;
        }
        let n = marks_in(body, marks);
        if declared == 0 {
            problems.push(format!("{want_id}: the chart has no data"));
        } else if n < declared {
            problems.push(format!(
                "{want_id}: {n} data marks drawn of the {declared} it holds"
            ));
        } else {
            found.push(((*id).to_string(), n));
        }
    }
    if problems.is_empty() {
        Ok(found)
    } else {
        Err(problems)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn money_groups_thousands_and_keeps_the_sign() {
        assert_eq!(money(0.0), "0.00");
        assert_eq!(money(-0.001), "0.00");
        assert_eq!(money(999.5), "999.50");
        assert_eq!(money(1234.5), "1,234.50");
        assert_eq!(money(-1_234_567.891), "-1,234,567.89");
        assert_eq!(money(100_000.0), "100,000.00");
        assert_eq!(crate::charts::grouped(-400_000.0, 0), "-400,000");
        assert_eq!(crate::charts::grouped(12.0, 0), "12");
    }

    #[test]
    fn escaping_leaves_no_markup() {
        assert_eq!(
            esc("<a href=\"x\">&'</a>"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;&lt;/a&gt;"
        );
    }

    #[test]
    fn the_check_finds_missing_and_empty_charts() {
        let line = |n: usize| {
            let pts: Vec<String> = (0..n).map(|i| format!("{i},{i}")).collect();
            format!(
                "<polyline fill=\"none\" points=\"{}\"></polyline>",
                pts.join(" ")
            )
        };
        let html = format!(
            "<figure class=\"chart\" id=\"chart-a\" data-kind=\"lines\" data-marks=\"2\"><svg>{}{}</svg></figure>\
             <figure class=\"chart\" id=\"chart-b\" data-kind=\"lines\" data-marks=\"2\"><svg>{}{}</svg></figure>\
             <figure class=\"chart\" id=\"chart-c\" data-kind=\"bars\" data-marks=\"0\"><svg><rect fill=\"#FFFFFF\"/></svg></figure>\
             <figure class=\"chart\" id=\"chart-d\" data-kind=\"bars\" data-marks=\"1\"><svg><rect x=\"1\" fill=\"#D62728\"/></svg></figure>",
            line(5),
            line(40),
            line(5),
            line(2)
        );
        assert_eq!(
            check(&html, &["a", "d"]),
            Ok(vec![("a".into(), 2), ("d".into(), 1)])
        );
        let e = check(&html, &["a", "b", "c", "e"]).expect_err("problems");
        assert_eq!(
            e,
            vec![
                "chart-b: 1 data marks drawn of the 2 it holds".to_string(),
                "chart-c: the chart has no data".into(),
                "no figure chart-e".into(),
            ]
        );
    }
}
