//! The pictures in BENCHMARKS.md, drawn by the benches that measure them
//! (`--chart PATH`), so a curve is redrawn whenever its figures are: SVG
//! with its text as text, drawn by plotters.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;

/// One line of a chart: its name in the legend and its points.
#[derive(Debug, Clone)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

impl Series {
    pub fn new(name: impl Into<String>, points: Vec<(f64, f64)>) -> Series {
        Series { name: name.into(), points }
    }
}

/// Lines against a shared x axis; the y axis logarithmic when the values
/// span orders of magnitude (latency past saturation).
#[derive(Debug, Clone)]
pub struct LineChart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub log_y: bool,
    pub series: Vec<Series>,
}

/// Bars in groups: one group per category, one bar per series in each.
#[derive(Debug, Clone)]
pub struct BarChart {
    pub title: String,
    pub y_label: String,
    pub categories: Vec<String>,
    /// A name and one value per category.
    pub series: Vec<(String, Vec<f64>)>,
}

const WIDTH: u32 = 720;
const HEIGHT: u32 = 420;

/// Colours a reader can tell apart, also in greyscale.
const PALETTE: [RGBColor; 5] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x7f, 0x7f, 0x7f),
];

type Failure = Box<dyn std::error::Error>;

/// An axis label: at most three decimals, no trailing zeros (`0.3`, not
/// `0.30000000000000004`; `1500`, not `1500.0`).
fn tidy(v: &f64) -> String {
    let fixed = format!("{v:.3}");
    let trimmed = if fixed.contains('.') { fixed.trim_end_matches('0').trim_end_matches('.') } else { &fixed };
    if trimmed == "-0" { "0".to_owned() } else { trimmed.to_owned() }
}

/// The series' names in a framed box at `position`.
fn legend<'a, CT: CoordTranslate>(chart: &mut ChartContext<'a, SVGBackend<'a>, CT>, position: SeriesLabelPosition) -> Result<(), Failure> {
    chart.configure_series_labels().position(position).background_style(WHITE.mix(0.85)).border_style(BLACK).draw()?;
    Ok(())
}

fn colour(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

/// The smallest and largest of `values`, widened so that a flat series still has a range.
fn bounds(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (low, high) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if !low.is_finite() {
        (0.0, 1.0)
    } else if low == high {
        (low - 0.5, high + 0.5)
    } else {
        (low, high)
    }
}

impl LineChart {
    /// The chart as an SVG document.
    pub fn svg(&self) -> Result<String, Failure> {
        let mut out = String::new();
        {
            let root = SVGBackend::with_string(&mut out, (WIDTH, HEIGHT)).into_drawing_area();
            root.fill(&WHITE)?;
            self.draw(&root)?;
            root.present()?;
        }
        Ok(out)
    }

    fn draw(&self, root: &DrawingArea<SVGBackend<'_>, Shift>) -> Result<(), Failure> {
        let points = || self.series.iter().flat_map(|s| s.points.iter());
        let (x_low, x_high) = bounds(points().map(|p| p.0));
        let (y_low, y_high) = bounds(points().map(|p| p.1));
        let x_range = (x_low - (x_high - x_low) * 0.03)..(x_high + (x_high - x_low) * 0.03);
        let mut chart = ChartBuilder::on(root);
        chart.caption(&self.title, ("sans-serif", 18)).margin(12).x_label_area_size(42).y_label_area_size(64);
        if self.log_y {
            let low = (y_low.max(1e-3) / 1.5).log10().floor();
            let high = (y_high * 1.5).log10().ceil();
            let mut chart = chart.build_cartesian_2d(x_range, (10f64.powf(low)..10f64.powf(high)).log_scale())?;
            let mut mesh = chart.configure_mesh();
            mesh.x_desc(&self.x_label).y_desc(&self.y_label).x_label_formatter(&tidy).y_label_formatter(&tidy);
            mesh.draw()?;
            self.lines(&mut chart)?;
        } else {
            let mut chart = chart.build_cartesian_2d(x_range, 0f64.min(y_low)..y_high * 1.1)?;
            let mut mesh = chart.configure_mesh();
            mesh.x_desc(&self.x_label).y_desc(&self.y_label).x_label_formatter(&tidy).y_label_formatter(&tidy);
            mesh.draw()?;
            self.lines(&mut chart)?;
        }
        Ok(())
    }

    fn lines<'a, X, Y>(&self, chart: &mut ChartContext<'a, SVGBackend<'a>, Cartesian2d<X, Y>>) -> Result<(), Failure>
    where
        X: Ranged<ValueType = f64>,
        Y: Ranged<ValueType = f64>,
    {
        for (i, series) in self.series.iter().enumerate() {
            let style = colour(i).stroke_width(2);
            chart
                .draw_series(LineSeries::new(series.points.iter().copied(), style))?
                .label(series.name.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], colour(i).stroke_width(2)));
            chart.draw_series(series.points.iter().map(|&p| Circle::new(p, 3, colour(i).filled())))?;
        }
        legend(chart, SeriesLabelPosition::UpperLeft)
    }

    /// Writes the chart to `path`.
    pub fn write(&self, path: &Path) -> Result<(), Failure> {
        std::fs::write(path, self.svg()?)?;
        Ok(())
    }
}

