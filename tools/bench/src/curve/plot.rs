//! The curve's plot: speedup by nodes, a line per model and batching, beside the linear line,
//! the floors and the published points; and the legend every bench plot draws alike.

use std::path::Path;

use anyhow::Result;
use plotters::prelude::*;
use ringtune_trainer::plot::register_font;

use crate::curve::settings::CurveModel;
use crate::curve::timing::{baseline, Floor, Point};
use crate::scaling::Batching;

/// The speedups the Hugging Face / Intel post reports for this recipe on c6i.16xlarge nodes, 32
/// examples per node (7 min 46 s, 4 min 39 s and 2 min 36 s on 1, 2 and 4 nodes).
const PUBLISHED: [(f64, f64); 3] = [(1.0, 1.0), (2.0, 466.0 / 279.0), (4.0, 466.0 / 156.0)];

/// The curves as a PNG: speedup by nodes, one line per model and batching, beside the linear
/// line and the published points.
pub(crate) fn draw(path: &Path, (points, floors): (&[Point], &[Floor]), nodes: &[usize], emulate: &str) -> Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let text = register_font();
    let largest = nodes.iter().copied().max().unwrap_or(1) as f64;
    let fail = |e: &dyn std::fmt::Display| anyhow::anyhow!("plotting {}: {e}", path.display());
    let root = BitMapBackend::new(path, (800, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(&e))?;
    let mut builder = ChartBuilder::on(&root);
    builder.margin(20).x_label_area_size(40).y_label_area_size(50);
    if text {
        builder.caption(format!("speedup on emulated {emulate} nodes"), ("sans-serif", 22));
    }
    let mut chart = builder.build_cartesian_2d(0.8..largest + 0.2, 0.0..largest + 0.5).map_err(|e| fail(&e))?;
    let mut mesh = chart.configure_mesh();
    if text {
        mesh.x_desc("nodes").y_desc("speedup");
    } else {
        mesh.disable_x_axis().disable_y_axis();
    }
    mesh.draw().map_err(|e| fail(&e))?;
    let ideal =
        chart.draw_series(LineSeries::new([(1.0, 1.0), (largest, largest)], BLACK.mix(0.4))).map_err(|e| fail(&e))?;
    if text {
        ideal.label("linear").legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLACK.mix(0.4)));
    }
    let published = chart
        .draw_series(PUBLISHED.iter().map(|&(n, s)| Cross::new((n, s), 6, BLACK.stroke_width(2))))
        .map_err(|e| fail(&e))?;
    if text {
        published
            .label("HF / Intel post, c6i.16xlarge, 32 per node")
            .legend(|(x, y)| Cross::new((x + 10, y), 5, BLACK.stroke_width(2)));
    }
    // Three lines a model, three models: no two lines of one plot share a colour.
    let colours = [
        BLUE,
        RED,
        GREEN,
        MAGENTA,
        RGBColor(230, 120, 0),
        CYAN,
        RGBColor(120, 60, 160),
        RGBColor(140, 90, 40),
        RGBColor(0, 110, 60),
    ];
    for ((label, line, faint), c) in lines(points, floors).into_iter().zip(colours.iter().cycle()) {
        let c = if faint { c.mix(0.5) } else { c.to_rgba() };
        let series = chart.draw_series(LineSeries::new(line, c).point_size(4)).map_err(|e| fail(&e))?;
        if text {
            series.label(label).legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], c));
        }
    }
    legend_and_present(&mut chart, &root, SeriesLabelPosition::UpperLeft, text).map_err(|e| fail(&e))
}

/// Draws `chart`'s legend at `position` where a font was found (`text`), then writes `root` out.
pub(crate) fn legend_and_present<'a, 'b: 'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, BitMapBackend<'b>, CT>,
    root: &DrawingArea<BitMapBackend<'b>, plotters::coord::Shift>,
    position: SeriesLabelPosition,
    text: bool,
) -> Result<(), String> {
    if text {
        chart
            .configure_series_labels()
            .position(position)
            .background_style(WHITE)
            .border_style(BLACK)
            .draw()
            .map_err(|e| e.to_string())?;
    }
    root.present().map_err(|e| e.to_string())
}

/// A line of the plot: its label, its points (nodes, speedup), and whether it is drawn faint.
type Line = (String, Vec<(f64, f64)>, bool);

/// The plot's lines: per model, the speedup with a batch per node, with the global batch, and
/// at the floor (faint).
fn lines(points: &[Point], floors: &[Floor]) -> Vec<Line> {
    let models: Vec<CurveModel> = points.iter().fold(Vec::new(), |mut seen, p| {
        if !seen.contains(&p.model) {
            seen.push(p.model);
        }
        seen
    });
    let mut out = Vec::new();
    for model in models {
        let Some(base) = baseline(points, model) else { continue };
        for (batching, label) in [(Batching::PerNode, "batch per node"), (Batching::Global, "global batch")] {
            let line = points
                .iter()
                .filter(|p| p.model == model && (p.nodes == 1 || p.batching == batching))
                .map(|p| (p.nodes as f64, p.samples_per_s() / base.samples_per_s()))
                .collect();
            out.push((format!("{}, {label}", model.name()), line, false));
        }
        let at_floor = |f: &Floor| (f.nodes as f64, f.nodes as f64 * base.phases().step / f.slowest_step);
        let floor: Vec<(f64, f64)> =
            std::iter::once((1.0, 1.0)).chain(floors.iter().filter(|f| f.model == model).map(at_floor)).collect();
        if floor.len() > 1 {
            out.push((format!("{}, the floor: each node alone, nothing synced", model.name()), floor, true));
        }
    }
    out
}
