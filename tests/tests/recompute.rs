//! `--recompute`: recomputing forward values in the backward pass changes no gradient, and
//! each level holds fewer tensors at the peak of a step (ONNX Runtime's own arena counters,
//! one arena per session so tests running beside it do not count).

use ringtune_encoders::{load_params, ModelConfig};
use ringtune_ops::{Kernels, Precision, Recompute};
use ringtune_runtime::{Arena, FlatBuffer, SessionOptions};
use ringtune_tests::{fixtures, minilm_dir, read_batch, runtime};
use ringtune_trainer::engine::{Engine, SyncHooks};
use ringtune_trainer::model::GraphChoices;

/// Loss, gradients and the arena's peak of tensors after two steps of MiniLM with dropout.
fn step(recompute: Recompute, kernels: Kernels) -> (f32, Vec<f32>, u64) {
    let model = minilm_dir();
    let config = ModelConfig::from_dir(&model).expect("config").with_dropout(0.1);
    let layout = ringtune_encoders::layout(&config);
    let mut params = FlatBuffer::zeros(layout.total_len());
    load_params(&[model.join("model.safetensors")], &config, &layout, 0, &mut params).expect("weights");
    let options = SessionOptions { threads: 2, arena: Arena::Session, ..SessionOptions::default() };
    let choices = GraphChoices { dropout: true, kernels, recompute, ..GraphChoices::default() };
    let mut engine =
        Engine::new(runtime(), &config, &layout, params, choices, &options, SyncHooks::default()).expect("engine");
    let batch = read_batch(&fixtures().join("minilm-mrpc/batch.safetensors"));
    engine.set_dropout_seed(5);
    engine.step(&batch).expect("step");
    let out = engine.step(&batch).expect("step");
    let peak = engine.arena_stats().expect("stats").expect("an arena").peak_in_use;
    (out.loss, engine.grads().to_vec(), peak)
}

fn recomputing_changes_no_gradient(kernels: Kernels) {
    let (loss, grads, kept) = step(Recompute::None, kernels);
    let mut peaks = vec![kept];
    for recompute in [Recompute::Cheap, Recompute::Layer] {
        let (again, regrads, peak) = step(recompute, kernels);
        assert_eq!(loss.to_bits(), again.to_bits(), "{recompute}: the loss");
        let differ = grads.iter().zip(&regrads).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
        assert_eq!(differ, 0, "{recompute}: {differ} gradient elements differ from keeping every value");
        peaks.push(peak);
    }
    assert!(peaks[1] < peaks[0] && peaks[2] < peaks[1], "{kernels}: peak tensor bytes none/cheap/layer {peaks:?}");
}

#[test]
fn recomputing_changes_no_gradient_on_mlas() {
    recomputing_changes_no_gradient(Kernels::Mlas);
}

#[test]
fn recomputing_changes_no_gradient_on_onednn() {
    recomputing_changes_no_gradient(Kernels::OneDnn(Precision::F32));
}
