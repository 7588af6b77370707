//! SVG line charts for benchmark results (plotters, SVG backend only: no
//! fonts are linked, the viewer renders the text).
//!
//! One chart holds side-by-side panels that share an x axis of categories
//! (GPU counts, equally spaced whatever their values). Each series is a
//! line through its medians with p10–p90 whiskers and a dot per point.

use anyhow::{anyhow, Result};
use plotters::prelude::*;

/// Stroke width of a series' line; axes and whiskers are thinner, so a
/// reader (or a test) can tell the series apart in the SVG.
pub const SERIES_STROKE: u32 = 2;

#[derive(Debug, Clone)]
pub struct Point {
    /// Index into the chart's categories.
    pub category: usize,
    pub median: f64,
    pub p10: f64,
    pub p90: f64,
}

#[derive(Debug, Clone)]
pub struct Series {
    pub name: String,
    pub color: (u8, u8, u8),
    pub points: Vec<Point>,
}

#[derive(Debug, Clone)]
pub struct Panel {
    pub title: String,
    pub y_label: String,
    pub series: Vec<Series>,
}

/// Renders `panels` side by side under `title`; `categories` label the x
/// axis (described by `x_label`).
pub fn line_chart_svg(
    title: &str,
    x_label: &str,
    categories: &[String],
    panels: &[Panel],
) -> Result<String> {
    let mut svg = String::new();
    draw(&mut svg, title, x_label, categories, panels).map_err(|e| anyhow!("plot: {e}"))?;
    Ok(svg)
}

/// One row of colour keys under the title, outside the panels, so it
/// never hides a point. The series of the first panel name them all.
fn draw_legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    panels: &[Panel],
) -> DrawResult
where
    DB::ErrorType: 'static,
{
    let Some(first) = panels.first() else {
        return Ok(());
    };
    let total: i32 = first
        .series
        .iter()
        .map(|s| 40 + 9 * s.name.len() as i32)
        .sum();
    let mut x = (area.dim_in_pixel().0 as i32 - total).max(0) / 2;
    for s in &first.series {
        let color = RGBColor(s.color.0, s.color.1, s.color.2);
        area.draw(&Rectangle::new([(x, 8), (x + 16, 20)], color.filled()))?;
        area.draw(&Text::new(
            s.name.clone(),
            (x + 22, 6),
            ("sans-serif", 16).into_font(),
        ))?;
        x += 40 + 9 * s.name.len() as i32;
    }
    Ok(())
}

type DrawResult = std::result::Result<(), Box<dyn std::error::Error>>;

fn draw(
    svg: &mut String,
    title: &str,
    x_label: &str,
    categories: &[String],
    panels: &[Panel],
) -> DrawResult {
    let width = 620 * panels.len().max(1) as u32;
    let root = SVGBackend::with_string(svg, (width, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(title, ("sans-serif", 20))?;
    let (legend, root) = root.split_vertically(28);
    draw_legend(&legend, panels)?;
    let n = categories.len().max(1);
    let x_range = -0.5..(n as f64 - 0.5);
    let label_of = |x: &f64| {
        let i = x.round();
        if (x - i).abs() < 1e-6 && i >= 0.0 {
            categories.get(i as usize).cloned().unwrap_or_default()
        } else {
            String::new()
        }
    };
    for (area, panel) in root
        .split_evenly((1, panels.len().max(1)))
        .iter()
        .zip(panels)
    {
        let y_max = panel
            .series
            .iter()
            .flat_map(|s| &s.points)
            .map(|p| p.p90.max(p.median))
            .fold(0.0_f64, f64::max);
        let y_max = if y_max > 0.0 { y_max * 1.15 } else { 1.0 };
        let mut chart = ChartBuilder::on(area)
            .caption(&panel.title, ("sans-serif", 17))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(x_range.clone(), 0.0..y_max)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(4 * n + 1)
            .x_label_formatter(&label_of)
            .label_style(("sans-serif", 14))
            .axis_desc_style(("sans-serif", 15))
            .x_desc(x_label)
            .y_desc(&panel.y_label)
            .draw()?;
        // Series side by side within a category, so whiskers do not hide
        // each other when the methods cost the same.
        let count = panel.series.len().max(1) as f64;
        let spread = 0.3_f64.min(0.08 * (count - 1.0));
        for (i, s) in panel.series.iter().enumerate() {
            let color = RGBColor(s.color.0, s.color.1, s.color.2);
            let shift = if count > 1.0 {
                -spread / 2.0 + spread * i as f64 / (count - 1.0)
            } else {
                0.0
            };
            let x = |p: &Point| p.category as f64 + shift;
            chart.draw_series(LineSeries::new(
                s.points.iter().map(|p| (x(p), p.median)),
                color.stroke_width(SERIES_STROKE),
            ))?;
            chart.draw_series(s.points.iter().map(|p| {
                ErrorBar::new_vertical(x(p), p.p10, p.median, p.p90, color.stroke_width(1), 8)
            }))?;
            chart.draw_series(
                s.points
                    .iter()
                    .map(|p| Circle::new((x(p), p.median), 3, color.filled())),
            )?;
        }
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(name: &str, medians: &[f64]) -> Series {
        Series {
            name: name.into(),
            color: (10, 20, 30),
            points: medians
                .iter()
                .enumerate()
                .map(|(i, &m)| Point {
                    category: i,
                    median: m,
                    p10: m * 0.9,
                    p90: m * 1.1,
                })
                .collect(),
        }
    }

    #[test]
    fn one_polyline_per_series_and_panel_with_labels() {
        let panels = vec![
            Panel {
                title: "left".into(),
                y_label: "ms".into(),
                series: vec![series("a", &[1.0, 2.0]), series("b", &[1.5, 1.6])],
            },
            Panel {
                title: "right".into(),
                y_label: "ms".into(),
                series: vec![series("a", &[3.0]), series("b", &[])],
            },
        ];
        let cats = vec!["1".to_string(), "8".to_string()];
        let svg = line_chart_svg("title <&>", "GPUs", &cats, &panels).unwrap();
        assert!(svg.starts_with("<svg"), "{svg}");
        let lines = svg
            .matches("<polyline")
            .zip(svg.split("<polyline").skip(1))
            .filter(|(_, rest)| {
                rest.split("/>")
                    .next()
                    .unwrap_or("")
                    .contains(&format!("stroke-width=\"{SERIES_STROKE}\""))
            })
            .count();
        // A series without points draws no line; one with a single point does.
        assert_eq!(lines, 3, "{svg}");
        let texts: Vec<&str> = svg
            .split("<text")
            .skip(1)
            .filter_map(|t| t.split_once('>'))
            .map(|(_, t)| t.split("</text>").next().unwrap_or("").trim())
            .collect();
        for text in ["left", "right", "a", "b", "8", "title &lt;&amp;&gt;"] {
            assert!(texts.contains(&text), "{text} missing: {texts:?}");
        }
    }
}
