//! The runs to accuracy as a table: each tool's node counts over their seeds, each beside its
//! own one node (the wall, the time to its accuracy), ringtune beside the peer at each node
//! count, and where the steps' time went.

use std::path::Path;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::stats::{mean, paired, welch, Interval};

/// How far below one node's mean accuracy and F1 (in points) a node count may end, and the
/// most of one node's wall it may take: the goal for ringtune's nodes beside its one node.
const WITHIN_POINTS: f64 = 0.5;
const OF_THE_WALL: f64 = 0.36;

/// The most of the peer's wall ringtune may take at the same node count, at the peer's accuracy
/// or better.
const OF_THE_PEERS_WALL: f64 = 0.33;

/// The tool a run trained with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Run {
    pub(crate) tool: Tool,
    pub(crate) nodes: usize,
    /// The seed it trained with: the same seed at another node count is its pair.
    pub(crate) seed: usize,
    pub(crate) recipe: String,
    pub(crate) wall_s: f64,
    pub(crate) accuracy: f64,
    pub(crate) f1: f64,
    /// Mean cross-entropy on dev (NaN where the summary has none; JSON writes it `null`).
    #[serde(deserialize_with = "nan_if_null")]
    pub(crate) loss: f64,
    /// (seconds since the start, dev accuracy) at each evaluation.
    pub(crate) evaluations: Vec<(f64, f64)>,
    /// The mean step's parts in seconds, as the tool splits it (none where it gave none).
    pub(crate) step: Vec<(String, f64)>,
}

fn nan_if_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

/// The runs of earlier invocations' tables (`runs` in their JSON), one list; a run (tool, node
/// count, seed) found twice is an error naming both files.
pub(crate) fn read_runs(files: &[std::path::PathBuf]) -> Result<Vec<Run>> {
    let mut runs: Vec<(Run, &Path)> = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
        #[derive(Deserialize)]
        struct Table {
            runs: Vec<Run>,
        }
        let table: Table = serde_json::from_str(&text)
            .with_context(|| format!("{}: not a table of runs (the JSON beside --accuracy-out)", file.display()))?;
        for run in table.runs {
            let same = |(r, _): &&(Run, &Path)| (r.tool, r.nodes, r.seed) == (run.tool, run.nodes, run.seed);
            if let Some((_, first)) = runs.iter().find(same) {
                anyhow::bail!(
                    "{} on {} nodes, seed {}, is in {} and in {}: combine each run once",
                    run.tool.label(),
                    run.nodes,
                    run.seed,
                    first.display(),
                    file.display()
                );
            }
            runs.push((run, file));
        }
    }
    Ok(runs.into_iter().map(|(run, _)| run).collect())
}

/// What every run's summary gives: the wall and the final dev scores.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Final {
    pub(crate) wall_s: f64,
    pub(crate) accuracy: f64,
    pub(crate) f1: f64,
    /// NaN where the summary has no dev loss.
    pub(crate) loss: f64,
}

/// A run's `summary.json` in `out` (either tool writes one) and the scores every run has in it:
/// the wall, dev accuracy and F1 (an error naming the file where one is missing) and dev loss.
pub(crate) fn read_summary(out: &Path) -> Result<(serde_json::Value, Final)> {
    let path = out.join("summary.json");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let summary: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("reading {}", path.display()))?;
    let number = |value: &serde_json::Value, name: &str| {
        value.as_f64().with_context(|| format!("{}: no {name}", path.display()))
    };
    let scores = Final {
        wall_s: number(&summary["wall_s"], "wall_s")?,
        accuracy: number(&summary["dev"]["accuracy"], "dev accuracy")?,
        f1: number(&summary["dev"]["f1"], "dev F1")?,
        loss: summary["dev"]["loss"].as_f64().unwrap_or(f64::NAN),
    };
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

/// The rows, in the order the runs first name each tool and node count, and the differences
/// with their intervals.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Report {
    pub(crate) rows: Vec<Row>,
    pub(crate) comparisons: Vec<Comparison>,
    /// The walls are a speed figure (one invocation on the emulated cluster), so the goals on
    /// them are judged; not for processes sharing this machine's cores, or several invocations.
    pub(crate) walls_compare: bool,
}

/// Two groups of runs compared metric by metric: ringtune's one node against more, paired by
/// seed; or the two tools at one node count, unpaired (their seeds mean different things).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Comparison {
    /// What the two columns are.
    pub(crate) columns: (String, String),
    /// Paired by seed, or Welch's unpaired interval.
    pub(crate) paired: bool,
    /// The seeds on each side (paired: the seeds both have).
    pub(crate) seeds: (Vec<usize>, Vec<usize>),
    pub(crate) metrics: Vec<MetricDifference>,
}

