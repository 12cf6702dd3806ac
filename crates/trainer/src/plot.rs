//! The end-of-run plot: training loss by step, the dev split's metrics by step, as a PNG.

use std::path::Path;
use std::sync::Once;

use plotters::prelude::*;

use crate::metrics::{EvalRecord, Record};
use crate::TrainError;

/// Fonts looked for to label the plot; without one the plot is drawn without text.
const FONTS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/System/Library/Fonts/Helvetica.ttc",
];

fn register_font() -> bool {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let mut found = false;
        for path in FONTS {
            if let Ok(bytes) = std::fs::read(path) {
                // Registered once per process; the font must live as long as plotters does.
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                    found = true;
                    break;
                }
            }
        }
        FOUND_FONT.store(found, std::sync::atomic::Ordering::Relaxed);
    });
    FOUND_FONT.load(std::sync::atomic::Ordering::Relaxed)
}

static FOUND_FONT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Draws the training loss by step and the dev split's metrics by step, from `records`, into a PNG.
pub(crate) fn plot(path: &Path, records: &[Record]) -> Result<(), TrainError> {
    let loss: Vec<(u64, f64)> = records
        .iter()
        .filter_map(|r| match r {
            Record::Step(s) => Some((s.step, s.loss)),
            Record::Eval(_) => None,
        })
        .collect();
    let evals: Vec<&EvalRecord> = records
        .iter()
        .filter_map(|r| match r {
            Record::Eval(e) => Some(e),
            Record::Step(_) => None,
        })
        .collect();
    let text = register_font();
    let fail = |e: &dyn std::fmt::Display| TrainError::Other(format!("plotting {}: {e}", path.display()));
    let root = BitMapBackend::new(path, (1200, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(&e))?;
    let (left, right) = root.split_horizontally(600);
    let max_step = loss.iter().map(|p| p.0).chain(evals.iter().map(|e| e.step)).max().unwrap_or(1).max(1);
    let max_loss = loss.iter().map(|p| p.1).fold(0.0f64, f64::max).max(1e-3) * 1.05;
    let mut chart = panel(&left, "training loss", max_step, 0.0..max_loss, text).map_err(|e| fail(&e))?;
    chart.draw_series(LineSeries::new(loss.iter().copied(), &BLUE)).map_err(|e| fail(&e))?;
    // The dev split's metrics, one line each: a correlation can be below 0.
    let dev: Vec<&&EvalRecord> = evals.iter().filter(|e| e.split == "dev").collect();
    let names: Vec<&str> =
        dev.first().map(|e| e.scores.metrics().iter().map(|(n, _)| *n).collect()).unwrap_or_default();
    let lowest = dev.iter().flat_map(|e| e.scores.metrics()).map(|(_, v)| v).fold(0.5f64, f64::min);
    let floor = (lowest * 10.0).floor() / 10.0;
    let caption = format!(
        "dev {}",
        names
            .iter()
            .zip(COLOURS.iter().map(|(c, _)| c))
            .map(|(n, c)| format!("{n} ({c})"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let mut chart = panel(&right, &caption, max_step, floor..1.0, text).map_err(|e| fail(&e))?;
    for (name, (_, colour)) in names.iter().zip(COLOURS) {
        let line = dev
            .iter()
            .filter_map(|e| e.scores.metrics().into_iter().find(|(n, _)| n == name).map(|(_, v)| (e.step, v)));
        chart.draw_series(LineSeries::new(line, colour).point_size(4)).map_err(|e| fail(&e))?;
    }
    root.present().map_err(|e| fail(&e))?;
    Ok(())
}

/// The colours of the metric lines, named for the caption.
const COLOURS: [(&str, RGBColor); 3] = [("blue", BLUE), ("red", RED), ("green", GREEN)];

type Coords = Cartesian2d<plotters::coord::types::RangedCoordu64, plotters::coord::types::RangedCoordf64>;

/// One panel: steps across, `y` up, captioned and labelled when a font was found.
fn panel<'a, 'b>(
    area: &'a DrawingArea<BitMapBackend<'b>, plotters::coord::Shift>,
    caption: &str,
    max_step: u64,
    y: std::ops::Range<f64>,
    text: bool,
) -> Result<ChartContext<'a, BitMapBackend<'b>, Coords>, String> {
    let mut builder = ChartBuilder::on(area);
    builder.margin(15).x_label_area_size(35).y_label_area_size(50);
    if text {
        builder.caption(caption, ("sans-serif", 20));
    }
    let mut chart = builder.build_cartesian_2d(0u64..max_step, y).map_err(|e| e.to_string())?;
    let mut mesh = chart.configure_mesh();
    if text {
        mesh.x_desc("step");
    } else {
        mesh.disable_x_axis().disable_y_axis();
    }
    mesh.draw().map_err(|e| e.to_string())?;
    Ok(chart)
}
