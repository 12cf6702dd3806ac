//! The curve's tables: the measured points, and the floors beside the synced runs.

use crate::curve::settings::{CurveArgs, CurveModel};
use crate::curve::timing::{baseline, Floor, Point};
use crate::scaling::Batching;

/// The measured points as a markdown table, with what they were measured on.
pub(crate) fn print_table(args: &CurveArgs, share: f64, points: &[Point]) {
    let settings = std::iter::once(format!("--wire {}", args.wire)).chain(args.train_args.iter().cloned());
    let settings = settings.collect::<Vec<_>>().join(" ");
    println!(
        "\nScaling on {} emulated nodes ({share} cores each), MRPC, 1 thread per node, sync behind the backward pass, {settings}; \
         speedup in samples/s over one node of the same share{}:",
        args.emulate,
        if args.minilm_epoch && args.models.contains(&CurveModel::Minilm) {
            ", MiniLM's over one whole epoch of MRPC a run (its pairs a second: 3,668 over the epoch's time)"
        } else {
            ""
        }
    );
    println!(
        "| model | batch | nodes | samples/s | speedup | efficiency | step s | forward+backward s | exposed sync s | sync in all s | MB per ring pass | rank 0's padded tokens a step | speedup in padded tokens |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for p in points {
        let base = baseline(points, p.model);
        let speedup = p.samples_per_s() / base.map_or(f64::NAN, Point::samples_per_s);
        let token_speedup = p.padded_tokens_per_s() / base.map_or(f64::NAN, Point::padded_tokens_per_s);
        let phases = p.phases();
        let batch = match (p.nodes, p.batching) {
            (1, _) => format!("{}", args.batch),
            (_, Batching::PerNode) => format!("{} per node", args.batch),
            (_, Batching::Global) => format!("{} global", args.batch),
        };
        println!(
            "| {} | {batch} | {} | {:.2} | {speedup:.2}x | {:.0}% | {:.3} | {:.3} | {:.3} | {:.3} | {:.1} | {:.0} | {token_speedup:.2}x |",
            p.model.name(),
            p.nodes,
            p.samples_per_s(),
            100.0 * speedup / p.nodes as f64,
            phases.step,
            phases.forward_backward,
            phases.sync,
            phases.sync_total,
            phases.sync_mb,
            phases.padded_tokens
        );
    }
    for p in points.iter().filter(|p| p.runs.len() > 1) {
        let runs: Vec<String> = p.runs.iter().map(|r| format!("{:.2}", p.rate(r.step))).collect();
        println!(
            "\n{} on one node, before and after the synced runs: {} samples/s; the row above is their mean step, and \
             every speedup divides by it.",
            p.model.name(),
            runs.join(" and ")
        );
    }
}

/// The floors beside the synced runs: the speedup a sync that cost nothing would give, and one
/// node's rate under the same load.
pub(crate) fn print_floors(args: &CurveArgs, points: &[Point], floors: &[Floor]) {
    if floors.is_empty() {
        return;
    }
    println!(
        "\nThe floor: the same nodes each training alone side by side ({} per node, each its own order of the data), \
         nothing synced; a synced step cannot be shorter than the slowest of them:",
        args.batch
    );
    println!("| model | nodes | slowest step s | speedup at the floor | synced speedup | of the floor | mean step alone s | synced speedup over one node under that load |");
    println!("|---|---|---|---|---|---|---|---|");
    for f in floors {
        let Some(base) = baseline(points, f.model) else { continue };
        let synced =
            points.iter().find(|p| p.model == f.model && p.nodes == f.nodes && p.batching == Batching::PerNode);
        let Some(synced) = synced else { continue };
        let nodes = f.nodes as f64;
        let at_floor = nodes * base.phases().step / f.slowest_step;
        let speedup = synced.samples_per_s() / base.samples_per_s();
        let loaded = nodes * f.mean_step / synced.phases().step;
        println!(
            "| {} | {} | {:.3} | {at_floor:.2}x | {speedup:.2}x | {:.0}% | {:.3} | {loaded:.2}x |",
            f.model.name(),
            f.nodes,
            f.slowest_step,
            100.0 * speedup / at_floor,
            f.mean_step
        );
    }
}
