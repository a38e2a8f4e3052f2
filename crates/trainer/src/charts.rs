//! The report's charts, drawn with plotters: one drawing routine per kind of chart, run on the
//! SVG backend for report.html and on the bitmap backend for equity.png, so both show the same
//! picture. Text is set in DejaVu Sans, shipped in `assets/` with its license, so a PNG needs
//! no fonts on the machine.

use std::error::Error;
use std::path::Path;

use plotters::coord::Shift;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

use crate::TrainError;

/// Font family every text of a chart asks for (registered from the shipped font).
const FAMILY: &str = "sans-serif";

/// DejaVu Sans (assets/DEJAVU-LICENSE.txt).
static FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");

/// Registers the shipped font once per process: plotters measures and draws text through it.
fn fonts() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        plotters::style::register_font(FAMILY, FontStyle::Normal, FONT)
            .unwrap_or_else(|_| panic!("the shipped font assets/DejaVuSans.ttf is a valid font"));
    });
}

type Drawn = Result<(), Box<dyn Error>>;

/// Colours in series order: the agent, then the baselines, then (for more series) plotters'
/// 99-colour palette.
pub fn color(i: usize) -> RGBColor {
    const FIXED: [RGBColor; 6] = [
        RGBColor(214, 39, 40),
        RGBColor(120, 120, 120),
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(148, 103, 189),
    ];
    FIXED.get(i).copied().unwrap_or_else(|| {
        let c = Palette99::pick(i).to_rgba();
        RGBColor(c.0, c.1, c.2)
    })
}

/// What the x axis holds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum XAxis {
    /// Days since 1970-01-01 UTC (fractional), labelled as dates.
    Date,
    /// Plain numbers (epochs), labelled as integers.
    Count,
}

/// One named series of (x, y) points, in x order.
#[derive(Debug, Clone)]
pub struct Line {
    /// Legend entry.
    pub name: String,
    /// The points.
    pub points: Vec<(f64, f64)>,
}

/// A chart of lines (or of areas down to zero), with optional vertical markers.
#[derive(Debug, Clone)]
pub struct LineChart {
    /// Caption.
    pub title: String,
    /// What x is.
    pub x: XAxis,
    /// Axis descriptions.
    pub x_desc: String,
    /// Axis descriptions.
    pub y_desc: String,
    /// The series, drawn in order (the first on the bottom), coloured by [`color`].
    pub lines: Vec<Line>,
    /// Vertical dashed lines at x, each with a short label at the top (window boundaries).
    pub markers: Vec<(f64, String)>,
    /// Fill each series down to zero (drawdowns).
    pub area: bool,
    /// Mark every point with a dot (series of few points: epochs).
    pub dots: bool,
}

/// Stacked bars: one bar per label, one layer per named series.
#[derive(Debug, Clone)]
pub struct StackedBars {
    /// Caption.
    pub title: String,
    /// Axis descriptions.
    pub x_desc: String,
    /// Axis descriptions.
    pub y_desc: String,
    /// Layers from the bottom: name and one value per bar.
    pub layers: Vec<(String, Vec<f64>)>,
    /// Vertical markers between bars, at a bar index (window starts).
    pub markers: Vec<(f64, String)>,
}

/// A histogram of values.
#[derive(Debug, Clone)]
pub struct Histogram {
    /// Caption.
    pub title: String,
    /// Axis description of the values.
    pub x_desc: String,
    /// The values.
    pub values: Vec<f64>,
    /// Number of equal-width bins.
    pub bins: usize,
}

/// How many data marks a drawn chart holds, for a reader that checks the picture has data
/// (`crate::html::check`): series of at least three points, or filled bars.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Marks {
    /// Polylines of at least three points.
    Lines(usize),
    /// Dots (circles), one per point.
    Dots(usize),
    /// Filled rectangles.
    Bars(usize),
}

impl LineChart {
    /// The series with at least three points (the ones a reader can find in the picture).
    pub fn marks(&self) -> Marks {
        if self.dots {
            Marks::Dots(self.lines.iter().map(|l| l.points.len()).sum())
        } else {
            Marks::Lines(self.lines.iter().filter(|l| l.points.len() >= 3).count())
        }
    }
}

