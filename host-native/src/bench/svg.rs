//! The SVG report of `phalanxd bench`: throughput and latency line charts, self-contained.

use std::fmt::Write as _;

use super::series::Second;

/// A round step (1, 2 or 5 times a power of ten) giving about `ticks` intervals over `span`.
fn nice_step(span: f64, ticks: f64) -> f64 {
    let raw = (span / ticks).max(f64::MIN_POSITIVE);
    let magnitude = 10f64.powf(raw.log10().floor());
    let norm = raw / magnitude;
    let factor = if norm <= 1.0 {
        1.0
    } else if norm <= 2.0 {
        2.0
    } else if norm <= 5.0 {
        5.0
    } else {
        10.0
    };
    factor * magnitude
}

/// A tick label with as many decimals as the step needs.
fn tick_label(v: f64, step: f64) -> String {
    let decimals = if step >= 1.0 { 0 } else { (-step.log10()).ceil() as usize };
    format!("{v:.decimals$}")
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// One line of a chart: its legend, colour and points.
struct Line<'a> {
    label: &'a str,
    color: &'a str,
    points: Vec<(f64, f64)>,
}

const SVG_WIDTH: f64 = 900.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 30.0;
const CHART_HEIGHT: f64 = 250.0;

/// A line chart with axes, grid, tick labels and a legend, its plot area's top at `top`.
fn chart(svg: &mut String, top: f64, title: &str, y_label: &str, x_max: f64, lines: &[Line]) {
    let (x0, x1, y0, y1) = (LEFT, SVG_WIDTH - RIGHT, top + CHART_HEIGHT, top);
    let y_max_raw = lines.iter().flat_map(|l| l.points.iter().map(|p| p.1)).fold(0.0, f64::max);
    let y_step = nice_step(if y_max_raw > 0.0 { y_max_raw } else { 1.0 }, 5.0);
    let y_max = (y_max_raw / y_step).ceil().max(1.0) * y_step;
    let x_max = x_max.max(1.0);
    let x_step = nice_step(x_max, 10.0).max(1.0);
    let px = |x: f64| x0 + x / x_max * (x1 - x0);
    let py = |y: f64| y0 - y / y_max * (y0 - y1);
    let _ =
        writeln!(svg, r#"<text x="{x0}" y="{}" font-size="14" font-weight="bold">{}</text>"#, y1 - 10.0, escape(title));
    let mut y = 0.0;
    while y <= y_max + y_step / 2.0 {
        let _ = writeln!(
            svg,
            r##"<line x1="{x0}" y1="{0:.1}" x2="{x1}" y2="{0:.1}" stroke="#ddd"/><text x="{1}" y="{2:.1}" font-size="11" text-anchor="end">{3}</text>"##,
            py(y),
            x0 - 6.0,
            py(y) + 4.0,
            tick_label(y, y_step)
        );
        y += y_step;
    }
    let mut x = 0.0;
    while x <= x_max + x_step / 2.0 {
        let _ = writeln!(
            svg,
            r##"<line x1="{0:.1}" y1="{y0}" x2="{0:.1}" y2="{1}" stroke="#333"/><text x="{0:.1}" y="{2}" font-size="11" text-anchor="middle">{3}</text>"##,
            px(x),
            y0 + 5.0,
            y0 + 18.0,
            tick_label(x, x_step)
        );
        x += x_step;
    }
    let _ = writeln!(
        svg,
        r##"<polyline points="{x0},{y1} {x0},{y0} {x1},{y0}" fill="none" stroke="#333"/>
<text x="{}" y="{}" font-size="11" text-anchor="middle">seconds measured</text>
<text x="18" y="{2}" font-size="11" text-anchor="middle" transform="rotate(-90 18 {2})">{3}</text>"##,
        (x0 + x1) / 2.0,
        y0 + 34.0,
        (y0 + y1) / 2.0,
        escape(y_label)
    );
    for (i, l) in lines.iter().enumerate() {
        let points: Vec<String> = l.points.iter().map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y))).collect();
        let legend_x = x1 - 110.0 * (lines.len() - i) as f64;
        let _ = writeln!(
            svg,
            r#"<polyline points="{}" fill="none" stroke="{1}" stroke-width="1.5"/>
<line x1="{legend_x}" y1="{2}" x2="{3}" y2="{2}" stroke="{1}" stroke-width="2"/><text x="{4}" y="{5}" font-size="11">{6}</text>"#,
            points.join(" "),
            l.color,
            y1 - 14.0,
            legend_x + 20.0,
            legend_x + 25.0,
            y1 - 10.0,
            escape(l.label)
        );
    }
}

