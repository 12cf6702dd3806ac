//! The runs to accuracy as a table: each tool's node counts over their seeds, each beside its
//! own one node (the wall, the time to its accuracy), ringtune beside the peer at each node
//! count, and where the steps' time went.

use std::path::Path;

use anyhow::{Context, Result};
use serde::Serialize;

/// How far below one node's mean accuracy and F1 (in points) a node count may end, and the
/// most of one node's wall it may take: the goal for ringtune's nodes beside its one node.
const WITHIN_POINTS: f64 = 0.5;
const OF_THE_WALL: f64 = 0.36;

/// The most of the peer's wall ringtune may take at the same node count, at the peer's accuracy
/// or better.
const OF_THE_PEERS_WALL: f64 = 0.33;

/// The tool a run trained with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub(crate) enum Tool {
    #[serde(rename = "ringtune")]
    Ringtune,
    #[serde(rename = "PyTorch DDP")]
    PytorchDdp,
}

impl Tool {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Tool::Ringtune => "ringtune",
            Tool::PytorchDdp => "PyTorch DDP",
        }
    }
}

/// One run: its recipe and scores.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Run {
    pub(crate) tool: Tool,
    pub(crate) nodes: usize,
    pub(crate) recipe: String,
    pub(crate) wall_s: f64,
    pub(crate) accuracy: f64,
    pub(crate) f1: f64,
    /// (seconds since the start, dev accuracy) at each evaluation.
    pub(crate) evaluations: Vec<(f64, f64)>,
    /// The mean step's parts in seconds, as the tool splits it (none where it gave none).
    pub(crate) step: Vec<(String, f64)>,
}

/// A run's `summary.json` in `out` (either tool writes one) and the scores every run has in it:
/// the wall, dev accuracy and F1; an error naming the file where one is missing.
pub(crate) fn read_summary(out: &Path) -> Result<(serde_json::Value, (f64, f64, f64))> {
    let path = out.join("summary.json");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let summary: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("reading {}", path.display()))?;
    let number = |value: &serde_json::Value, name: &str| {
        value.as_f64().with_context(|| format!("{}: no {name}", path.display()))
    };
    let scores = (
        number(&summary["wall_s"], "wall_s")?,
        number(&summary["dev"]["accuracy"], "dev accuracy")?,
        number(&summary["dev"]["f1"], "dev F1")?,
    );
    Ok((summary, scores))
}

/// One tool's node count over its seeds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Row {
    pub(crate) tool: Tool,
    pub(crate) nodes: usize,
    recipe: String,
    pub(crate) wall_s: f64,
    wall_range: (f64, f64),
    /// The mean wall over the same tool's one node's (`NaN` without one node's row).
    pub(crate) of_one_node: f64,
    pub(crate) accuracy: f64,
    pub(crate) f1: f64,
    accuracies: Vec<f64>,
    /// Each seed's wall at its first evaluation at or above its tool's one node's mean accuracy
    /// (`None`: never).
    reached: Vec<Option<f64>>,
    /// The tool's one node's mean wall over the mean of `reached`, where every seed reached it.
    speedup_to_accuracy: Option<f64>,
    /// The mean step's parts over the seeds.
    step: Vec<(String, f64)>,
}

/// The rows, in the order the runs first name each tool and node count.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Report {
    pub(crate) rows: Vec<Row>,
}

fn mean(values: impl Iterator<Item = f64>) -> f64 {
    let (sum, n) = values.fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
    if n == 0 {
        f64::NAN
    } else {
        sum / n as f64
    }
}

