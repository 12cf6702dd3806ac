//! Whole-model gradients of the forward+backward graph against PyTorch: every tensor within
//! 1e-3 relative L2 (`tiny-bert` all parameters, `minilm-mrpc` the stored ones), and the word
//! embedding rows of ids outside the batch exactly zero.

use bert::{load_params, read_tensor_file, ModelConfig};
use ringtune_tests::{assert_grad_close, fixtures, max_abs_diff, minilm_dir, read_batch, runtime};
use runtime::{FlatBuffer, SessionOptions};
use trainer::engine::Engine;

fn engine(config: &ModelConfig, weights: &[std::path::PathBuf]) -> Engine {
    let layout = bert::layout(config);
    let mut params = FlatBuffer::zeros(layout.total_len());
    let report = load_params(weights, config, &layout, 0, &mut params).expect("weights");
    assert!(report.initialized.is_empty(), "{report:?}");
    Engine::new(runtime(), config, &layout, params, false, &SessionOptions::default()).expect("engine")
}

#[test]
fn tiny_bert_gradients_match_pytorch() {
    let dir = fixtures().join("tiny-bert");
    let config = ModelConfig::from_dir(&dir).expect("config");
    let mut engine = engine(&config, &[dir.join("model.safetensors")]);
    let out = engine.step(&read_batch(&dir.join("batch.safetensors"))).expect("step");
    let want = read_tensor_file(&dir.join("outputs.safetensors")).expect("outputs");
    assert!((out.loss - want["loss"].f32s().expect("loss")[0]).abs() < 1e-4);
    assert!(max_abs_diff(&out.logits, want["logits"].f32s().expect("logits")) < 1e-4);
    let reference = read_tensor_file(&dir.join("grads.safetensors")).expect("grads");
    assert_eq!(reference.len(), engine.layout().entries().len(), "the fixture has every parameter");
    for entry in engine.layout().entries() {
        let want = reference[&entry.name].f32s().expect("f32");
        assert_grad_close(&entry.name, &engine.grads()[entry.range()], want, 1e-3);
    }
}

#[test]
fn minilm_gradients_on_mrpc_match_pytorch() {
    let dir = fixtures().join("minilm-mrpc");
    let model = minilm_dir();
    let config = ModelConfig::from_dir(&model).expect("config").with_dropout(0.0);
    let mut engine = engine(&config, &[model.join("model.safetensors"), dir.join("classifier.safetensors")]);
    let out = engine.step(&read_batch(&dir.join("batch.safetensors"))).expect("step");
    let want = read_tensor_file(&dir.join("outputs.safetensors")).expect("outputs");
    assert!((out.loss - want["loss"].f32s().expect("loss")[0]).abs() < 1e-4);
    let reference = read_tensor_file(&dir.join("grads.safetensors")).expect("grads");
    let word = "bert.embeddings.word_embeddings.weight";
    let mut checked = 0;
    for (name, tensor) in &reference {
        let Some(entry) = engine.layout().get(name) else { continue };
        assert_grad_close(name, &engine.grads()[entry.range()], tensor.f32s().expect("f32"), 1e-3);
        checked += 1;
    }
    assert!(checked >= 4 + 16 * 2 + 2 + 2, "checked {checked} tensors");

    let entry = engine.layout().get(word).expect("word embeddings");
    let hidden = entry.shape[1];
    let table = &engine.grads()[entry.range()];
    let row_ids = reference[&format!("{word}.row_ids")].i64s().expect("ids");
    let rows = reference[&format!("{word}.rows")].f32s().expect("rows");
    let touched: Vec<f32> =
        row_ids.iter().flat_map(|&id| table[id as usize * hidden..(id as usize + 1) * hidden].to_vec()).collect();
    assert_grad_close(&format!("{word} (rows in the batch)"), &touched, rows, 1e-3);
    let mut untouched = 0.0f64;
    for (i, row) in table.chunks(hidden).enumerate() {
        if !row_ids.contains(&(i as i64)) {
            untouched += row.iter().map(|v| v.abs() as f64).sum::<f64>();
        }
    }
    assert_eq!(untouched, 0.0, "rows of ids outside the batch must be exactly zero");
}
