//! The sync's protocol on the collective's in-memory ring, without sockets or sessions: each
//! rank is a thread that hands gradients over as a backward pass would, then steps the
//! optimizer through [`crate::optimizer::step`] as the loop does.

use std::time::{Duration, Instant};

use ringtune_collective::{memory_ring, BucketKind, BucketSizes, Collective, MemoryTransport, SyncPlan, Wire};
use ringtune_encoders::ParamLayout;
use ringtune_optim::{AdamW, AdamWConfig, Group};
use ringtune_runtime::{FlatBuffer, LendableBuffer};

use super::{GradSync, RingSync, SyncMode};
use crate::TrainError;

/// A table of 1000 rows of 8 (index 0, its bucket last), then dense tensors over several
/// buckets.
fn layout() -> ParamLayout {
    ParamLayout::new(vec![
        ("table".into(), vec![1000, 8]),
        ("a".into(), vec![300_000]),
        ("b".into(), vec![200_000]),
        ("c".into(), vec![70_001]),
    ])
}

/// Buckets small enough that a tensor spans several, tapering at the end.
fn plan(layout: &ParamLayout, world: usize) -> SyncPlan {
    let tensors: Vec<_> = layout.entries().iter().map(|e| e.range()).collect();
    let sizes = BucketSizes { first: 1 << 16, size: 1 << 18, last: 1 << 14, align: 16 };
    SyncPlan::new(&tensors, layout.total_len(), Some((0, 8)), world, sizes)
}

const WORLD: usize = 3;
const DEADLINE: Duration = Duration::from_secs(2);

/// Rank `rank`'s gradient of parameter `tensor`: the table only on the rows its tokens use.
fn grad(layout: &ParamLayout, rank: usize, tensor: usize) -> Vec<f32> {
    let entry = &layout.entries()[tensor];
    (0..entry.len())
        .map(|i| {
            if tensor == 0 && !tokens(rank).contains(&((i / 8) as i64)) {
                0.0
            } else {
                ((i * 7 + rank * 13 + tensor) % 97) as f32 / 97.0 - 0.5
            }
        })
        .collect()
}

fn tokens(rank: usize) -> Vec<i64> {
    vec![1, 5 + rank as i64, 900]
}

/// Every rank's sync over one in-memory ring, in a run that goes on with `min_nodes` (0: stops
/// at a loss).
fn nodes(mode: SyncMode, min_nodes: usize) -> Vec<RingSync<MemoryTransport>> {
    let layout = layout();
    memory_ring(WORLD, DEADLINE)
        .into_iter()
        .map(|t| RingSync::start(Collective::new(t), plan(&layout, WORLD), &layout, mode, min_nodes).expect("start"))
        .collect()
}

/// Runs `work` on every rank's thread; the results in rank order.
fn on_ranks<R: Send + 'static>(
    mode: SyncMode,
    work: impl Fn(usize, RingSync<MemoryTransport>) -> R + Send + Sync + Clone + 'static,
) -> Vec<R> {
    on_ranks_of(nodes(mode, 0), work)
}

/// Runs `work` on the thread of each of `syncs`; the results in rank order.
fn on_ranks_of<R: Send + 'static>(
    syncs: Vec<RingSync<MemoryTransport>>,
    work: impl Fn(usize, RingSync<MemoryTransport>) -> R + Send + Sync + Clone + 'static,
) -> Vec<R> {
    let handles: Vec<_> = syncs
        .into_iter()
        .enumerate()
        .map(|(rank, sync)| {
            let work = work.clone();
            std::thread::spawn(move || work(rank, sync))
        })
        .collect();
    handles.into_iter().map(|h| h.join().expect("no panic")).collect()
}

/// A backward pass's hand-over: parameters from the last, as `GradReady` sees them.
fn hand_over(sync: &RingSync<MemoryTransport>, rank: usize, tensors: impl Iterator<Item = usize>) {
    let sink = sync.hooks().grads.expect("a gradient sink");
    let layout = layout();
    for t in tensors {
        sink.take(t, &grad(&layout, rank, t)).expect("take");
    }
}

fn all_tensors() -> impl Iterator<Item = usize> {
    (0..layout().entries().len()).rev()
}

const PLAIN: SyncMode = SyncMode { wire: Wire::F32, overlap: true, shard_optimizer: false, low_rank: None };