impl BarChart {
    /// The chart as an SVG document.
    pub fn svg(&self) -> Result<String, Failure> {
        let mut out = String::new();
        {
            let root = SVGBackend::with_string(&mut out, (WIDTH, HEIGHT)).into_drawing_area();
            root.fill(&WHITE)?;
            let groups = self.categories.len() as f64;
            // Headroom above the tallest bar for its value and the legend.
            let high = self.series.iter().flat_map(|(_, v)| v.iter().copied()).fold(0.0, f64::max) * 1.4;
            let mut chart = ChartBuilder::on(&root)
                .caption(&self.title, ("sans-serif", 18))
                .margin(12)
                .x_label_area_size(42)
                .y_label_area_size(64)
                .build_cartesian_2d(0f64..groups, 0f64..high.max(f64::MIN_POSITIVE))?;
            let categories = self.categories.clone();
            chart
                .configure_mesh()
                .disable_x_mesh()
                .y_max_light_lines(1)
                .x_labels(categories.len() * 2 + 1)
                .x_label_formatter(&|x| {
                    // A label at each group's middle, none between.
                    let middle = x - x.floor();
                    if (middle - 0.5).abs() < 1e-6 {
                        categories.get(x.floor() as usize).cloned().unwrap_or_default()
                    } else {
                        String::new()
                    }
                })
                .y_desc(&self.y_label)
                .draw()?;
            let bars = self.series.len() as f64;
            let width = 0.8 / bars;
            for (s, (name, values)) in self.series.iter().enumerate() {
                let left = |group: usize| group as f64 + 0.1 + s as f64 * width;
                chart
                    .draw_series(
                        values
                            .iter()
                            .enumerate()
                            .map(|(g, &v)| Rectangle::new([(left(g), 0.0), (left(g) + width * 0.92, v)], colour(s).filled())),
                    )?
                    .label(name.as_str())
                    .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], colour(s).filled()));
                chart.draw_series(values.iter().enumerate().map(|(g, &v)| {
                    // The text hangs below its anchor: anchored above the bar.
                    Text::new(format!("{v:.2}"), (left(g) + width * 0.1, v + high * 0.045), ("sans-serif", 11).into_font().color(&BLACK))
                }))?;
            }
            legend(&mut chart, SeriesLabelPosition::UpperRight)?;
            root.present()?;
        }
        Ok(out)
    }

    /// Writes the chart to `path`.
    pub fn write(&self, path: &Path) -> Result<(), Failure> {
        std::fs::write(path, self.svg()?)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_chart_names_its_axes_and_every_series() {
        let chart = LineChart {
            title: "p99 against offered writes".into(),
            x_label: "offered writes/s".into(),
            y_label: "p99 ms".into(),
            log_y: true,
            series: vec![
                Series::new("the service", vec![(500.0, 5.4), (1000.0, 11.0), (1500.0, 119.0)]),
                Series::new("plain INSERT", vec![(500.0, 4.9), (1000.0, 10.3), (1500.0, 9.4)]),
            ],
        };
        let svg = chart.svg().expect("draw");
        assert!(svg.starts_with("<svg"), "{}", &svg[..80]);
        for text in ["p99 against offered writes", "offered writes/s", "p99 ms", "the service", "plain INSERT"] {
            assert!(svg.contains(text), "{text} missing");
        }
        // One marker per point.
        assert_eq!(svg.matches("<circle").count(), 6);
    }

    #[test]
    fn a_bar_chart_has_a_bar_and_a_value_per_category_and_series() {
        let chart = BarChart {
            title: "on disk".into(),
            y_label: "% of raw".into(),
            categories: vec!["Anarchism".into(), "font-size".into()],
            series: vec![("revstore".into(), vec![1.87, 1.80]), ("zstd --long".into(), vec![1.83, 1.10])],
        };
        let svg = chart.svg().expect("draw");
        for text in ["Anarchism", "font-size", "revstore", "zstd --long", "1.87", "1.10"] {
            assert!(svg.contains(text), "{text} missing");
        }
    }

    #[test]
    fn axis_labels_are_tidy() {
        assert_eq!(tidy(&(0.1 + 0.2)), "0.3");
        assert_eq!(tidy(&1500.0), "1500");
        assert_eq!(tidy(&0.125), "0.125");
        assert_eq!(tidy(&-0.0001), "0");
    }

    #[test]
    fn an_empty_or_flat_chart_still_draws() {
        let flat = LineChart {
            title: "t".into(),
            x_label: "x".into(),
            y_label: "y".into(),
            log_y: false,
            series: vec![Series::new("s", vec![(1.0, 2.0)])],
        };
        assert!(flat.svg().is_ok());
        let empty = LineChart { series: Vec::new(), ..flat };
        assert!(empty.svg().is_ok());
    }
}