/// Throughput (of `unit`s) and latency (p50, p99) over the measured seconds: two stacked
/// line charts under a title and lines of notes, in one self-contained SVG.
pub(super) fn svg(series: &[Second], title: &str, notes: &[&str], unit: &str) -> String {
    let top = 66.0 + 14.0 * notes.len() as f64;
    let height = top + CHART_HEIGHT + 80.0 + CHART_HEIGHT + 50.0;
    let mut s = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{SVG_WIDTH}" height="{height}" viewBox="0 0 {SVG_WIDTH} {height}" font-family="sans-serif">
<rect width="100%" height="100%" fill="white"/>
<text x="{}" y="22" font-size="16" font-weight="bold" text-anchor="middle">{}</text>
"#,
        SVG_WIDTH / 2.0,
        escape(title)
    );
    for (i, note) in notes.iter().enumerate() {
        let _ = writeln!(
            s,
            r##"<text x="{}" y="{}" font-size="11" text-anchor="middle" fill="#555">{}</text>"##,
            SVG_WIDTH / 2.0,
            40.0 + 14.0 * i as f64,
            escape(note)
        );
    }
    let x_max = series.last().map_or(1, |r| r.second) as f64;
    let throughput = series.iter().map(|r| (r.second as f64, r.ops as f64)).collect();
    chart(
        &mut s,
        top,
        "Throughput",
        &format!("{unit} per second"),
        x_max,
        &[Line { label: "per second", color: "#1f77b4", points: throughput }],
    );
    // Seconds without completions have no latency to draw.
    let latency =
        |f: fn(&Second) -> f64| series.iter().filter(|r| r.ops > 0).map(|r| (r.second as f64, f(r))).collect();
    chart(
        &mut s,
        top + CHART_HEIGHT + 80.0,
        "Latency",
        "milliseconds",
        x_max,
        &[
            Line { label: "p50", color: "#2ca02c", points: latency(|r| r.p50_ms) },
            Line { label: "p99", color: "#d62728", points: latency(|r| r.p99_ms) },
        ],
    );
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::series::tests::series;

    #[test]
    fn svg_is_self_contained_with_both_charts() {
        let text = svg(&series(), "bench <8 B> & more", &["setup", "command"], "operations");
        assert!(text.starts_with("<svg"));
        assert!(text.trim_end().ends_with("</svg>"));
        assert!(text.contains("bench &lt;8 B&gt; &amp; more"));
        // Axes of two charts, throughput, p50 and p99.
        assert_eq!(text.matches("<polyline").count(), 2 + 3);
        assert!(text.contains(">Throughput<") && text.contains(">Latency<"));
        // The empty second has throughput but no latency point.
        let lines: Vec<&str> = text.lines().filter(|l| l.contains("stroke-width=\"1.5\"")).collect();
        assert_eq!(lines[0].split("points=\"").nth(1).unwrap().split('"').next().unwrap().split(' ').count(), 4);
        assert_eq!(lines[1].split("points=\"").nth(1).unwrap().split('"').next().unwrap().split(' ').count(), 3);
        assert_eq!(text.matches('<').count(), text.matches('>').count());
    }

    #[test]
    fn ticks() {
        assert_eq!(nice_step(10.0, 5.0), 2.0);
        assert_eq!(nice_step(12_345.0, 5.0), 5_000.0);
        assert_eq!(nice_step(0.3, 5.0), 0.1);
        assert_eq!(tick_label(0.25, 0.05), "0.25");
    }
}
