//! The `peers` benchmark's charts, drawn as PNG with plotters: grouped bars
//! (a value per system and series) and lines (a value per x and system).
//!
//! Text needs a TrueType font: `$STILE_CHART_FONT`, else DejaVu Sans or
//! Liberation Sans where Debian installs them.

use std::path::Path;

use anyhow::{Context as _, anyhow};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

const SIZE: (u32, u32) = (1000, 560);
const COLOURS: [RGBColor; 7] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0x7f, 0x7f, 0x7f),
];

/// A named row of values: one per category of a bar chart, or `(x, y)`
/// points of a line.
#[derive(Clone, Debug)]
pub struct Series<T> {
    pub name: String,
    pub values: Vec<T>,
}

/// Registers the font once; charts cannot be drawn without one.
pub fn load_font() -> anyhow::Result<()> {
    let candidates = [
        std::env::var("STILE_CHART_FONT").ok(),
        Some("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf".to_owned()),
        Some("/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf".to_owned()),
    ];
    let path = candidates
        .into_iter()
        .flatten()
        .find(|p| Path::new(p).is_file())
        .ok_or_else(|| anyhow!("no TrueType font: set STILE_CHART_FONT, or install fonts-dejavu-core"))?;
    let bytes = std::fs::read(&path).with_context(|| format!("read {path}"))?;
    plotters::style::register_font("sans-serif", FontStyle::Normal, Box::leak(bytes.into_boxed_slice()))
        .map_err(|_| anyhow!("{path} is not a font plotters can read"))
}

/// Bars grouped by category (the systems), one bar per series in each
/// group, on a logarithmic axis. A NaN value draws no bar.
pub fn grouped_bars(path: &Path, title: &str, y_desc: &str, categories: &[&str], series: &[Series<f64>]) -> anyhow::Result<()> {
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let (lo, hi) = log_range(series.iter().flat_map(|s| s.values.iter().copied()));
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(70)
        .y_label_area_size(90)
        .build_cartesian_2d(0f64..categories.len() as f64, (lo..hi).log_scale())?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .y_desc(y_desc)
        .y_label_formatter(&|v| human(*v))
        .label_style(("sans-serif", 14))
        .draw()?;
    let width = 0.8 / series.len().max(1) as f64;
    for (k, s) in series.iter().enumerate() {
        let colour = COLOURS[k % COLOURS.len()];
        let bars = s.values.iter().enumerate().filter(|(_, v)| v.is_finite() && **v > 0.0).map(move |(i, &v)| {
            let x0 = i as f64 + 0.1 + k as f64 * width;
            Rectangle::new([(x0, lo), (x0 + width * 0.92, v)], colour.filled())
        });
        chart
            .draw_series(bars)?
            .label(s.name.clone())
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 12, y + 6)], colour.filled()));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()?;
    let style = TextStyle::from(("sans-serif", 14).into_font()).pos(Pos::new(HPos::Center, VPos::Top));
    for (i, category) in categories.iter().enumerate() {
        let (x, y) = chart.backend_coord(&(i as f64 + 0.5, lo));
        root.draw(&Text::new(category.to_string(), (x, y + 8), style.clone()))?;
    }
    root.present()?;
    Ok(())
}

/// Lines of `(x, y)` points, x on a logarithmic axis.
pub fn lines(path: &Path, title: &str, x_desc: &str, y_desc: &str, series: &[Series<(f64, f64)>]) -> anyhow::Result<()> {
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let points = || series.iter().flat_map(|s| s.values.iter().copied()).filter(|(x, y)| x.is_finite() && y.is_finite());
    let (x_lo, x_hi) = log_range(points().map(|(x, _)| x));
    let y_hi = points().map(|(_, y)| y).fold(0f64, f64::max) * 1.15;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(50)
        .y_label_area_size(90)
        .build_cartesian_2d((x_lo..x_hi).log_scale(), 0f64..y_hi.max(1.0))?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .x_label_formatter(&|v| human(*v))
        .y_label_formatter(&|v| human(*v))
        .label_style(("sans-serif", 14))
        .draw()?;
    for (k, s) in series.iter().enumerate() {
        let colour = COLOURS[k % COLOURS.len()];
        let points: Vec<(f64, f64)> = s.values.iter().copied().filter(|(x, y)| x.is_finite() && y.is_finite()).collect();
        chart
            .draw_series(LineSeries::new(points.clone(), colour.stroke_width(3)))?
            .label(s.name.clone())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], colour.stroke_width(3)));
        chart.draw_series(points.into_iter().map(|p| Circle::new(p, 4, colour.filled())))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()?;
    root.present()?;
    Ok(())
}

/// An axis from below the smallest positive value to above the largest, in
/// whole powers of ten.
fn log_range(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values.filter(|v| v.is_finite() && *v > 0.0).fold((f64::MAX, 0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if hi == 0.0 {
        return (1.0, 10.0);
    }
    (10f64.powf(lo.log10().floor()), 10f64.powf(hi.log10().ceil()).max(lo * 10.0))
}

/// `1.5k`, `300k`, `2M`: axis labels a person reads at a glance.
fn human(v: f64) -> String {
    let (scaled, unit) = match v.abs() {
        a if a >= 1e6 => (v / 1e6, "M"),
        a if a >= 1e3 => (v / 1e3, "k"),
        _ => (v, ""),
    };
    if scaled.fract().abs() < 1e-9 || scaled.abs() >= 100.0 {
        format!("{scaled:.0}{unit}")
    } else if scaled.abs() >= 1.0 {
        format!("{scaled:.1}{unit}")
    } else {
        format!("{scaled:.2}{unit}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axes_cover_their_values_in_powers_of_ten() {
        assert_eq!(log_range([3.0, 250.0].into_iter()), (1.0, 1000.0));
        assert_eq!(log_range([f64::NAN, 0.0].into_iter()), (1.0, 10.0));
        assert_eq!(human(1500.0), "1.5k");
        assert_eq!(human(300_000.0), "300k");
        assert_eq!(human(2e6), "2M");
        assert_eq!(human(0.5), "0.50");
    }

    #[test]
    fn charts_are_drawn_as_png() {
        if load_font().is_err() {
            eprintln!("no font on this machine: the chart is not drawn");
            return;
        }
        let dir = std::env::temp_dir().join(format!("stile-chart-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let bars = dir.join("bars.png");
        let series = [
            Series { name: "batch 1".into(), values: vec![10_000.0, 2_000.0] },
            Series { name: "batch 100".into(), values: vec![300_000.0, f64::NAN] },
        ];
        grouped_bars(&bars, "throughput", "messages/s", &["a", "b"], &series).unwrap();
        let line = dir.join("lines.png");
        lines(
            &line,
            "memory",
            "ids held",
            "bytes per id",
            &[Series { name: "a".into(), values: vec![(1e5, 40.0), (1e6, 30.0)] }],
        )
        .unwrap();
        for png in [bars, line] {
            let bytes = std::fs::read(&png).unwrap();
            assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{} is a PNG", png.display());
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