impl Report {
    pub(crate) fn of(runs: &[Run]) -> Report {
        let mut keys: Vec<(Tool, usize)> = Vec::new();
        for run in runs {
            if !keys.contains(&(run.tool, run.nodes)) {
                keys.push((run.tool, run.nodes));
            }
        }
        let rows = keys
            .into_iter()
            .map(|(tool, nodes)| {
                let of: Vec<&Run> = runs.iter().filter(|r| r.tool == tool && r.nodes == nodes).collect();
                let one: Vec<&Run> = runs.iter().filter(|r| r.tool == tool && r.nodes == 1).collect();
                let (one_wall, one_accuracy) =
                    (mean(one.iter().map(|r| r.wall_s)), mean(one.iter().map(|r| r.accuracy)));
                let walls = of.iter().map(|r| r.wall_s);
                let wall_range = (walls.clone().fold(f64::INFINITY, f64::min), walls.fold(0.0, f64::max));
                let reached: Vec<Option<f64>> = of
                    .iter()
                    .map(|r| r.evaluations.iter().find(|(_, a)| *a >= one_accuracy - 1e-12).map(|(t, _)| *t))
                    .collect();
                let speedup_to_accuracy = reached
                    .iter()
                    .copied()
                    .collect::<Option<Vec<f64>>>()
                    .filter(|times| !times.is_empty() && !one.is_empty())
                    .map(|times| one_wall / mean(times.into_iter()));
                let wall_s = mean(of.iter().map(|r| r.wall_s));
                Row {
                    tool,
                    nodes,
                    recipe: of[0].recipe.clone(),
                    wall_s,
                    wall_range,
                    of_one_node: wall_s / one_wall,
                    accuracy: mean(of.iter().map(|r| r.accuracy)),
                    f1: mean(of.iter().map(|r| r.f1)),
                    accuracies: of.iter().map(|r| r.accuracy).collect(),
                    reached,
                    speedup_to_accuracy,
                    step: mean_step(&of),
                }
            })
            .collect();
        Report { rows }
    }

    fn row(&self, tool: Tool, nodes: usize) -> Option<&Row> {
        self.rows.iter().find(|r| r.tool == tool && r.nodes == nodes)
    }

    /// The table, then the verdicts: ringtune's nodes beside its one node, ringtune beside the
    /// peer at each node count both ran, and the mean step's parts.
    pub(crate) fn markdown(&self) -> String {
        let mut out = String::from(
            "| tool | nodes | recipe | wall s | wall range s | of its one node's wall | dev accuracy | dev F1 | accuracy per seed | its one node's accuracy reached at s | speedup to its one node's accuracy |\n\
             |---|---|---|---|---|---|---|---|---|---|---|\n",
        );
        for row in &self.rows {
            let per_seed = row.accuracies.iter().map(|a| format!("{a:.4}")).collect::<Vec<_>>().join(" / ");
            let reached = row
                .reached
                .iter()
                .map(|t| t.map_or("never".to_string(), |t| format!("{t:.0}")))
                .collect::<Vec<_>>()
                .join(" / ");
            let speedup = row.speedup_to_accuracy.map_or("-".to_string(), |s| format!("{s:.2}x"));
            out.push_str(&format!(
                "| {} | {} | {} | {:.0} | {:.0}-{:.0} | {:.2} | {:.4} | {:.4} | {per_seed} | {reached} | {speedup} |\n",
                row.tool.label(),
                row.nodes,
                row.recipe,
                row.wall_s,
                row.wall_range.0,
                row.wall_range.1,
                row.of_one_node,
                row.accuracy,
                row.f1
            ));
        }
        out.push('\n');
        if let Some(one) = self.row(Tool::Ringtune, 1) {
            for row in self.rows.iter().filter(|r| r.tool == Tool::Ringtune && r.nodes > 1) {
                let (accuracy, f1) = (100.0 * (row.accuracy - one.accuracy), 100.0 * (row.f1 - one.f1));
                let shortfalls = [
                    ("of the wall over", row.of_one_node - OF_THE_WALL),
                    ("points of accuracy short", -WITHIN_POINTS - accuracy),
                    ("points of F1 short", -WITHIN_POINTS - f1),
                ];
                out.push_str(&format!(
                    "\nringtune on {} nodes: dev accuracy {accuracy:+.2} points, F1 {f1:+.2} from its one node's, in {:.2} of its wall time: {}",
                    row.nodes,
                    row.of_one_node,
                    verdict(&shortfalls),
                ));
                out.push_str(&format!(" (within {WITHIN_POINTS} points in at most {OF_THE_WALL} of the wall)"));
            }
        }
        for row in self.rows.iter().filter(|r| r.tool == Tool::Ringtune && r.nodes > 1) {
            let Some(peer) = self.row(Tool::PytorchDdp, row.nodes) else { continue };
            let (accuracy, f1) = (100.0 * (row.accuracy - peer.accuracy), 100.0 * (row.f1 - peer.f1));
            let ratio = row.wall_s / peer.wall_s;
            let shortfalls = [("of its wall over", ratio - OF_THE_PEERS_WALL), ("points of accuracy short", -accuracy)];
            out.push_str(&format!(
                "\n{} nodes: ringtune's wall {ratio:.2} of PyTorch DDP's, dev accuracy {accuracy:+.2} points, F1 {f1:+.2} from its: {} (at most {OF_THE_PEERS_WALL} of its wall at its accuracy or better)",
                row.nodes,
                verdict(&shortfalls),
            ));
        }
        for row in self.rows.iter().filter(|r| !r.step.is_empty()) {
            let parts = row.step.iter().map(|(name, s)| format!("{name} {s:.3}")).collect::<Vec<_>>().join(", ");
            let total: f64 = row.step.iter().map(|(_, s)| s).sum();
            out.push_str(&format!(
                "\n{} on {} nodes, the mean step {total:.3} s: {parts}",
                row.tool.label(),
                row.nodes
            ));
        }
        out.push('\n');
        out
    }
}