/// One metric's means on the two sides and the difference (second minus first) with its 95%
/// interval (`None` under two seeds).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct MetricDifference {
    pub(crate) metric: &'static str,
    pub(crate) means: (f64, f64),
    pub(crate) difference: Option<Interval>,
}

/// A metric's name and how a run gives it.
type Metric = (&'static str, fn(&Run) -> f64);

/// The metrics compared.
const METRICS: [Metric; 3] = [("dev accuracy", |r| r.accuracy), ("dev F1", |r| r.f1), ("dev loss", |r| r.loss)];

impl Comparison {
    /// ringtune's one node against `nodes` nodes, over the seeds both ran.
    fn paired(runs: &[Run], nodes: usize) -> Comparison {
        let of = |n: usize| runs.iter().filter(move |r| r.tool == Tool::Ringtune && r.nodes == n);
        let pairs: Vec<(&Run, &Run)> =
            of(1).filter_map(|one| of(nodes).find(|r| r.seed == one.seed).map(|more| (one, more))).collect();
        let metrics = METRICS
            .iter()
            .map(|(metric, value)| {
                let (first, second): (Vec<f64>, Vec<f64>) = pairs.iter().map(|(a, b)| (value(a), value(b))).unzip();
                MetricDifference {
                    metric,
                    means: (mean(first.iter().copied()), mean(second.iter().copied())),
                    difference: paired(&first, &second),
                }
            })
            .collect();
        let seeds: Vec<usize> = pairs.iter().map(|(one, _)| one.seed).collect();
        Comparison {
            columns: ("1 node".into(), format!("{nodes} nodes")),
            paired: true,
            seeds: (seeds.clone(), seeds),
            metrics,
        }
    }

    /// The peer against ringtune at `nodes` nodes, each over all its seeds.
    fn between_tools(runs: &[Run], nodes: usize) -> Comparison {
        let of = |tool: Tool| runs.iter().filter(move |r| r.tool == tool && r.nodes == nodes);
        let metrics = METRICS
            .iter()
            .map(|(metric, value)| {
                let first: Vec<f64> = of(Tool::PytorchDdp).map(value).collect();
                let second: Vec<f64> = of(Tool::Ringtune).map(value).collect();
                MetricDifference {
                    metric,
                    means: (mean(first.iter().copied()), mean(second.iter().copied())),
                    difference: welch(&first, &second),
                }
            })
            .collect();
        let seeds = (of(Tool::PytorchDdp).map(|r| r.seed).collect(), of(Tool::Ringtune).map(|r| r.seed).collect());
        let label = |tool: Tool| format!("{} on {nodes} node{}", tool.label(), if nodes == 1 { "" } else { "s" });
        Comparison { columns: (label(Tool::PytorchDdp), label(Tool::Ringtune)), paired: false, seeds, metrics }
    }

    /// The table: `| metric | first | second | paired difference | 95% interval |`, then which
    /// differences are inside the noise.
    pub(crate) fn markdown(&self) -> String {
        let kind = if self.paired { "paired difference" } else { "difference (Welch)" };
        let mut out = format!(
            "| metric | {} | {} | {kind} | 95% interval |\n|---|---|---|---|---|\n",
            self.columns.0, self.columns.1
        );
        for m in &self.metrics {
            let (difference, interval) = match m.difference {
                Some(d) => (format!("{:+.4}", d.estimate), format!("[{:.4}, {:.4}]", d.low, d.high)),
                None => ("-".to_string(), "- (under two seeds)".to_string()),
            };
            out.push_str(&format!(
                "| {} | {:.4} | {:.4} | {difference} | {interval} |\n",
                m.metric, m.means.0, m.means.1
            ));
        }
        let inside: Vec<&str> =
            self.metrics.iter().filter(|m| m.difference.is_some_and(|d| d.holds_zero())).map(|m| m.metric).collect();
        let seeds = |s: &[usize]| s.len();
        out.push_str(&format!(
            "\n{} against {}, {}: {}\n",
            self.columns.1,
            self.columns.0,
            if self.paired {
                format!("{} seeds paired", seeds(&self.seeds.0))
            } else {
                format!("{} and {} seeds", seeds(&self.seeds.1), seeds(&self.seeds.0))
            },
            if inside.is_empty() {
                "no interval holds zero".to_string()
            } else {
                format!("inside the noise (the interval holds zero): {}", inside.join(", "))
            }
        ));
        out
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
                    .map(|times| one_wall / mean(times));
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
        let mut larger: Vec<usize> =
            runs.iter().filter(|r| r.tool == Tool::Ringtune && r.nodes > 1).map(|r| r.nodes).collect();
        larger.sort_unstable();
        larger.dedup();
        let has = |tool: Tool, nodes: usize| runs.iter().any(|r| r.tool == tool && r.nodes == nodes);
        let mut comparisons: Vec<Comparison> = match has(Tool::Ringtune, 1) {
            true => larger.iter().map(|&n| Comparison::paired(runs, n)).collect(),
            false => Vec::new(),
        };
        let mut counts: Vec<usize> = runs.iter().map(|r| r.nodes).collect();
        counts.sort_unstable();
        counts.dedup();
        comparisons.extend(
            counts
                .into_iter()
                .filter(|&n| has(Tool::Ringtune, n) && has(Tool::PytorchDdp, n))
                .map(|n| Comparison::between_tools(runs, n)),
        );
        Report { rows, comparisons, walls_compare: true }
    }

    /// The same runs' accuracy alone: their walls are no speed figure (see `walls_compare`).
    pub(crate) fn accuracy_alone(self) -> Report {
        Report { walls_compare: false, ..self }
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
        if !self.walls_compare {
            out.push_str("\nThe walls are of processes sharing this machine's cores, or of several invocations: no speed figure.");
        }
        if let Some(one) = self.row(Tool::Ringtune, 1).filter(|_| self.walls_compare) {
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
        for row in self.rows.iter().filter(|r| r.tool == Tool::Ringtune && r.nodes > 1 && self.walls_compare) {
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
        for comparison in &self.comparisons {
            out.push_str("\n\n");
            out.push_str(&comparison.markdown());
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
        let (recipe, f1, loss) = ("batch 32".to_string(), accuracy + 0.05, 1.0 - accuracy);
        Run { tool, nodes, seed: 0, recipe, wall_s, accuracy, f1, loss, evaluations, step }
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

    #[test]
    fn one_node_and_more_are_paired_by_seed_and_the_tools_compared_unpaired() {
        let (ours, peer) = (Tool::Ringtune, Tool::PytorchDdp);
        let seeded = |tool, nodes, seed, accuracy| Run { seed, ..run(tool, nodes, 100.0, accuracy, vec![]) };
        let runs = [
            seeded(ours, 1, 0, 0.80),
            seeded(ours, 1, 1, 0.82),
            seeded(ours, 1, 2, 0.81),
            // In another order, and seed 2 without a 4-node run: two pairs.
            seeded(ours, 4, 1, 0.83),
            seeded(ours, 4, 0, 0.80),
            seeded(peer, 4, 0, 0.79),
            seeded(peer, 4, 1, 0.81),
        ];
        let report = Report::of(&runs);
        assert_eq!(report.comparisons.len(), 2, "ours 1 against 4, and the tools at 4 nodes");
        let (within, between) = (&report.comparisons[0], &report.comparisons[1]);
        assert!(within.paired && !between.paired);
        assert_eq!(within.seeds.0, [0, 1]);
        // Differences 0 and 0.01 (scipy: ttest_1samp([0, 0.01], 0).confidence_interval()).
        let accuracy = within.metrics[0].difference.expect("two pairs");
        assert!((accuracy.estimate - 0.005).abs() < 1e-12);
        assert!(
            (accuracy.low + 0.05853102368087348).abs() < 1e-9 && (accuracy.high - 0.06853102368087348).abs() < 1e-9
        );
        // scipy: ttest_ind([0.83, 0.80], [0.79, 0.81], equal_var=False).confidence_interval()
        let tools = between.metrics[0].difference.expect("two a side");
        assert!((tools.low + 0.07467061768081333).abs() < 1e-8 && (tools.high - 0.10467061768081314).abs() < 1e-8);
        let table = report.markdown();
        for line in [
            "| metric | 1 node | 4 nodes | paired difference | 95% interval |",
            "| dev accuracy | 0.8100 | 0.8150 | +0.0050 | [-0.0585, 0.0685] |",
            "| dev loss | 0.1900 | 0.1850 | -0.0050 | [-0.0685, 0.0585] |",
            "| metric | PyTorch DDP on 4 nodes | ringtune on 4 nodes | difference (Welch) | 95% interval |",
            "4 nodes against 1 node, 2 seeds paired: inside the noise (the interval holds zero): dev accuracy, dev F1, dev loss",
        ] {
            assert!(table.contains(line), "{line}\n{table}");
        }
        let one_seed = Report::of(&[seeded(ours, 1, 0, 0.80), seeded(ours, 4, 0, 0.81)]);
        assert!(one_seed.markdown().contains("| dev accuracy | 0.8000 | 0.8100 | - | - (under two seeds) |"));
        // On loopback the walls are no speed figure: no goal is judged on them.
        assert!(table.contains("ringtune's wall") && table.contains("of its wall time"), "{table}");
        let loopback = report.accuracy_alone().markdown();
        assert!(!loopback.contains("ringtune's wall") && !loopback.contains("of its wall time"), "{loopback}");
        assert!(loopback.contains("no speed figure") && loopback.contains("| dev loss |"), "{loopback}");
    }
}
