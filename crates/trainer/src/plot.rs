//! The end-of-run plot: training loss by step, and every evaluation set's metrics by step (dev,
//! MNLI's dev_mismatched, a labelled test file), as a PNG.

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

/// Registers the first font found as plotters' "sans-serif" (once per process); whether one
/// was found, so that plots without one are drawn without text rather than failing.
pub fn register_font() -> bool {
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

/// Draws the training loss by step and each evaluation set's metrics by step, from `records`,
/// into a PNG; `how` (nodes, batch, what the recipe chose) captions the loss.
pub(crate) fn plot(path: &Path, records: &[Record], how: &str) -> Result<(), TrainError> {
    let loss: Vec<(u64, f64)> = records
        .iter()
        .filter_map(|r| match r {
            Record::Step(s) => Some((s.step, s.loss)),
            _ => None,
        })
        .collect();
    let evals: Vec<&EvalRecord> = records
        .iter()
        .filter_map(|r| match r {
            Record::Eval(e) => Some(e),
            _ => None,
        })
        .collect();
    let text = register_font();
    let fail = |e: &dyn std::fmt::Display| TrainError::Plot { path: path.to_path_buf(), reason: e.to_string() };
    let root = BitMapBackend::new(path, (1200, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(&e))?;
    let (left, right) = root.split_horizontally(600);
    let max_step = loss.iter().map(|p| p.0).chain(evals.iter().map(|e| e.step)).max().unwrap_or(1).max(1);
    let max_loss = loss.iter().map(|p| p.1).fold(0.0f64, f64::max).max(1e-3) * 1.05;
    let mut chart =
        panel(&left, &format!("training loss ({how})"), max_step, 0.0..max_loss, text).map_err(|e| fail(&e))?;
    chart.draw_series(LineSeries::new(loss.iter().copied(), &BLUE)).map_err(|e| fail(&e))?;
    // Each change of the nodes: a line at its step, and who left.
    for (step, label) in membership_marks(records) {
        let line = PathElement::new(vec![(step, 0.0), (step, max_loss)], RED.stroke_width(2));
        chart.draw_series(std::iter::once(line)).map_err(|e| fail(&e))?;
        if text {
            let note = Text::new(label, (step, max_loss * 0.97), ("sans-serif", 14).into_font().color(&RED));
            chart.draw_series(std::iter::once(note)).map_err(|e| fail(&e))?;
        }
    }
    // One line per evaluation set and metric: a correlation can be below 0.
    let lines = eval_lines(&evals);
    let lowest = lines.iter().flat_map(|(_, points)| points).map(|p| p.1).fold(0.5f64, f64::min);
    let floor = (lowest * 10.0).floor() / 10.0;
    let mut chart = panel(&right, "evaluation", max_step, floor..1.0, text).map_err(|e| fail(&e))?;
    for ((name, points), colour) in lines.iter().zip(COLOURS.iter().cycle()) {
        let series =
            chart.draw_series(LineSeries::new(points.iter().copied(), colour).point_size(4)).map_err(|e| fail(&e))?;
        series.label(name.as_str()).legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], colour));
    }
    if text && !lines.is_empty() {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(|e| fail(&e))?;
    }
    root.present().map_err(|e| fail(&e))?;
    Ok(())
}

/// The evaluation lines to draw: `<split> <metric>` and its points by step, the splits in the
/// order they were first scored, each split's metrics in [`crate::metrics::Scores::metrics`]'
/// order.
fn eval_lines(evals: &[&EvalRecord]) -> Vec<(String, Vec<(u64, f64)>)> {
    let mut lines: Vec<(String, Vec<(u64, f64)>)> = Vec::new();
    for e in evals {
        for (metric, value) in e.scores.metrics() {
            let name = format!("{} {metric}", e.split);
            match lines.iter_mut().find(|(n, _)| *n == name) {
                Some((_, points)) => points.push((e.step, value)),
                None => lines.push((name, vec![(e.step, value)])),
            }
        }
    }
    lines
}

/// Where the nodes changed, and how: ` -2 -> 3 nodes` at the step the node with id 2 was lost,
/// ` +2 -> 4 nodes` where it was taken in again.
fn membership_marks(records: &[Record]) -> Vec<(u64, String)> {
    records
        .iter()
        .filter_map(|r| match r {
            Record::Membership(m) => {
                let change: Vec<String> = m
                    .left
                    .iter()
                    .map(|id| format!("-{id}"))
                    .chain(m.joined.iter().map(|id| format!("+{id}")))
                    .collect();
                Some((m.step, format!(" {} -> {} nodes", change.join(" "), m.nodes.len())))
            }
            _ => None,
        })
        .collect()
}

/// The colours of the metric lines, taken in turn.
const COLOURS: [RGBColor; 6] = [BLUE, RED, GREEN, MAGENTA, CYAN, BLACK];

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{MembershipRecord, Scores};

    fn eval(step: u64, split: &str, accuracy: f64) -> EvalRecord {
        let scores = Scores { loss: 0.5, accuracy: Some(accuracy), ..Scores::default() };
        EvalRecord { step, epoch: 1, split: split.into(), scores, elapsed_s: 0.0, trained_examples: None }
    }

    #[test]
    fn every_evaluation_set_has_its_own_lines() {
        let records =
            [eval(10, "dev", 0.7), eval(10, "dev_mismatched", 0.6), eval(20, "dev", 0.8), eval(20, "test", 0.75)];
        let refs: Vec<&EvalRecord> = records.iter().collect();
        let lines = eval_lines(&refs);
        let names: Vec<&str> = lines.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["dev accuracy", "dev_mismatched accuracy", "test accuracy"]);
        assert_eq!(lines[0].1, [(10, 0.7), (20, 0.8)]);
        let dir = tempfile::tempdir().expect("dir");
        let mut all: Vec<Record> = records.into_iter().map(Record::Eval).collect();
        all.push(Record::Membership(MembershipRecord {
            step: 12,
            left: vec![2],
            joined: vec![],
            nodes: vec![0, 1, 3],
            recovery_s: 5.0,
            elapsed_s: 30.0,
        }));
        assert_eq!(membership_marks(&all), [(12, " -2 -> 3 nodes".to_string())]);
        plot(&dir.path().join("training.png"), &all, "4 nodes, batch 32").expect("plot");
        assert!(dir.path().join("training.png").exists());
    }
}
