//! A small SVG line-chart writer for the bench reports: panels stacked on a shared x axis, each
//! axis linear or logarithmic (log where the range spans decades). Written here rather than
//! pulling in a plotting crate: the benches need points, lines, ticks and a legend, nothing more.

use std::fmt::Write as _;

const COLOURS: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
];

pub struct Series {
    pub name: String,
    /// (x, y); points a log axis cannot show (≤ 0) are left out.
    pub points: Vec<(f64, f64)>,
}

impl Series {
    pub fn new(name: &str, points: Vec<(f64, f64)>) -> Series {
        Series {
            name: name.into(),
            points,
        }
    }
}

pub struct Panel {
    pub title: String,
    pub log_y: bool,
    pub series: Vec<Series>,
}

impl Panel {
    pub fn new(title: &str, log_y: bool, series: Vec<Series>) -> Panel {
        Panel {
            title: title.into(),
            log_y,
            series,
        }
    }
}

pub struct Chart {
    pub title: String,
    pub x_label: String,
    pub log_x: bool,
    pub panels: Vec<Panel>,
}

/// One axis: maps data to [0, 1] and lists its ticks.
struct Axis {
    log: bool,
    lo: f64,
    hi: f64,
}

impl Axis {
    fn fit(values: impl Iterator<Item = f64>, log: bool) -> Axis {
        let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
        for v in values.filter(|v| v.is_finite() && (!log || *v > 0.0)) {
            lo = lo.min(v);
            hi = hi.max(v);
        }
        if !lo.is_finite() {
            return Axis {
                log,
                lo: if log { 1.0 } else { 0.0 },
                hi: if log { 10.0 } else { 1.0 },
            };
        }
        if log {
            // Whole decades, at least one.
            let (l, h) = (lo.log10().floor(), hi.log10().ceil());
            Axis {
                log,
                lo: 10f64.powf(l),
                hi: 10f64.powf(if h > l { h } else { l + 1.0 }),
            }
        } else {
            // From zero (these are latencies, sizes, counts), with headroom.
            let hi = if hi > 0.0 { nice(hi * 1.05) } else { 1.0 };
            Axis {
                log,
                lo: lo.min(0.0),
                hi,
            }
        }
    }

    fn pos(&self, v: f64) -> f64 {
        if self.log {
            (v.log10() - self.lo.log10()) / (self.hi.log10() - self.lo.log10())
        } else {
            (v - self.lo) / (self.hi - self.lo)
        }
    }

    fn shows(&self, v: f64) -> bool {
        v.is_finite() && (!self.log || v > 0.0)
    }

    fn ticks(&self) -> Vec<f64> {
        if self.log {
            let (l, h) = (
                self.lo.log10().round() as i32,
                self.hi.log10().round() as i32,
            );
            (l..=h).map(|e| 10f64.powi(e)).collect()
        } else {
            (0..=4)
                .map(|k| self.lo + (self.hi - self.lo) * k as f64 / 4.0)
                .collect()
        }
    }
}

/// The smallest 1, 2 or 5 × 10^k at least `v`.
fn nice(v: f64) -> f64 {
    let e = 10f64.powf(v.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * e)
        .find(|c| *c >= v)
        .unwrap_or(10.0 * e)
}

/// 1, 10, 100, 1k, 10k, 1M, 1G; fractions with the digits they need.
pub fn label(v: f64) -> String {
    let a = v.abs();
    let (d, suffix) = match a {
        a if a >= 1e9 => (1e9, "G"),
        a if a >= 1e6 => (1e6, "M"),
        a if a >= 1e3 => (1e3, "k"),
        _ => (1.0, ""),
    };
    let x = v / d;
    let text = if x == x.round() || x.abs() >= 10.0 {
        format!("{x:.0}")
    } else if x.abs() >= 0.1 {
        format!("{x:.1}")
    } else {
        format!("{x}")
    };
    format!("{text}{suffix}")
}