impl StackedBars {
    /// One rectangle per layer and bar.
    pub fn marks(&self) -> Marks {
        Marks::Bars(self.layers.iter().map(|(_, v)| v.len()).sum())
    }
}

impl Histogram {
    /// The bins' counts and their edges: `bins` equal bins over the values' range.
    pub fn counts(&self) -> (f64, f64, Vec<usize>) {
        let lo = self.values.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = self
            .values
            .iter()
            .copied()
            .fold(f64::NEG_INFINITY, f64::max);
        let (lo, hi) = if lo.is_finite() && hi > lo {
            (lo, hi)
        } else if lo.is_finite() {
            (lo - 1.0, lo + 1.0)
        } else {
            (-1.0, 1.0)
        };
        let bins = self.bins.max(1);
        let mut counts = vec![0; bins];
        let width = (hi - lo) / bins as f64;
        for &v in &self.values {
            let b = (((v - lo) / width) as usize).min(bins - 1);
            counts[b] += 1;
        }
        (lo, hi, counts)
    }

    /// One rectangle per non-empty bin.
    pub fn marks(&self) -> Marks {
        Marks::Bars(self.counts().2.iter().filter(|&&c| c > 0).count())
    }
}

/// At most about `buckets` x-buckets of a series, keeping each bucket's first, lowest, highest
/// and last point in x order, so a curve of many bars keeps its extremes at screen size.
pub fn decimate(points: &[(f64, f64)], buckets: usize) -> Vec<(f64, f64)> {
    if points.len() <= buckets.saturating_mul(4) || buckets == 0 {
        return points.to_vec();
    }
    let per = points.len().div_ceil(buckets);
    let mut out = Vec::with_capacity(buckets * 4);
    for chunk in points.chunks(per) {
        let (mut lo, mut hi) = (0, 0);
        for (i, p) in chunk.iter().enumerate() {
            if p.1 < chunk[lo].1 {
                lo = i;
            }
            if p.1 > chunk[hi].1 {
                hi = i;
            }
        }
        let mut keep = [0, lo, hi, chunk.len() - 1];
        keep.sort_unstable();
        let mut last = usize::MAX;
        for k in keep {
            if k != last {
                out.push(chunk[k]);
                last = k;
            }
        }
    }
    out
}

/// A date label for days since the Unix epoch.
fn day_label(days: f64) -> String {
    let secs = (days * 86_400.0).round() as i64;
    jiff::Timestamp::from_second(secs).map_or_else(
        |_| format!("{days:.0}"),
        |t| t.strftime("%Y-%m-%d").to_string(),
    )
}

