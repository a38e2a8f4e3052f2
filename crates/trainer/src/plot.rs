//! A PNG line plot of equity curves, drawn here so the report needs no plotting stack or fonts
//! on the machine: axes, a zero line, one coloured line per policy, a legend and min/max labels
//! in a built-in 5x7 pixel font.

use std::path::Path;

use crate::TrainError;

const W: usize = 1200;
const H: usize = 600;
const LEFT: usize = 90;
const RIGHT: usize = 20;
const TOP: usize = 40;
const BOTTOM: usize = 30;

/// Line colours in legend order: agent, then the baselines.
const COLORS: [[u8; 3]; 6] = [
    [214, 39, 40],
    [120, 120, 120],
    [31, 119, 180],
    [255, 127, 14],
    [44, 160, 44],
    [148, 103, 189],
];

/// 5x7 glyphs, one byte per row, the low 5 bits left to right.
fn glyph(c: char) -> [u8; 7] {
    match c.to_ascii_uppercase() {
        '0' => [14, 17, 19, 21, 25, 17, 14],
        '1' => [4, 12, 4, 4, 4, 4, 14],
        '2' => [14, 17, 1, 2, 4, 8, 31],
        '3' => [31, 2, 4, 2, 1, 17, 14],
        '4' => [2, 6, 10, 18, 31, 2, 2],
        '5' => [31, 16, 30, 1, 1, 17, 14],
        '6' => [6, 8, 16, 30, 17, 17, 14],
        '7' => [31, 1, 2, 4, 8, 8, 8],
        '8' => [14, 17, 17, 14, 17, 17, 14],
        '9' => [14, 17, 17, 15, 1, 2, 12],
        'A' => [14, 17, 17, 31, 17, 17, 17],
        'B' => [30, 17, 17, 30, 17, 17, 30],
        'C' => [14, 17, 16, 16, 16, 17, 14],
        'D' => [28, 18, 17, 17, 17, 18, 28],
        'E' => [31, 16, 16, 30, 16, 16, 31],
        'F' => [31, 16, 16, 30, 16, 16, 16],
        'G' => [14, 17, 16, 23, 17, 17, 15],
        'H' => [17, 17, 17, 31, 17, 17, 17],
        'I' => [14, 4, 4, 4, 4, 4, 14],
        'J' => [7, 2, 2, 2, 2, 18, 12],
        'K' => [17, 18, 20, 24, 20, 18, 17],
        'L' => [16, 16, 16, 16, 16, 16, 31],
        'M' => [17, 27, 21, 21, 17, 17, 17],
        'N' => [17, 17, 25, 21, 19, 17, 17],
        'O' => [14, 17, 17, 17, 17, 17, 14],
        'P' => [30, 17, 17, 30, 16, 16, 16],
        'Q' => [14, 17, 17, 17, 21, 18, 13],
        'R' => [30, 17, 17, 30, 20, 18, 17],
        'S' => [15, 16, 16, 14, 1, 1, 30],
        'T' => [31, 4, 4, 4, 4, 4, 4],
        'U' => [17, 17, 17, 17, 17, 17, 14],
        'V' => [17, 17, 17, 17, 17, 10, 4],
        'W' => [17, 17, 17, 21, 21, 21, 10],
        'X' => [17, 17, 10, 4, 10, 17, 17],
        'Y' => [17, 17, 17, 10, 4, 4, 4],
        'Z' => [31, 1, 2, 4, 8, 16, 31],
        '-' => [0, 0, 0, 31, 0, 0, 0],
        '.' => [0, 0, 0, 0, 0, 12, 12],
        ',' => [0, 0, 0, 0, 12, 4, 8],
        ':' => [0, 12, 12, 0, 12, 12, 0],
        '(' => [2, 4, 8, 8, 8, 4, 2],
        ')' => [8, 4, 2, 2, 2, 4, 8],
        _ => [0; 7],
    }
}

struct Canvas {
    px: Vec<u8>,
}