impl Chart {
    pub fn svg(&self) -> String {
        let (w, ph, left, top, gap, right) = (640.0, 190.0, 70.0, 44.0, 62.0, 190.0);
        let height = top + self.panels.len() as f64 * (ph + gap) + 10.0;
        let x = Axis::fit(
            self.panels
                .iter()
                .flat_map(|p| &p.series)
                .flat_map(|s| s.points.iter().map(|p| p.0)),
            self.log_x,
        );
        let mut s = String::new();
        let _ = writeln!(
            s,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{height}\" \
             font-family=\"sans-serif\" font-size=\"11\">",
            left + w + right
        );
        let _ = writeln!(s, "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>");
        let _ = writeln!(
            s,
            "<text x=\"{left}\" y=\"18\" font-size=\"14\">{}</text>",
            escape(&self.title)
        );
        for (i, panel) in self.panels.iter().enumerate() {
            let y0 = top + i as f64 * (ph + gap);
            let y = Axis::fit(
                panel
                    .series
                    .iter()
                    .flat_map(|s| s.points.iter().map(|p| p.1)),
                panel.log_y,
            );
            let _ = writeln!(
                s,
                "<text x=\"{left}\" y=\"{}\">{}{}</text>",
                y0 - 6.0,
                escape(&panel.title),
                if panel.log_y { " (log scale)" } else { "" }
            );
            let _ = writeln!(
                s,
                "<rect x=\"{left}\" y=\"{y0}\" width=\"{w}\" height=\"{ph}\" fill=\"none\" stroke=\"#999\"/>"
            );
            for t in y.ticks() {
                let py = y0 + ph - ph * y.pos(t);
                let _ = writeln!(
                    s,
                    "<line x1=\"{left}\" x2=\"{}\" y1=\"{py:.1}\" y2=\"{py:.1}\" stroke=\"#eee\"/>\
                     <text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
                    left + w,
                    left - 4.0,
                    py + 4.0,
                    label(t)
                );
            }
            for t in x.ticks() {
                let px = left + w * x.pos(t);
                let _ = writeln!(
                    s,
                    "<line x1=\"{px:.1}\" x2=\"{px:.1}\" y1=\"{y0}\" y2=\"{}\" stroke=\"#eee\"/>\
                     <text x=\"{px:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
                    y0 + ph,
                    y0 + ph + 14.0,
                    label(t)
                );
            }
            let _ = writeln!(
                s,
                "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" fill=\"#555\">{}{}</text>",
                left + w / 2.0,
                y0 + ph + 30.0,
                escape(&self.x_label),
                if self.log_x { " (log scale)" } else { "" }
            );
            for (j, series) in panel.series.iter().enumerate() {
                let colour = COLOURS[j % COLOURS.len()];
                let pts: Vec<(f64, f64)> = series
                    .points
                    .iter()
                    .filter(|(a, b)| x.shows(*a) && y.shows(*b))
                    .map(|(a, b)| (left + w * x.pos(*a), y0 + ph - ph * y.pos(*b)))
                    .collect();
                let line: Vec<String> = pts.iter().map(|(a, b)| format!("{a:.1},{b:.1}")).collect();
                let _ = writeln!(
                    s,
                    "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"1.5\" points=\"{}\"/>",
                    line.join(" ")
                );
                for (a, b) in &pts {
                    let _ = writeln!(
                        s,
                        "<circle cx=\"{a:.1}\" cy=\"{b:.1}\" r=\"2.5\" fill=\"{colour}\"/>"
                    );
                }
                let ly = y0 + 12.0 + 15.0 * j as f64;
                let _ = writeln!(
                    s,
                    "<line x1=\"{}\" x2=\"{}\" y1=\"{ly}\" y2=\"{ly}\" stroke=\"{colour}\" stroke-width=\"2\"/>\
                     <text x=\"{}\" y=\"{}\" fill=\"{colour}\">{}</text>",
                    left + w + 10.0,
                    left + w + 28.0,
                    left + w + 32.0,
                    ly + 4.0,
                    escape(&series.name)
                );
            }
        }
        s.push_str("</svg>\n");
        s
    }
}

fn escape(t: &str) -> String {
    t.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