/// `v` with `decimals` decimals and thousands separators: `-12,345.60`; never `-0.00`.
pub fn grouped(v: f64, decimals: usize) -> String {
    if !v.is_finite() {
        return v.to_string();
    }
    let s = format!("{:.decimals$}", v.abs());
    let (int, frac) = s
        .split_once('.')
        .map_or((s.as_str(), None), |(i, f)| (i, Some(f)));
    let mut out = String::new();
    if v < 0.0 && s.bytes().any(|b| b.is_ascii_digit() && b != b'0') {
        out.push('-');
    }
    for (i, c) in int.chars().enumerate() {
        if i > 0 && (int.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if let Some(f) = frac {
        out.push('.');
        out.push_str(f);
    }
    out
}

/// A label for a whole-number axis (epochs, counts): ticks between whole numbers stay blank.
fn whole_label(v: f64) -> String {
    if (v - v.round()).abs() < 1e-9 {
        format!("{v:.0}")
    } else {
        String::new()
    }
}

/// A y label: no decimals for large values, a few for small ones; a tick that is zero up to
/// rounding reads 0.
fn num_label(v: f64) -> String {
    let a = v.abs();
    if a < 1e-12 {
        "0".into()
    } else if a >= 1000.0 {
        grouped(v, 0)
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 0.01 {
        format!("{v:.3}")
    } else {
        format!("{v:.1e}")
    }
}

/// A range padded by 5% (and widened when empty or a point), so no line sits on the frame.
fn padded(lo: f64, hi: f64) -> (f64, f64) {
    if !lo.is_finite() || !hi.is_finite() {
        return (-1.0, 1.0);
    }
    if hi <= lo {
        let d = lo.abs().max(1.0) * 0.05;
        return (lo - d, hi + d);
    }
    let d = (hi - lo) * 0.05;
    (lo - d, hi + d)
}

fn bounds(points: impl Iterator<Item = (f64, f64)>) -> ((f64, f64), (f64, f64)) {
    let (mut x0, mut x1, mut y0, mut y1) = (
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::INFINITY,
        f64::NEG_INFINITY,
    );
    for (x, y) in points.filter(|p| p.0.is_finite() && p.1.is_finite()) {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    ((x0, x1), (y0, y1))
}

/// A chart's frame: caption, margins and label areas (`y_labels` pixels for the y labels).
fn frame<'a, 'b, DB: DrawingBackend>(
    root: &'a DrawingArea<DB, Shift>,
    title: &'b str,
    y_labels: u32,
) -> ChartBuilder<'a, 'b, DB> {
    let mut b = ChartBuilder::on(root);
    b.caption(title, (FAMILY, 17))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(y_labels);
    b
}

/// Every chart's mesh: fonts, a light grid, the axis descriptions.
fn house_style<X: Ranged, Y: Ranged, DB: DrawingBackend>(
    mesh: &mut plotters::chart::MeshStyle<'_, '_, X, Y, DB>,
    x_desc: &str,
    y_desc: &str,
) {
    mesh.x_desc(x_desc)
        .y_desc(y_desc)
        .label_style((FAMILY, 12))
        .axis_desc_style((FAMILY, 13))
        .light_line_style(RGBColor(244, 244, 244))
        .max_light_lines(2)
        .bold_line_style(RGBColor(215, 215, 215));
}

type Plane = Cartesian2d<RangedCoordf64, RangedCoordf64>;

/// Dashed vertical lines at each marker's x from `y.0` to `y.1`, labelled at the top.
fn markers<DB: DrawingBackend>(
    chart: &mut ChartContext<'_, DB, Plane>,
    marks: &[(f64, String)],
    (y0, y1): (f64, f64),
) -> Drawn
where
    DB::ErrorType: 'static,
{
    for (x, label) in marks {
        chart.draw_series(DashedLineSeries::new(
            [(*x, y0), (*x, y1)],
            4,
            4,
            RGBColor(150, 150, 150).into(),
        ))?;
        chart.draw_series(std::iter::once(Text::new(
            label.clone(),
            (*x, y1),
            (FAMILY, 11).into_font().color(&RGBColor(110, 110, 110)),
        )))?;
    }
    Ok(())
}

/// The series' legend in a corner.
fn legend<'a, DB: DrawingBackend + 'a>(
    chart: &mut ChartContext<'a, DB, Plane>,
    at: SeriesLabelPosition,
) -> Drawn
where
    DB::ErrorType: 'static,
{
    chart
        .configure_series_labels()
        .position(at)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .label_font((FAMILY, 12))
        .draw()?;
    Ok(())
}

fn draw_lines<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, c: &LineChart) -> Drawn
where
    DB::ErrorType: 'static,
{
    fonts();
    root.fill(&WHITE)?;
    let ((x0, x1), (y0, y1)) = bounds(c.lines.iter().flat_map(|l| l.points.iter().copied()));
    // Areas and equity curves are read against zero: keep it in view.
    let (y0, y1) = if c.area {
        (y0.min(0.0), y1.max(0.0))
    } else {
        (y0, y1)
    };
    let (x0, x1) = padded(x0, x1);
    let (y0, y1) = padded(y0, y1);
    let mut chart = frame(root, &c.title, 72).build_cartesian_2d(x0..x1, y0..y1)?;
    let date = |x: &f64| day_label(*x);
    let count = |x: &f64| whole_label(*x);
    let y_label = |y: &f64| num_label(*y);
    let mut mesh = chart.configure_mesh();
    house_style(&mut mesh, &c.x_desc, &c.y_desc);
    mesh.y_label_formatter(&y_label).x_labels(8);
    match c.x {
        XAxis::Date => mesh.x_label_formatter(&date),
        XAxis::Count => mesh.x_label_formatter(&count),
    };
    mesh.draw()?;
    if y0 < 0.0 && y1 > 0.0 {
        chart.draw_series(std::iter::once(PathElement::new(
            vec![(x0, 0.0), (x1, 0.0)],
            BLACK.mix(0.45),
        )))?;
    }
    markers(&mut chart, &c.markers, (y0, y1))?;
    for (i, l) in c.lines.iter().enumerate() {
        let col = color(i);
        let drawn = if c.area {
            chart.draw_series(
                AreaSeries::new(l.points.iter().copied(), 0.0, col.mix(0.25))
                    .border_style(col.stroke_width(1)),
            )?
        } else {
            chart.draw_series(LineSeries::new(
                l.points.iter().copied(),
                col.stroke_width(if i == 0 { 2 } else { 1 }),
            ))?
        };
        drawn
            .label(l.name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], col.stroke_width(2)));
        if c.dots {
            chart.draw_series(l.points.iter().map(|&p| Circle::new(p, 3, col.filled())))?;
        }
    }
    if !c.lines.is_empty() {
        legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
    }
    root.present()?;
    Ok(())
}

fn draw_bars<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, c: &StackedBars) -> Drawn
where
    DB::ErrorType: 'static,
{
    fonts();
    root.fill(&WHITE)?;
    let n = c.layers.first().map_or(0, |(_, v)| v.len());
    let top = (0..n)
        .map(|i| c.layers.iter().map(|(_, v)| v[i].max(0.0)).sum::<f64>())
        .fold(0.0, f64::max);
    let top = if top > 0.0 { top * 1.05 } else { 1.0 };
    let mut chart =
        frame(root, &c.title, 72).build_cartesian_2d(-0.5..(n as f64 - 0.5).max(0.5), 0.0..top)?;
    let count = |x: &f64| whole_label(*x);
    let y_label = |y: &f64| num_label(*y);
    let mut mesh = chart.configure_mesh();
    house_style(&mut mesh, &c.x_desc, &c.y_desc);
    mesh.x_label_formatter(&count)
        .y_label_formatter(&y_label)
        .draw()?;
    let mut base = vec![0.0; n];
    for (k, (name, values)) in c.layers.iter().enumerate() {
        let col = color(k + 1);
        let rects: Vec<_> = values
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                let (lo, hi) = (base[i], base[i] + v.max(0.0));
                base[i] = hi;
                Rectangle::new([(i as f64 - 0.4, lo), (i as f64 + 0.4, hi)], col.filled())
            })
            .collect();
        chart
            .draw_series(rects)?
            .label(name.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], col.filled()));
    }
    markers(&mut chart, &c.markers, (0.0, top))?;
    legend(&mut chart, SeriesLabelPosition::UpperRight)?;
    root.present()?;
    Ok(())
}

