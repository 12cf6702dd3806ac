//! The forward graph against PyTorch: logits and loss of `tiny-bert`, `minilm-mrpc`,
//! `tiny-mpnet` and `mpnet-mrpc` within 1e-4, and the exported inference model giving the same
//! logits, as does the inference graph that skips the padding.

use std::collections::BTreeMap;
use std::path::PathBuf;

use ringtune_encoders::{
    forward_graph, layout, load_params, read_tensor_file, GraphOptions, HostTensor, ModelConfig, Padding, Params,
};
use ringtune_runtime::{Session, SessionOptions, TensorView};
use ringtune_tests::{fixtures, max_abs_diff, minilm_dir, mpnet_dir, runtime};

struct Case {
    config: ModelConfig,
    weights: Vec<PathBuf>,
    batch: BTreeMap<String, HostTensor>,
    outputs: BTreeMap<String, HostTensor>,
}

fn tiny_bert() -> Case {
    let dir = fixtures().join("tiny-bert");
    Case {
        config: ModelConfig::from_dir(&dir).expect("config"),
        weights: vec![dir.join("model.safetensors")],
        batch: read_tensor_file(&dir.join("batch.safetensors")).expect("batch"),
        outputs: read_tensor_file(&dir.join("outputs.safetensors")).expect("outputs"),
    }
}

fn minilm_mrpc() -> Case {
    let dir = fixtures().join("minilm-mrpc");
    let model = minilm_dir();
    Case {
        config: ModelConfig::from_dir(&model).expect("config").with_dropout(0.0),
        weights: vec![model.join("model.safetensors"), dir.join("classifier.safetensors")],
        batch: read_tensor_file(&dir.join("batch.safetensors")).expect("batch"),
        outputs: read_tensor_file(&dir.join("outputs.safetensors")).expect("outputs"),
    }
}

fn tiny_mpnet() -> Case {
    let dir = fixtures().join("tiny-mpnet");
    Case {
        config: ModelConfig::from_dir(&dir).expect("config"),
        weights: vec![dir.join("model.safetensors")],
        batch: read_tensor_file(&dir.join("batch.safetensors")).expect("batch"),
        outputs: read_tensor_file(&dir.join("outputs.safetensors")).expect("outputs"),
    }
}

fn mpnet_mrpc() -> Case {
    let dir = fixtures().join("mpnet-mrpc");
    let model = mpnet_dir();
    Case {
        config: ModelConfig::from_dir(&model).expect("config").with_dropout(0.0),
        weights: vec![model.join("model.safetensors"), dir.join("classifier.safetensors")],
        batch: read_tensor_file(&dir.join("batch.safetensors")).expect("batch"),
        outputs: read_tensor_file(&dir.join("outputs.safetensors")).expect("outputs"),
    }
}

fn view<'a>(batch: &'a BTreeMap<String, HostTensor>, name: &str) -> TensorView<'a> {
    let t = &batch[name];
    let shape: Vec<i64> = t.shape().iter().map(|&d| d as i64).collect();
    TensorView::i64(&shape, t.i64s().expect("integer batch tensor"))
}

fn check(case: Case) {
    let layout = layout(&case.config);
    let mut params = vec![0.0f32; layout.total_len()];
    let report = load_params(&case.weights, &case.config, &layout, 0, &mut params).expect("weights");
    assert!(report.initialized.is_empty(), "every parameter comes from the files: {report:?}");
    let options = GraphOptions {
        params: Params::Inputs,
        with_loss: true,
        dropout: false,
        label_smoothing: 0.0,
        padding: Padding::Computed,
    };
    let forward = forward_graph(&case.config, &layout, &options).expect("graph");
    let mut session =
        Session::from_bytes(runtime(), &forward.graph.to_bytes().expect("bytes"), &SessionOptions::default())
            .expect("session");
    let shapes: Vec<Vec<i64>> = layout.entries().iter().map(|e| e.dims_i64()).collect();
    let mut inputs: Vec<(&str, TensorView<'_>)> = layout
        .entries()
        .iter()
        .zip(&shapes)
        .map(|(e, s)| (e.name.as_str(), TensorView::f32(s, &params[e.range()])))
        .collect();
    let batch_inputs: Vec<&str> = if case.config.family.has_token_types() {
        vec![ringtune_encoders::INPUT_IDS, ringtune_encoders::TOKEN_TYPE_IDS, ringtune_encoders::ATTENTION_MASK]
    } else {
        vec![ringtune_encoders::INPUT_IDS, ringtune_encoders::ATTENTION_MASK]
    };
    for name in batch_inputs.iter().chain([&ringtune_encoders::LABELS]) {
        inputs.push((name, view(&case.batch, name)));
    }
    let out = session.run(&inputs, &[ringtune_encoders::LOGITS, ringtune_encoders::LOSS]).expect("run");
    let logits = out[0].as_f32().expect("logits");
    let want_logits = case.outputs["logits"].f32s().expect("f32");
    assert!(max_abs_diff(logits, want_logits) < 1e-4, "logits {logits:?} vs {want_logits:?}");
    let loss = out[1].as_f32().expect("loss");
    let want_loss = case.outputs["loss"].f32s().expect("f32");
    assert!((loss[0] - want_loss[0]).abs() < 1e-4, "loss {loss:?} vs {want_loss:?}");

    // The exported, self-contained inference model gives the same logits.
    let exported = ringtune_encoders::export_inference(&case.config, &layout, &params).expect("export");
    let mut inference = Session::from_bytes(runtime(), &exported, &SessionOptions::default()).expect("session");
    assert_eq!(inference.input_names(), batch_inputs.as_slice());
    let feeds: Vec<(&str, TensorView<'_>)> = batch_inputs.iter().map(|name| (*name, view(&case.batch, name))).collect();
    let exported_logits = inference.run(&feeds, &[ringtune_encoders::LOGITS]).expect("run");
    assert!(max_abs_diff(exported_logits[0].as_f32().expect("f32"), want_logits) < 1e-4);

    // So does the inference graph that skips the padding, on a batch that has some.
    let mask = case.batch[ringtune_encoders::ATTENTION_MASK].i64s().expect("mask");
    assert!(mask.contains(&0) && mask.contains(&1), "the batch pads some rows: {mask:?}");
    let options = GraphOptions::inference(&params, Padding::Skipped);
    let mut skipping = forward_graph(&case.config, &layout, &options).expect("graph").graph;
    skipping.prune();
    let model = skipping.to_bytes().expect("bytes");
    let mut session = Session::from_bytes(runtime(), &model, &SessionOptions::default()).expect("session");
    let skipped_logits = session.run(&feeds, &[ringtune_encoders::LOGITS]).expect("run");
    let skipped_logits = skipped_logits[0].as_f32().expect("f32");
    assert!(max_abs_diff(skipped_logits, want_logits) < 1e-4, "{skipped_logits:?} vs {want_logits:?}");
}

#[test]
fn tiny_bert_matches_pytorch() {
    check(tiny_bert());
}

#[test]
fn minilm_on_mrpc_matches_pytorch() {
    check(minilm_mrpc());
}

#[test]
fn tiny_mpnet_matches_pytorch() {
    check(tiny_mpnet());
}

#[test]
fn mpnet_on_mrpc_matches_pytorch() {
    check(mpnet_mrpc());
}
