//! AdamW with a warmup-then-decay schedule and global-norm clipping on a flat buffer, fitting
//! `params` to a target: the optimizer phase of a training step, with the gradients computed
//! by hand.
//!
//! `cargo run -p ringtune-optim --example adamw`

use ringtune_optim::{AdamW, AdamWConfig, Group, LrSchedule, ScheduleKind};

fn main() -> Result<(), ringtune_optim::OptimError> {
    let target = [3.0f32, -2.0, 0.5, 1.0];
    let mut params = vec![0.0f32; 4];
    // Weight decay on the first two ("weights"), none on the last two ("biases").
    let groups = [Group { range: 0..2, weight_decay: 0.01 }, Group { range: 2..4, weight_decay: 0.0 }];
    let mut adam = AdamW::new(AdamWConfig::default(), &groups, params.len())?;
    let schedule = LrSchedule { kind: ScheduleKind::Linear, peak: 0.1, warmup: 20, total: 400 };
    for step in 0..400 {
        let grads: Vec<f32> = params.iter().zip(&target).map(|(p, t)| 2.0 * (p - t)).collect();
        let norm = adam.clip_and_step(&mut params, &grads, 1.0, schedule.lr(step) as f32)?;
        if step % 100 == 0 {
            println!("step {step}: gradient norm {norm:.3}, lr {:.4}, params {params:?}", schedule.lr(step));
        }
    }
    println!("after 400 steps: {params:?} (target {target:?})");
    Ok(())
}
