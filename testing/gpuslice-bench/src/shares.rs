//! `gpuslice-bench plot-shares`: what each slice of a compute-share run
//! got against its target share, as an SVG beside the run's JSON. It reads
//! the fake engine's scale benchmark (`compute::compute_scale` in
//! gpuslice-shim's tests: `cases` a list of `{case, targets_percent,
//! got_percent}`) and the GPU machine's (`scripts/device_compute29.py`:
//! `cases` an object of `{targets, percent_of_bare}`): one dot a slice, a
//! colour a case, and the diagonal where a slice got exactly its share.

use crate::plot::SERIES_STROKE;
use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use plotters::prelude::*;
use serde_json::Value;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct PlotSharesArgs {
    /// The run's JSON (compute-scale or compute29).
    pub input: PathBuf,
    /// Where to write the SVG [default: the input with .svg].
    #[arg(long, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

/// One case of a run: each slice's target and what it got (percent).
#[derive(Debug, Clone, PartialEq)]
pub struct Case {
    pub name: String,
    pub targets: Vec<f64>,
    pub got: Vec<f64>,
}

pub fn run(args: &PlotSharesArgs) -> Result<i32> {
    let text = std::fs::read_to_string(&args.input)
        .with_context(|| format!("reading {}", args.input.display()))?;
    let run: Value = serde_json::from_str(&text)
        .with_context(|| format!("{}: not JSON", args.input.display()))?;
    let cases = read_cases(&run).with_context(|| format!("{}", args.input.display()))?;
    let title = run["benchmark"]
        .as_str()
        .or(run["gpu"].as_str())
        .unwrap_or("compute shares");
    let svg = svg(
        &format!("{title}: each slice's share against its target"),
        &cases,
    )?;
    let output = args
        .output
        .clone()
        .unwrap_or_else(|| args.input.with_extension("svg"));
    std::fs::write(&output, svg).with_context(|| format!("writing {}", output.display()))?;
    println!("{}", output.display());
    Ok(0)
}

/// The cases of either run format, in their order.
pub fn read_cases(run: &Value) -> Result<Vec<Case>> {
    let numbers = |v: &Value, key: &str| -> Result<Vec<f64>> {
        v[key]
            .as_array()
            .ok_or_else(|| anyhow!("no {key:?} list"))?
            .iter()
            .map(|x| {
                x.as_f64()
                    .ok_or_else(|| anyhow!("{key:?}: {x} is not a number"))
            })
            .collect()
    };
    let case = |name: String, v: &Value, targets: &str, got: &str| -> Result<Case> {
        let c = Case {
            targets: numbers(v, targets).with_context(|| format!("case {name}"))?,
            got: numbers(v, got).with_context(|| format!("case {name}"))?,
            name,
        };
        if c.targets.len() != c.got.len() {
            bail!(
                "case {}: {} targets, {} results",
                c.name,
                c.targets.len(),
                c.got.len()
            );
        }
        Ok(c)
    };
    match &run["cases"] {
        Value::Array(list) => list
            .iter()
            .map(|v| {
                let name = v["case"].as_str().unwrap_or("?").to_string();
                case(name, v, "targets_percent", "got_percent")
            })
            .collect(),
        Value::Object(map) => map
            .iter()
            .map(|(name, v)| case(name.clone(), v, "targets", "percent_of_bare"))
            .collect(),
        _ => bail!("no \"cases\": not a compute-scale or compute29 result"),
    }
}

/// Distinct colours for up to ten cases, then again.
const PALETTE: [(u8, u8, u8); 10] = [
    (31, 119, 180),
    (255, 127, 14),
    (44, 160, 44),
    (214, 39, 40),
    (148, 103, 189),
    (140, 86, 75),
    (227, 119, 194),
    (127, 127, 127),
    (188, 189, 34),
    (23, 190, 207),
];

/// The chart: targets on x, what each slice got on y, both in percent.
pub fn svg(title: &str, cases: &[Case]) -> Result<String> {
    let mut out = String::new();
    draw(&mut out, title, cases).map_err(|e| anyhow!("plot: {e}"))?;
    Ok(out)
}

type DrawResult = std::result::Result<(), Box<dyn std::error::Error>>;

fn draw(out: &mut String, title: &str, cases: &[Case]) -> DrawResult {
    let top = cases
        .iter()
        .flat_map(|c| c.targets.iter().chain(&c.got))
        .fold(10.0_f64, |m, v| m.max(*v));
    let top = (top * 1.1).min(110.0);
    let root = SVGBackend::with_string(out, (720, 640)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 17))
        .margin(14)
        .x_label_area_size(44)
        .y_label_area_size(56)
        .build_cartesian_2d(0.0..top, 0.0..top)?;
    chart
        .configure_mesh()
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 15))
        .x_desc("target share (%)")
        .y_desc("what the slice got (%)")
        .draw()?;
    chart.draw_series(LineSeries::new(
        [(0.0, 0.0), (top, top)],
        BLACK.mix(0.4).stroke_width(1),
    ))?;
    for (i, c) in cases.iter().enumerate() {
        let (r, g, b) = PALETTE[i % PALETTE.len()];
        let color = RGBColor(r, g, b);
        chart
            .draw_series(
                c.targets
                    .iter()
                    .zip(&c.got)
                    .map(|(t, g)| Circle::new((*t, *g), 4, color.filled())),
            )?
            .label(c.name.clone())
            .legend(move |(x, y)| {
                PathElement::new([(x, y), (x + 14, y)], color.stroke_width(SERIES_STROKE))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font(("sans-serif", 13))
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK.mix(0.3))
        .draw()?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn both_run_formats_are_read_in_order() {
        let scale = json!({"cases": [
            {"case": "2x50", "targets_percent": [50.0, 50.0], "got_percent": [48.0, 49.5]},
            {"case": "10/90", "targets_percent": [10.0, 90.0], "got_percent": [9.5, 88.0]},
        ]});
        let cases = read_cases(&scale).unwrap();
        assert_eq!(cases.len(), 2);
        assert_eq!(cases[1].name, "10/90");
        assert_eq!(cases[1].got, [9.5, 88.0]);
        let h200 =
            json!({"cases": {"30/70": {"targets": [30, 70], "percent_of_bare": [29.1, 66.0]}}});
        assert_eq!(
            read_cases(&h200).unwrap(),
            [Case {
                name: "30/70".into(),
                targets: vec![30.0, 70.0],
                got: vec![29.1, 66.0]
            }]
        );
        for bad in [
            json!({}),
            json!({"cases": [{"case": "x", "targets_percent": [1.0], "got_percent": []}]}),
            json!({"cases": [{"case": "x", "targets_percent": ["a"], "got_percent": [1.0]}]}),
        ] {
            assert!(read_cases(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn one_dot_a_slice_and_a_key_a_case() {
        let cases = vec![
            Case {
                name: "8x12.5".into(),
                targets: vec![12.5; 8],
                got: vec![12.0; 8],
            },
            Case {
                name: "10/90".into(),
                targets: vec![10.0, 90.0],
                got: vec![9.0, 87.0],
            },
        ];
        let svg = svg("shares", &cases).unwrap();
        assert!(svg.starts_with("<svg"), "{svg}");
        // Ten slices, ten dots (the legend draws lines, not circles).
        assert_eq!(svg.matches("<circle").count(), 10, "{svg}");
        for text in ["8x12.5", "10/90", "target share (%)"] {
            assert!(svg.contains(text), "{text} missing");
        }
    }
}
