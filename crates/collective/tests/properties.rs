//! Property tests over the in-memory ring: for worlds 1 to 8 and lengths from 0 to millions
//! (primes included), every rank ends with the mean of all inputs, and all ranks agree bit for
//! bit.

use std::time::Duration;

use bytes::Bytes;
use proptest::prelude::*;
use ringtune_collective::{
    all_reduce_mean, all_reduce_rows, gather, memory_ring, ring, used_rows, BucketSizes, RingMode, Schedule, Transport,
    Wire,
};

fn inputs(world: usize, len: usize, seed: u64) -> Vec<Vec<f32>> {
    let mut state = seed | 1;
    (0..world)
        .map(|_| {
            (0..len)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
                })
                .collect()
        })
        .collect()
}

fn run(world: usize, data: Vec<Vec<f32>>, segment: usize) -> Vec<Vec<f32>> {
    let transports = memory_ring(world, Duration::from_secs(30));
    let handles: Vec<_> = transports
        .into_iter()
        .zip(data)
        .map(|(mut t, mut grads)| {
            std::thread::spawn(move || {
                all_reduce_mean(&mut t, 1, &mut grads, segment).expect("all-reduce");
                grads
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().expect("rank thread")).collect()
}

fn check(world: usize, len: usize, segment: usize, seed: u64) {
    let data = inputs(world, len, seed);
    let serial: Vec<f64> = (0..len).map(|i| data.iter().map(|d| d[i] as f64).sum::<f64>() / world as f64).collect();
    let results = run(world, data, segment);
    for (rank, r) in results.iter().enumerate() {
        assert_eq!(r.len(), len);
        assert!(r.iter().zip(&results[0]).all(|(a, b)| a.to_bits() == b.to_bits()), "rank {rank} differs from rank 0");
        for (i, (&got, &want)) in r.iter().zip(&serial).enumerate() {
            assert!((got as f64 - want).abs() <= 1e-6 * world as f64, "element {i}: {got} vs {want}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn every_rank_gets_the_mean_and_all_agree(world in 1usize..=8, len in 0usize..5000, segment in 1usize..700, seed: u64) {
        check(world, len, segment, seed);
    }
}

/// Runs `work` on every rank of an in-memory ring of `world`, each with its buffer of `data`.
fn on_ranks<T: Send + 'static>(
    data: Vec<Vec<f32>>,
    work: impl Fn(&mut ringtune_collective::MemoryTransport, &mut Vec<f32>) -> T + Send + Sync + Copy + 'static,
) -> Vec<(Vec<f32>, T)> {
    let handles: Vec<_> = memory_ring(data.len(), Duration::from_secs(30))
        .into_iter()
        .zip(data)
        .map(|(mut t, mut buffer)| {
            std::thread::spawn(move || {
                let out = work(&mut t, &mut buffer);
                (buffer, out)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().expect("rank thread")).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    /// bf16 on the wire: all ranks agree bit for bit, each value is within bf16's rounding of
    /// the exact mean (one rounding per hop), and the owner's mean is a bf16 value.
    #[test]
    fn bf16_wire_agrees_on_every_rank_and_stays_near_the_mean(
        world in 1usize..=6, len in 0usize..3000, segment in 1usize..500, seed: u64,
    ) {
        let data = inputs(world, len, seed);
        let exact: Vec<f64> = (0..len).map(|i| data.iter().map(|d| d[i] as f64).sum::<f64>() / world as f64).collect();
        let scale: Vec<f64> = (0..len).map(|i| data.iter().map(|d| d[i].abs() as f64).sum::<f64>()).collect();
        let results = on_ranks(data, move |t, b| ring(t, 4, b, segment, RingMode::AllReduceMean, Wire::Bf16).expect("bf16"));
        for (r, ()) in &results {
            prop_assert!(r.iter().zip(&results[0].0).all(|(a, b)| a.to_bits() == b.to_bits()));
            for i in 0..len {
                let bound = scale[i] * 2.0f64.powi(-8) + 1e-30;
                prop_assert!((r[i] as f64 - exact[i]).abs() <= bound, "{} vs {} (bound {})", r[i], exact[i], bound);
                if world > 1 {
                    prop_assert_eq!(r[i].to_bits() & 0xffff, 0, "{} is not a bf16 value", r[i]);
                }
            }
        }
    }

    /// Reduce-scatter then all-gather is the all-reduce, bit for bit, in either format; after
    /// the reduce-scatter each rank's own chunk already holds those bits (before bf16 rounding).
    #[test]
    fn reduce_scatter_then_all_gather_is_the_all_reduce(
        world in 1usize..=6, len in 0usize..3000, segment in 1usize..500, seed: u64, bf16: bool,
    ) {
        let wire = if bf16 { Wire::Bf16 } else { Wire::F32 };
        let data = inputs(world, len, seed);
        let whole = on_ranks(data.clone(), move |t, b| ring(t, 1, b, segment, RingMode::AllReduceMean, wire).expect("all-reduce"));
        let halves = on_ranks(data, move |t, b| {
            ring(t, 1, b, segment, RingMode::ReduceScatterMean, wire).expect("reduce-scatter");
            let owned = Schedule::new(t.rank(), t.world(), b.len(), segment).expect("schedule").owned();
            let mut mine = b[owned.clone()].to_vec();
            if t.world() > 1 {
                // What the all-gather sends (one rank sends nothing and rounds nothing).
                wire.round_in_place(&mut mine);
            }
            ring(t, 2, b, segment, RingMode::AllGather, wire).expect("all-gather");
            (owned, mine)
        });
        for ((w, ()), (h, (owned, mine))) in whole.iter().zip(&halves) {
            prop_assert!(w.iter().zip(h).all(|(a, b)| a.to_bits() == b.to_bits()));
            prop_assert!(w[owned.clone()].iter().zip(mine).all(|(a, b)| a.to_bits() == b.to_bits()));
        }
    }
}

#[test]
fn prime_and_large_lengths() {
    for (world, len) in [(4, 1_000_003), (3, 2_999_999), (8, 7919), (7, 1), (5, 4), (2, 0)] {
        check(world, len, 65_536, len as u64 + world as u64);
    }
}

#[test]
fn buckets_and_gather() {
    let world = 3;
    let len = 10_000;
    let buckets = BucketSizes { first: 100, size: 4096, last: 100, align: 16 }.cut(len);
    let transports = memory_ring(world, Duration::from_secs(30));
    let data = inputs(world, len, 5);
    let expected: Vec<f32> = (0..len).map(|i| data.iter().map(|d| d[i]).sum::<f32>() / world as f32).collect();
    let handles: Vec<_> = transports
        .into_iter()
        .zip(data)
        .map(|(mut t, mut grads)| {
            let buckets = buckets.clone();
            std::thread::spawn(move || {
                for (i, b) in buckets.iter().enumerate() {
                    all_reduce_mean(&mut t, 10 + i as u64, &mut grads[b.clone()], 1000).expect("bucket");
                }
                let rank = t.rank();
                let values = gather(&mut t, 99, Bytes::from(vec![rank as u8; 4])).expect("gather");
                (grads, values)
            })
        })
        .collect();
    for h in handles {
        let (grads, values) = h.join().expect("thread");
        for (a, b) in grads.iter().zip(&expected) {
            assert!((a - b).abs() < 1e-5);
        }
        assert_eq!(values, (0..world).map(|r| Bytes::from(vec![r as u8; 4])).collect::<Vec<_>>());
    }
}

/// Each rank's embedding-table gradient: nonzero only on the rows its token ids name.
fn sparse_tables(world: usize, rows: usize, width: usize, ids: &[Vec<i64>], seed: u64) -> Vec<Vec<f32>> {
    let noise = inputs(world, rows * width, seed);
    (0..world)
        .map(|rank| {
            let used = used_rows(&ids[rank], rows).expect("ids in range");
            let mut table = vec![0.0f32; rows * width];
            for &r in &used {
                let span = r as usize * width..(r as usize + 1) * width;
                table[span.clone()].copy_from_slice(&noise[rank][span]);
            }
            table
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    /// Moving only the used rows gives every rank the dense mean, bit-identical across ranks.
    #[test]
    fn row_sparse_mean_equals_the_dense_mean(
        world in 1usize..=6,
        rows in 1usize..300,
        width in 1usize..20,
        seed: u64,
        picks in proptest::collection::vec(proptest::collection::vec(0usize..10_000, 0..40), 6),
    ) {
        let ids: Vec<Vec<i64>> = picks.iter().map(|p| p.iter().map(|&i| (i % rows) as i64).collect()).collect();
        let tables = sparse_tables(world, rows, width, &ids, seed);
        let dense: Vec<f64> = (0..rows * width)
            .map(|i| tables.iter().map(|t| t[i] as f64).sum::<f64>() / world as f64)
            .collect();
        let handles: Vec<_> = memory_ring(world, Duration::from_secs(30))
            .into_iter()
            .zip(tables)
            .map(|(mut t, mut table)| {
                let used = used_rows(&ids[t.rank()], rows).expect("ids in range");
                std::thread::spawn(move || {
                    all_reduce_rows(&mut t, 3, &mut table, width, &used, 7, Wire::F32).expect("row all-reduce");
                    table
                })
            })
            .collect();
        let results: Vec<Vec<f32>> = handles.into_iter().map(|h| h.join().expect("rank thread")).collect();
        for r in &results {
            prop_assert!(r.iter().zip(&results[0]).all(|(a, b)| a.to_bits() == b.to_bits()));
            for (&got, &want) in r.iter().zip(&dense) {
                prop_assert!((got as f64 - want).abs() <= 1e-6 * world as f64, "{} vs {}", got, want);
            }
        }
    }
}

#[test]
fn a_vanished_rank_is_an_error_not_a_hang() {
    let mut transports = memory_ring(3, Duration::from_millis(300));
    drop(transports.remove(2));
    let handles: Vec<_> = transports
        .into_iter()
        .map(|mut t| std::thread::spawn(move || all_reduce_mean(&mut t, 1, &mut vec![1.0; 100], 10)))
        .collect();
    for h in handles {
        let err = h.join().expect("thread").expect_err("a rank is gone");
        let msg = err.to_string();
        assert!(msg.starts_with("rank ") && (msg.contains("has gone") || msg.contains("sent nothing")), "{msg}");
    }
}