fn draw_histogram<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, c: &Histogram) -> Drawn
where
    DB::ErrorType: 'static,
{
    fonts();
    root.fill(&WHITE)?;
    let (lo, hi, counts) = c.counts();
    let width = (hi - lo) / counts.len() as f64;
    let top = counts.iter().copied().max().unwrap_or(0).max(1) as f64 * 1.1;
    let mut chart = frame(root, &c.title, 56).build_cartesian_2d(lo..hi, 0.0..top)?;
    let x_label = |x: &f64| num_label(*x);
    let y_label = |y: &f64| whole_label(*y);
    let mut mesh = chart.configure_mesh();
    house_style(&mut mesh, &c.x_desc, "days");
    mesh.x_label_formatter(&x_label)
        .y_label_formatter(&y_label)
        .x_labels(7)
        .draw()?;
    let col = color(0);
    chart.draw_series(
        counts
            .iter()
            .enumerate()
            .filter(|(_, n)| **n > 0)
            .map(|(b, &n)| {
                let x = lo + b as f64 * width;
                Rectangle::new(
                    [(x, 0.0), (x + width * 0.92, n as f64)],
                    col.mix(0.8).filled(),
                )
            }),
    )?;
    if lo < 0.0 && hi > 0.0 {
        chart.draw_series(std::iter::once(PathElement::new(
            vec![(0.0, 0.0), (0.0, top)],
            BLACK.mix(0.45),
        )))?;
    }
    root.present()?;
    Ok(())
}