impl Canvas {
    fn set(&mut self, x: i64, y: i64, c: [u8; 3]) {
        if (0..W as i64).contains(&x) && (0..H as i64).contains(&y) {
            let i = (y as usize * W + x as usize) * 3;
            self.px[i..i + 3].copy_from_slice(&c);
        }
    }
    fn line(&mut self, (x0, y0): (f64, f64), (x1, y1): (f64, f64), c: [u8; 3], thick: i64) {
        let n = ((x1 - x0).abs().max((y1 - y0).abs()).ceil() as i64).max(1);
        for k in 0..=n {
            let f = k as f64 / n as f64;
            let (x, y) = (x0 + (x1 - x0) * f, y0 + (y1 - y0) * f);
            for d in 0..thick {
                self.set(x.round() as i64, y.round() as i64 + d, c);
            }
        }
    }
    fn text(&mut self, x: usize, y: usize, s: &str, c: [u8; 3]) {
        for (i, ch) in s.chars().enumerate() {
            for (r, bits) in glyph(ch).iter().enumerate() {
                for col in 0..5 {
                    if bits >> (4 - col) & 1 == 1 {
                        self.set((x + i * 6 + col) as i64, (y + r) as i64, c);
                    }
                }
            }
        }
    }
}

/// Draws `series` (name, values at equally spaced points) into a PNG at `path`.
pub fn equity_png(path: &Path, title: &str, series: &[(&str, Vec<f64>)]) -> Result<(), TrainError> {
    let mut cv = Canvas {
        px: vec![255; W * H * 3],
    };
    let values = series.iter().flat_map(|(_, v)| v.iter().copied());
    let (lo, hi) = values.fold((0.0f64, 0.0f64), |(a, b), v| (a.min(v), b.max(v)));
    let span = if hi > lo { hi - lo } else { 1.0 };
    let (pw, ph) = ((W - LEFT - RIGHT) as f64, (H - TOP - BOTTOM) as f64);
    let y_of = |v: f64| TOP as f64 + ph * (1.0 - (v - lo) / span);
    let black = [0, 0, 0];
    let grey = [200, 200, 200];
    cv.line(
        (LEFT as f64, y_of(0.0)),
        ((W - RIGHT) as f64, y_of(0.0)),
        grey,
        1,
    );
    cv.line(
        (LEFT as f64, TOP as f64),
        (LEFT as f64, (H - BOTTOM) as f64),
        black,
        1,
    );
    cv.line(
        (LEFT as f64, (H - BOTTOM) as f64),
        ((W - RIGHT) as f64, (H - BOTTOM) as f64),
        black,
        1,
    );
    cv.text(LEFT, 12, title, black);
    cv.text(8, TOP, &format!("{hi:.0}"), black);
    cv.text(8, H - BOTTOM - 7, &format!("{lo:.0}"), black);
    cv.text(8, y_of(0.0) as usize - 3, "0", black);
    cv.text(
        LEFT,
        H - BOTTOM + 10,
        "BARS, ALL TEST PERIODS IN ORDER",
        black,
    );
    for (k, (name, v)) in series.iter().enumerate() {
        let c = COLORS[k % COLORS.len()];
        let n = v.len().max(2) - 1;
        let pts: Vec<(f64, f64)> = v
            .iter()
            .enumerate()
            .map(|(i, &e)| (LEFT as f64 + pw * i as f64 / n as f64, y_of(e)))
            .collect();
        for p in pts.windows(2) {
            cv.line(p[0], p[1], c, if k == 0 { 2 } else { 1 });
        }
        let (lx, ly) = (W - RIGHT - 170, TOP + 8 + k * 14);
        cv.line(
            (lx as f64, ly as f64 + 3.0),
            (lx as f64 + 20.0, ly as f64 + 3.0),
            c,
            2,
        );
        cv.text(lx + 26, ly, name, black);
    }
    let mut bytes = Vec::new();
    {
        let mut enc = png::Encoder::new(&mut bytes, W as u32, H as u32);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        let err = |e: png::EncodingError| TrainError::file(path, format!("PNG: {e}"));
        let mut w = enc.write_header().map_err(err)?;
        w.write_image_data(&cv.px).map_err(err)?;
    }
    Ok(foxhunt_fs::write_atomic(path, &bytes)?)
}
