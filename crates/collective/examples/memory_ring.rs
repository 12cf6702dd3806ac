//! A ring all-reduce of four ranks over the in-memory transport: each rank a thread, the
//! gradients averaged in place, the same bits on every rank.
//!
//! `cargo run -p ringtune-collective --example memory_ring`

use std::time::Duration;

use ringtune_collective::{all_reduce_mean, memory_ring};

fn main() {
    let world = 4;
    let len = 1_000_003;
    let handles: Vec<_> = memory_ring(world, Duration::from_secs(10))
        .into_iter()
        .enumerate()
        .map(|(rank, mut transport)| {
            std::thread::spawn(move || {
                let mut grads: Vec<f32> = (0..len).map(|i| (i % 97) as f32 * (rank + 1) as f32).collect();
                all_reduce_mean(&mut transport, 1, &mut grads, 64 << 10).map(|()| grads)
            })
        })
        .collect();
    let results: Vec<Vec<f32>> = handles.into_iter().map(|h| h.join().expect("rank").expect("all-reduce")).collect();
    let same = results.windows(2).all(|w| w[0].iter().zip(&w[1]).all(|(a, b)| a.to_bits() == b.to_bits()));
    // Element 5 is 5 x (1 + 2 + 3 + 4) / 4 on every rank.
    println!("{world} ranks averaged {len} floats; element 5 = {}; bitwise equal on every rank: {same}", results[0][5]);
    assert!(same && results[0][5] == 12.5);
}