/// "the goal met", or "the goal missed" and by how much: each (what, amount) past its bound by
/// a positive amount.
fn verdict(shortfalls: &[(&str, f64)]) -> String {
    let missed: Vec<String> =
        shortfalls.iter().filter(|(_, by)| *by > 1e-9).map(|(what, by)| format!("{by:.2} {what}")).collect();
    if missed.is_empty() {
        "the goal met".to_string()
    } else {
        format!("the goal missed by {}", missed.join(", "))
    }
}

/// The mean over `runs` of each part of their steps, in the order the first run names them.
fn mean_step(runs: &[&Run]) -> Vec<(String, f64)> {
    let Some(first) = runs.first() else { return Vec::new() };
    first
        .step
        .iter()
        .map(|(name, _)| {
            let of = runs.iter().filter_map(|r| r.step.iter().find(|(n, _)| n == name).map(|(_, s)| *s));
            (name.clone(), mean(of))
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn run(tool: Tool, nodes: usize, wall_s: f64, accuracy: f64, evaluations: Vec<(f64, f64)>) -> Run {
        let step = vec![("forward and backward".to_string(), wall_s / 1000.0), ("optimizer".to_string(), 0.01)];
        Run { tool, nodes, recipe: "batch 32".into(), wall_s, accuracy, f1: accuracy + 0.05, evaluations, step }
    }

    #[test]
    fn rows_average_each_node_count_over_its_seeds_and_find_when_one_nodes_accuracy_was_reached() {
        let ours = Tool::Ringtune;
        let runs = [
            run(ours, 1, 900.0, 0.80, vec![(300.0, 0.70), (600.0, 0.78), (900.0, 0.80)]),
            run(ours, 1, 940.0, 0.82, vec![(310.0, 0.75), (620.0, 0.81), (940.0, 0.82)]),
            run(ours, 4, 300.0, 0.79, vec![(100.0, 0.72), (200.0, 0.79), (300.0, 0.79)]),
            run(ours, 4, 320.0, 0.812, vec![(110.0, 0.72), (210.0, 0.811), (320.0, 0.812)]),
        ];
        let report = Report::of(&runs);
        let (one, four) = (&report.rows[0], &report.rows[1]);
        assert_eq!((one.nodes, four.nodes), (1, 4));
        assert!((one.wall_s - 920.0).abs() < 1e-9 && (four.wall_s - 310.0).abs() < 1e-9);
        assert_eq!(four.wall_range, (300.0, 320.0));
        assert!((four.of_one_node - 310.0 / 920.0).abs() < 1e-12);
        assert!((one.accuracy - 0.81).abs() < 1e-12 && (four.f1 - 0.851).abs() < 1e-12);
        assert_eq!(four.accuracies, [0.79, 0.812]);
        // One node's mean is 0.81: the first 4-node seed never reaches it, the second at 210 s.
        assert_eq!(four.reached, [None, Some(210.0)]);
        assert_eq!(one.reached, [None, Some(620.0)]);
        assert_eq!(four.speedup_to_accuracy, None, "a seed never reached it");
        let table = report.markdown();
        assert!(table.contains("| tool | nodes | recipe | wall s | wall range s |"), "{table}");
        assert!(table.contains("| ringtune | 4 | batch 32 | 310 | 300-320 | 0.34 |"), "{table}");
        // 0.801 against 0.81: 0.9 points short, in 0.34 of the wall.
        assert!(
            table.contains("ringtune on 4 nodes: dev accuracy -0.90 points")
                && table.contains("the goal missed by 0.40 points of accuracy short, 0.40 points of F1 short"),
            "{table}"
        );
        let close =
            [runs[0].clone(), runs[1].clone(), run(ours, 4, 300.0, 0.806, vec![]), run(ours, 4, 300.0, 0.81, vec![])];
        let table = Report::of(&close).markdown();
        assert!(table.contains("in 0.33 of its wall time: the goal met"), "{table}");
    }

    #[test]
    fn each_tool_is_measured_against_its_own_one_node_and_ringtune_against_the_peer() {
        let (ours, peer) = (Tool::Ringtune, Tool::PytorchDdp);
        let runs = [
            run(ours, 1, 800.0, 0.80, vec![(800.0, 0.80)]),
            run(peer, 1, 2000.0, 0.82, vec![(700.0, 0.80), (2000.0, 0.82)]),
            run(ours, 4, 280.0, 0.80, vec![(100.0, 0.79), (200.0, 0.80)]),
            run(peer, 4, 1000.0, 0.79, vec![(400.0, 0.80), (1000.0, 0.79)]),
            run(ours, 4, 300.0, 0.81, vec![(220.0, 0.80)]),
            run(peer, 4, 900.0, 0.83, vec![(500.0, 0.82), (900.0, 0.83)]),
        ];
        let report = Report::of(&runs);
        let tools: Vec<(Tool, usize)> = report.rows.iter().map(|r| (r.tool, r.nodes)).collect();
        assert_eq!(tools, [(ours, 1), (peer, 1), (ours, 4), (peer, 4)]);
        let (ours_4, peer_4) = (&report.rows[2], &report.rows[3]);
        assert!((ours_4.of_one_node - 290.0 / 800.0).abs() < 1e-12);
        assert!((peer_4.of_one_node - 950.0 / 2000.0).abs() < 1e-12, "the peer's own one node");
        // PyTorch's one node ended at 0.82: its 4 nodes reached it at 500 s, once.
        assert_eq!(peer_4.reached, [None, Some(500.0)]);
        assert_eq!(peer_4.speedup_to_accuracy, None);
        // Ours reached 0.80 at 200 and 220 s: 800 / 210.
        assert!((ours_4.speedup_to_accuracy.expect("both seeds reached it") - 800.0 / 210.0).abs() < 1e-9);
        let table = report.markdown();
        assert!(table.contains("| PyTorch DDP | 4 | batch 32 | 950 |"), "{table}");
        assert!(table.contains("| 3.81x |"), "{table}");
        // 290 s against 950 s, 0.805 against 0.81.
        assert!(
            table.contains("4 nodes: ringtune's wall 0.31 of PyTorch DDP's, dev accuracy -0.50 points")
                && table.contains("from its: the goal missed by 0.50 points of accuracy short (at most 0.33"),
            "{table}"
        );
        assert!(table.contains("PyTorch DDP on 4 nodes, the mean step 0.960 s: forward and backward 0.950"), "{table}");
        let json = serde_json::to_value(&report).expect("json");
        assert_eq!(json["rows"][1]["tool"], "PyTorch DDP");
    }
}
