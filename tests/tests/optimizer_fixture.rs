//! Three AdamW steps (Hugging Face's grouping, clipping to 1.0) against PyTorch: the losses
//! before each step and every parameter after them within 1e-4.

use ringtune_encoders::{load_params, read_tensor_file, ModelConfig};
use ringtune_runtime::{FlatBuffer, SessionOptions};
use ringtune_tests::{fixtures, max_abs_diff, read_batch_prefixed, runtime};
use ringtune_trainer::engine::{Engine, SyncHooks};
use ringtune_trainer::model::GraphChoices;
use ringtune_trainer::replay::{replay, Trace};

#[test]
fn adamw_steps_match_pytorch() {
    let dir = fixtures().join("tiny-bert");
    let config = ModelConfig::from_dir(&dir).expect("config");
    let layout = ringtune_encoders::layout(&config);
    let mut params = FlatBuffer::zeros(layout.total_len());
    load_params(&[dir.join("model.safetensors")], &config, &layout, 0, &mut params).expect("weights");
    let mut engine = Engine::new(
        runtime(),
        &config,
        &layout,
        params,
        GraphChoices::default(),
        &SessionOptions::default(),
        SyncHooks::default(),
    )
    .expect("engine");
    let trace = Trace::from_file(&dir.join("steps.json")).expect("steps.json");
    let batches: Vec<_> = (0..trace.steps)
        .map(|i| read_batch_prefixed(&dir.join("steps_batches.safetensors"), &format!("step{i}.")))
        .collect();
    let losses = replay(&mut engine, &batches, &trace).expect("replay");
    for (ours, theirs) in losses.iter().zip(&trace.losses_before_each_step) {
        assert!((*ours as f64 - theirs).abs() < 1e-4, "loss {ours} vs {theirs}");
    }
    let after = read_tensor_file(&dir.join("steps_params_after.safetensors")).expect("params after");
    for e in layout.entries() {
        let want = after[&e.name].f32s().expect("f32");
        let diff = max_abs_diff(&engine.params().expect("not lent")[e.range()], want);
        assert!(diff < 1e-4, "{}: max difference {diff}", e.name);
    }
}