#[test]
fn buckets_handed_over_mid_pass_reduce_to_every_ranks_mean() {
    let results = on_ranks(PLAIN, |rank, mut sync| {
        sync.begin(0, &tokens(rank), 1.0).expect("begin");
        hand_over(&sync, rank, all_tensors());
        let averaged = sync.finish(rank as f32).expect("reduced");
        let grads = sync.optimizer_view(&mut []).expect("every piece back").0.floats().expect("whole").to_vec();
        (averaged, grads)
    });
    let layout = layout();
    let plan = plan(&layout, WORLD);
    assert!(plan.buckets.len() > 2, "several buckets: {:?}", plan.buckets);
    let dense: usize = plan.buckets.iter().filter(|b| b.kind == BucketKind::Dense).map(|b| b.range.len()).sum();
    for (rank, (averaged, grads)) in results.iter().enumerate() {
        assert_eq!(averaged.loss, 1.0, "rank {rank}: the mean of the losses 0, 1, 2");
        // The table moves only the rows some rank used: 1, 5, 6, 7 and 900.
        assert_eq!(averaged.bytes, (dense + 5 * 8) * 4, "rank {rank}");
        assert!(grads.iter().zip(&results[0].1).all(|(a, b)| a.to_bits() == b.to_bits()), "rank {rank} differs");
    }
    for (t, entry) in layout.entries().iter().enumerate() {
        let each: Vec<Vec<f32>> = (0..WORLD).map(|r| grad(&layout, r, t)).collect();
        let mean: Vec<f32> = (0..entry.len()).map(|i| each.iter().map(|g| g[i]).sum::<f32>() / WORLD as f32).collect();
        let got = &results[0].1[entry.range()];
        let worst = got.iter().zip(&mean).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
        assert!(worst < 1e-6, "{}: off by {worst}", entry.name);
    }
}

#[test]
fn weighted_nodes_average_to_the_mean_over_their_rows() {
    // Ranks holding 2, 1 and 0 rows of a step of 3 (weights 2, 1 and 0): the mean over the rows
    // is rank 0's gradient twice and rank 1's once, over 3.
    let weights = [2.0f32, 1.0, 0.0];
    let results = on_ranks(PLAIN, move |rank, mut sync| {
        sync.begin(0, &tokens(rank), weights[rank]).expect("begin");
        hand_over(&sync, rank, all_tensors());
        let averaged = sync.finish(rank as f32 + 1.0).expect("reduced");
        let grads = sync.optimizer_view(&mut []).expect("every piece back").0.floats().expect("whole").to_vec();
        (averaged.loss, grads)
    });
    let layout = layout();
    for (rank, (loss, _)) in results.iter().enumerate() {
        assert!((loss - (2.0 * 1.0 + 2.0) / 3.0).abs() < 1e-6, "rank {rank}: the loss over the rows is {loss}");
    }
    for (t, entry) in layout.entries().iter().enumerate() {
        if entry.name.contains("word_embeddings") {
            continue;
        }
        let (g0, g1) = (grad(&layout, 0, t), grad(&layout, 1, t));
        let got = &results[0].1[entry.range()];
        let worst = (0..entry.len()).map(|i| (got[i] - (2.0 * g0[i] + g1[i]) / 3.0).abs()).fold(0.0, f32::max);
        assert!(worst < 1e-5, "{}: off by {worst}", entry.name);
    }
}

/// One optimizer step of every rank, through the loop's step; each rank's parameters after it.
fn step_all(mode: SyncMode) -> Vec<Vec<f32>> {
    step_all_of(nodes(mode, 0)).into_iter().map(|(params, _)| params).collect()
}

/// [`step_all`] over `syncs`: each rank's parameters, and its first moments where its optimizer
/// keeps them (zero elsewhere).
fn step_all_of(syncs: Vec<RingSync<MemoryTransport>>) -> Vec<(Vec<f32>, Vec<f32>)> {
    on_ranks_of(syncs, move |rank, mut sync| {
        let len = layout().total_len();
        let groups =
            [Group { range: 0..len / 2, weight_decay: 0.01 }, Group { range: len / 2..len, weight_decay: 0.0 }];
        let mut adam = AdamW::new(AdamWConfig::default(), &groups, len).expect("adam");
        if let Some(pieces) = sync.optimizer_pieces() {
            adam = adam.owning(pieces).expect("pieces");
        }
        let mut params = LendableBuffer::new(FlatBuffer::from_slice(&vec![0.25f32; len]));
        sync.begin(0, &tokens(rank), 1.0).expect("begin");
        hand_over(&sync, rank, all_tensors());
        sync.finish(0.0).expect("reduced");
        let (mut grads, exchange) = sync.optimizer_view(&mut []).expect("every piece back");
        // Clipped: the norm is far above 0.5.
        crate::optimizer::step(&mut adam, &mut params, grads.floats().expect("whole"), exchange, 0.5, 1e-2, 1)
            .expect("step");
        drop(grads);
        sync.settle().expect("gathered");
        let (mut m, mut v) = (vec![0.0; len], vec![0.0; len]);
        adam.place_moments(&mut m, &mut v);
        (params.floats().expect("handed back once settled").to_vec(), m)
    })
}

