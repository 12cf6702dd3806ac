//! Dropout in the training graph runs as `SeededDropout`: the step's seed fixes every mask, so
//! a step repeats bitwise, another seed draws other masks, and the loss is a smooth function
//! of the parameters whose gradient the backward graph (masks redrawn, not stored) must match
//! by finite differences.

use ringtune_encoders::{load_params, ModelConfig};
use ringtune_runtime::{FlatBuffer, SessionOptions};
use ringtune_tests::{fixtures, read_batch, runtime};
use ringtune_trainer::engine::{Engine, SyncHooks};
use ringtune_trainer::model::GraphChoices;

fn engine() -> (Engine, ringtune_data::Batch) {
    let dir = fixtures().join("tiny-bert");
    let config = ModelConfig::from_dir(&dir).expect("config").with_dropout(0.3);
    let layout = ringtune_encoders::layout(&config);
    let mut params = FlatBuffer::zeros(layout.total_len());
    load_params(&[dir.join("model.safetensors")], &config, &layout, 0, &mut params).expect("weights");
    let options = SessionOptions { threads: 2, ..SessionOptions::default() };
    let engine = Engine::new(
        runtime(),
        &config,
        &layout,
        params,
        GraphChoices { dropout: true, ..GraphChoices::default() },
        &options,
        SyncHooks::default(),
    )
    .expect("engine");
    (engine, read_batch(&dir.join("batch.safetensors")))
}

#[test]
fn a_seed_fixes_the_masks() {
    let (mut engine, batch) = engine();
    engine.set_dropout_seed(11);
    let first = engine.step(&batch).expect("step");
    let grads = engine.grads().to_vec();
    engine.set_dropout_seed(12);
    let other = engine.step(&batch).expect("step");
    assert_ne!(first.loss.to_bits(), other.loss.to_bits(), "another seed, other masks");
    engine.set_dropout_seed(11);
    let again = engine.step(&batch).expect("step");
    assert_eq!(first.loss.to_bits(), again.loss.to_bits());
    assert!(grads.iter().zip(engine.grads()).all(|(a, b)| a.to_bits() == b.to_bits()), "gradients repeat bitwise");
}

#[test]
fn gradients_with_dropout_match_finite_differences() {
    let (mut engine, batch) = engine();
    engine.set_dropout_seed(3);
    engine.step(&batch).expect("step");
    let grads = engine.grads().to_vec();
    let entries = engine.layout().entries().to_vec();
    // Tensors behind every kind of dropout site: embeddings, attention probabilities, the
    // attention and feed-forward outputs, and the classifier input.
    for name in [
        "bert.embeddings.word_embeddings.weight",
        "bert.encoder.layer.0.attention.self.query.weight",
        "bert.encoder.layer.1.attention.output.dense.weight",
        "bert.encoder.layer.1.intermediate.dense.weight",
        "bert.pooler.dense.weight",
    ] {
        let entry = entries.iter().find(|e| e.name == name).unwrap_or_else(|| panic!("{name}"));
        let g = &grads[entry.range()];
        let norm = g.iter().map(|v| f64::from(*v).powi(2)).sum::<f64>().sqrt();
        assert!(norm > 0.0, "{name}: zero gradient");
        // Central difference along the gradient: (L(p + h d) - L(p - h d)) / 2h = |g| for d = g / |g|.
        let h = 1e-2;
        let mut loss_at = |sign: f64| {
            let params = engine.params_mut().expect("not lent");
            for (p, g) in params[entry.range()].iter_mut().zip(g) {
                *p += (sign * h * f64::from(*g) / norm) as f32;
            }
            let loss = f64::from(engine.step(&batch).expect("step").loss);
            let params = engine.params_mut().expect("not lent");
            for (p, g) in params[entry.range()].iter_mut().zip(g) {
                *p -= (sign * h * f64::from(*g) / norm) as f32;
            }
            loss
        };
        let slope = (loss_at(1.0) - loss_at(-1.0)) / (2.0 * h);
        assert!((slope - norm).abs() < 2e-2 * norm, "{name}: finite difference {slope}, backward {norm}");
    }
}