/// A chart of any kind, to draw on either backend.
#[derive(Debug, Clone)]
pub enum Chart {
    /// Lines or areas.
    Lines(LineChart),
    /// Stacked bars.
    Bars(StackedBars),
    /// A histogram.
    Histogram(Histogram),
}

impl Chart {
    /// What a reader should find in the picture.
    pub fn marks(&self) -> Marks {
        match self {
            Chart::Lines(c) => c.marks(),
            Chart::Bars(c) => c.marks(),
            Chart::Histogram(c) => c.marks(),
        }
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Drawn
    where
        DB::ErrorType: 'static,
    {
        match self {
            Chart::Lines(c) => draw_lines(root, c),
            Chart::Bars(c) => draw_bars(root, c),
            Chart::Histogram(c) => draw_histogram(root, c),
        }
    }

    /// The chart as an SVG document of `size` pixels.
    pub fn svg(&self, size: (u32, u32)) -> String {
        let mut out = String::new();
        {
            let root = SVGBackend::with_string(&mut out, size).into_drawing_area();
            // Drawing into a string fails only on a bug in the drawing code (a range or a
            // style plotters refuses), never on input: the ranges are made finite above.
            self.draw(&root)
                .unwrap_or_else(|e| panic!("drawing an SVG chart: {e}"));
        }
        out
    }

    /// The chart as a PNG file of `size` pixels, written atomically.
    pub fn png(&self, path: &Path, size: (u32, u32)) -> Result<(), TrainError> {
        let (w, h) = size;
        let mut rgb = vec![0u8; w as usize * h as usize * 3];
        {
            let root = BitMapBackend::with_buffer(&mut rgb, size).into_drawing_area();
            self.draw(&root)
                .map_err(|e| TrainError::file(path, format!("drawing: {e}")))?;
        }
        let mut bytes = Vec::new();
        {
            let err = |e: png::EncodingError| TrainError::file(path, format!("PNG: {e}"));
            let mut enc = png::Encoder::new(&mut bytes, w, h);
            enc.set_color(png::ColorType::Rgb);
            enc.set_depth(png::BitDepth::Eight);
            let mut writer = enc.write_header().map_err(err)?;
            writer.write_image_data(&rgb).map_err(err)?;
        }
        Ok(foxhunt_fs::write_atomic(path, &bytes)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimation_keeps_each_buckets_extremes_and_ends() {
        let pts: Vec<(f64, f64)> = (0..10_000)
            .map(|i| {
                (
                    i as f64,
                    ((i * 7919) % 1000) as f64 - if i == 4321 { 5000.0 } else { 0.0 },
                )
            })
            .collect();
        let d = decimate(&pts, 100);
        assert!(d.len() <= 400, "{}", d.len());
        assert_eq!(d.first(), pts.first());
        assert_eq!(d.last(), pts.last());
        assert!(d.contains(&pts[4321]), "the lowest point is kept");
        assert!(d.windows(2).all(|w| w[0].0 < w[1].0), "x order kept");
        let few = &pts[..50];
        assert_eq!(decimate(few, 100), few.to_vec());
    }

    #[test]
    fn histogram_bins_cover_every_value_once() {
        let h = Histogram {
            title: "t".into(),
            x_desc: "x".into(),
            values: vec![-3.0, -1.0, 0.0, 0.5, 2.0, 2.0, 7.0],
            bins: 5,
        };
        let (lo, hi, counts) = h.counts();
        assert_eq!((lo, hi), (-3.0, 7.0));
        assert_eq!(counts, vec![1, 3, 2, 0, 1]);
        assert_eq!(h.marks(), Marks::Bars(4));
    }

    #[test]
    fn both_backends_draw_every_kind_and_the_svg_holds_the_data() {
        let line = |name: &str, k: f64| Line {
            name: name.into(),
            points: (0..40)
                .map(|i| (19_700.0 + i as f64, k * i as f64))
                .collect(),
        };
        let charts = [
            Chart::Lines(LineChart {
                title: "equity".into(),
                x: XAxis::Date,
                x_desc: "date".into(),
                y_desc: "USD".into(),
                lines: vec![line("agent", 1.0), line("flat", 0.0), line("short", 2.0)],
                markers: vec![(19_710.0, "w1".into())],
                area: false,
                dots: false,
            }),
            Chart::Lines(LineChart {
                title: "drawdown".into(),
                x: XAxis::Count,
                x_desc: "epoch".into(),
                y_desc: "USD".into(),
                lines: vec![line("agent", -1.0)],
                markers: vec![],
                area: true,
                dots: false,
            }),
            Chart::Lines(LineChart {
                title: "loss".into(),
                x: XAxis::Count,
                x_desc: "epoch".into(),
                y_desc: "loss".into(),
                lines: vec![
                    Line {
                        name: "w0".into(),
                        points: vec![(0.0, 1.0), (1.0, 0.5)],
                    },
                    Line {
                        name: "w1".into(),
                        points: vec![(0.0, 2.0)],
                    },
                ],
                markers: vec![],
                area: false,
                dots: true,
            }),
            Chart::Bars(StackedBars {
                title: "phases".into(),
                x_desc: "epoch".into(),
                y_desc: "ms".into(),
                layers: vec![
                    ("a".into(), vec![1.0, 2.0, 3.0]),
                    ("b".into(), vec![0.5; 3]),
                ],
                markers: vec![(0.5, "w1".into())],
            }),
            Chart::Histogram(Histogram {
                title: "daily".into(),
                x_desc: "USD".into(),
                values: vec![-2.0, 1.0, 1.5, 3.0],
                bins: 4,
            }),
        ];
        let dir = std::env::temp_dir().join(format!("foxhunt-charts-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        for (i, c) in charts.iter().enumerate() {
            let svg = c.svg((600, 300));
            assert!(svg.starts_with("<svg"), "{svg:.80}");
            assert!(svg.contains("<text"), "labels drawn");
            let found = crate::html::marks_in(&svg, c.marks());
            let want = match c.marks() {
                Marks::Lines(n) | Marks::Dots(n) | Marks::Bars(n) => n,
            };
            assert!(want > 0 && found >= want, "chart {i}: {found} of {want}");
            let png = dir.join(format!("c{i}.png"));
            c.png(&png, (600, 300)).expect("png");
            assert_eq!(&std::fs::read(&png).expect("read")[1..4], b"PNG");
        }
        // Text is drawn with the shipped font: the caption's pixels change with its words.
        let pixels = |title: &str, name: &str| {
            let Chart::Lines(mut c) = charts[0].clone() else {
                unreachable!()
            };
            c.title = title.into();
            let path = dir.join(name);
            Chart::Lines(c).png(&path, (600, 300)).expect("png");
            let decoder =
                png::Decoder::new(std::io::Cursor::new(std::fs::read(&path).expect("read")));
            let mut reader = decoder.read_info().expect("info");
            let mut buf = vec![0; reader.output_buffer_size().expect("size")];
            reader.next_frame(&mut buf).expect("frame");
            buf
        };
        let (a, b) = (pixels("Out-of-sample equity", "a.png"), pixels("", "b.png"));
        let caption = 600 * 3 * 30;
        let changed = a[..caption]
            .iter()
            .zip(&b[..caption])
            .filter(|(x, y)| x != y)
            .count();
        assert!(changed > 300, "{changed} caption bytes differ");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