#[test]
fn a_sharded_step_gathered_at_once_or_behind_changes_no_bit() {
    let whole = step_all(PLAIN);
    let sharded = step_all(SyncMode { overlap: false, shard_optimizer: true, ..PLAIN });
    let behind = step_all(SyncMode { overlap: true, shard_optimizer: true, ..PLAIN });
    assert!(whole[0].iter().any(|&p| p != 0.25), "the step moved the parameters");
    // A run that may lose nodes steps each shard on two nodes: the same bits again.
    let kept_twice = step_all_of(nodes(SyncMode { overlap: true, shard_optimizer: true, ..PLAIN }, 2));
    let plan = plan(&layout(), WORLD);
    for (rank, (_, m)) in kept_twice.iter().enumerate() {
        let owner = &kept_twice[(rank + WORLD - 1) % WORLD].1;
        for piece in plan.shard_backup(rank) {
            assert!(m[piece.clone()].iter().any(|&x| x != 0.0), "rank {rank}: backup {piece:?} not stepped");
            let same = m[piece.clone()].iter().zip(&owner[piece.clone()]).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "rank {rank}: its backup {piece:?} differs from its owner's moments");
        }
    }
    let kept_twice: Vec<Vec<f32>> = kept_twice.into_iter().map(|(params, _)| params).collect();
    for (name, run) in [("sharded", &sharded), ("gathered behind", &behind), ("kept twice", &kept_twice)] {
        for (rank, params) in run.iter().enumerate() {
            let same = params.iter().zip(&whole[0]).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{name}, rank {rank}: other parameters than the unsharded step's");
        }
    }
}

#[test]
fn a_rank_that_abandons_its_step_stops_the_others_with_its_reason() {
    let started = Instant::now();
    let results = on_ranks(PLAIN, |rank, mut sync| {
        sync.begin(0, &tokens(rank), 1.0).expect("begin");
        if rank == 2 {
            sync.abandon("its forward or backward pass failed: out of memory");
            return None;
        }
        hand_over(&sync, rank, all_tensors());
        Some(sync.finish(0.0).expect_err("the step fails"))
    });
    for (rank, error) in results.into_iter().enumerate().take(2) {
        let error = error.expect("an error");
        assert!(matches!(error, TrainError::Ring(_)), "rank {rank}: {error:?}");
        let text = error.to_string();
        assert!(text.contains("rank 2") && text.contains("out of memory"), "rank {rank}: {text}");
    }
    // At once, by the abort's reason, not at the ring's deadline.
    assert!(started.elapsed() < DEADLINE, "took {:?}", started.elapsed());
}

#[test]
fn a_rank_lost_mid_backward_is_named_by_every_other() {
    let started = Instant::now();
    let results = on_ranks(PLAIN, |rank, mut sync| {
        sync.begin(0, &tokens(rank), 1.0).expect("begin");
        if rank == 1 {
            // Half its gradients, then its run is gone (the sync dropped mid-step).
            hand_over(&sync, rank, all_tensors().take(2));
            drop(sync);
            return None;
        }
        hand_over(&sync, rank, all_tensors());
        Some(sync.finish(0.0).expect_err("the step fails").to_string())
    });
    for rank in [0, 2] {
        let error = results[rank].clone().expect("an error");
        assert!(error.contains("rank 1"), "rank {rank}: {error}");
    }
    // At once, by the abort's reason, not at the ring's deadline.
    assert!(started.elapsed() < DEADLINE, "took {:?}", started.elapsed());
}

#[test]
fn parameters_that_diverged_are_named_by_rank() {
    let results = on_ranks(PLAIN, |rank, mut sync| {
        let params = if rank == 1 { [1.0f32; 4] } else { [0.0f32; 4] };
        sync.check_params(&params).map_err(|e| e.to_string())
    });
    // Each rank's verdict, or the first verdict to reach it (an abort outruns the gather):
    // either way rank 1 is the odd one out.
    for (rank, result) in results.iter().enumerate() {
        let error = result.as_ref().expect_err("every rank fails");
        let names_rank_1 =
            error.contains("ranks [1] hold") || error.contains("ranks [0, 2] hold other parameters than rank 1");
        assert!(error.contains("parameters diverged") && names_rank_1, "rank {rank}: {error}");
    }
}
