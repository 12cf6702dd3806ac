//! The fused operators against the plain ONNX graph they replace, on MiniLM with dropout on:
//! the oneDNN graph (attention, the residual LayerNorms with their dropout, and GELU fused) and
//! the MLAS graph (the plain chains) draw the same dropout masks from the same seed, so loss and
//! every gradient agree to rounding, and the fused step holds fewer tensors at its peak.

use ringtune_encoders::{load_params, ModelConfig};
use ringtune_ops::{Kernels, Precision};
use ringtune_runtime::{Arena, FlatBuffer, SessionOptions};
use ringtune_tests::{assert_grad_close, fixtures, minilm_dir, read_batch, runtime};
use ringtune_trainer::engine::{Engine, SyncHooks};
use ringtune_trainer::model::GraphChoices;

/// Loss, gradients and the arena's peak of tensors after a step of MiniLM with dropout.
fn step(kernels: Kernels) -> (f32, Vec<f32>, u64, Vec<String>) {
    let model = minilm_dir();
    let config = ModelConfig::from_dir(&model).expect("config").with_dropout(0.1);
    let layout = ringtune_encoders::layout(&config);
    let mut params = FlatBuffer::zeros(layout.total_len());
    load_params(&[model.join("model.safetensors")], &config, &layout, 0, &mut params).expect("weights");
    let options = SessionOptions { threads: 2, arena: Arena::Session, ..SessionOptions::default() };
    let choices = GraphChoices { dropout: true, kernels, ..GraphChoices::default() };
    let mut engine =
        Engine::new(runtime(), &config, &layout, params, choices, &options, SyncHooks::default()).expect("engine");
    engine.set_dropout_seed(11);
    let out = engine.step(&read_batch(&fixtures().join("minilm-mrpc/batch.safetensors"))).expect("step");
    let peak = engine.arena_stats().expect("stats").expect("an arena").peak_in_use;
    let names = layout.entries().iter().map(|e| e.name.clone()).collect();
    (out.loss, engine.grads().to_vec(), peak, names)
}

#[test]
fn fused_attention_matches_the_plain_graph_with_dropout_and_holds_less() {
    let (loss, grads, plain_peak, names) = step(Kernels::Mlas);
    let (fused_loss, fused_grads, fused_peak, _) = step(Kernels::OneDnn(Precision::F32));
    assert!((loss - fused_loss).abs() < 1e-4, "loss {loss} plain, {fused_loss} fused");
    let layout = ringtune_encoders::layout(&ModelConfig::from_dir(&minilm_dir()).expect("config"));
    for (entry, name) in layout.entries().iter().zip(&names) {
        let range = entry.range();
        assert_grad_close(name, &fused_grads[range.clone()], &grads[range], 1e-3);
    }
    // The attention scores of a layer (32 x 12 x 128 x 128 floats, 25 MiB) are no longer kept.
    assert!(fused_peak < plain_peak, "peak tensor bytes: fused {fused_peak}, plain {plain_peak}");
}
