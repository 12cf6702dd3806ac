//! The int8 model skips the padding: its scales per batch come from the real tokens alone, so a
//! batch gives the same logits however far it is padded, where the graph that computes the
//! padding lets the padded positions move them.

use std::path::Path;

use ringtune_encoders::{export_inference_int8, init_all, layout, FeedForwardInput, ModelConfig, Padding, WeightRange};
use ringtune_runtime::{Session, SessionOptions, TensorView};
use ringtune_tests::{max_abs_diff, runtime};

/// Three sequences of 7, 4 and 2 tokens (the first token of each a `[CLS]`, id 1), padded with
/// id 0 to `seq`: ids, token types, mask.
fn batch(seq: usize) -> [Vec<i64>; 3] {
    let lengths = [7, 4, 2];
    let mut ids = vec![0; 3 * seq];
    let mut types = vec![0; 3 * seq];
    let mut mask = vec![0; 3 * seq];
    for (row, &len) in lengths.iter().enumerate() {
        for t in 0..len {
            ids[row * seq + t] = if t == 0 { 1 } else { 2 + ((row * 7 + t * 5) % 27) as i64 };
            types[row * seq + t] = i64::from(t >= len / 2);
            mask[row * seq + t] = 1;
        }
    }
    [ids, types, mask]
}

fn logits(model: &[u8], seq: usize) -> Vec<f32> {
    let mut session = Session::from_bytes(runtime(), model, &SessionOptions::default()).expect("session");
    let [ids, types, mask] = batch(seq);
    let shape = [3, seq as i64];
    let feeds = [
        (ringtune_encoders::INPUT_IDS, TensorView::i64(&shape, &ids)),
        (ringtune_encoders::TOKEN_TYPE_IDS, TensorView::i64(&shape, &types)),
        (ringtune_encoders::ATTENTION_MASK, TensorView::i64(&shape, &mask)),
    ];
    let out = session.run(&feeds, &[ringtune_encoders::LOGITS]).expect("run");
    out[0].as_f32().expect("logits").to_vec()
}

#[test]
fn int8_logits_do_not_depend_on_how_far_the_batch_is_padded() {
    let config = ModelConfig::from_json(
        r#"{"vocab_size": 30, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
            "intermediate_size": 64, "max_position_embeddings": 16}"#,
        Path::new("config.json"),
    )
    .expect("config");
    let layout = layout(&config);
    let mut params = vec![0.0; layout.total_len()];
    init_all(&config, &layout, 5, &mut params);
    let model = |padding| {
        let feed_forward = FeedForwardInput::PerToken;
        let (bytes, _) =
            export_inference_int8(&config, &layout, &params, WeightRange::Full, feed_forward, &|_| false, padding)
                .expect("int8 model");
        bytes
    };
    let (skipping, computing) = (model(Padding::Skipped), model(Padding::Computed));
    let (tight, loose) = (logits(&skipping, 7), logits(&skipping, 16));
    let skipped_moves = max_abs_diff(&tight, &loose);
    assert!(skipped_moves < 1e-5, "{tight:?} vs {loose:?}");
    // The control: where the padding is computed, the padded positions move the scales, and so
    // the logits, by far more than rounding moves the skipping model's. How far depends on the
    // CPU's int8 kernels (under 1e-4 with AVX2 alone, more with VNNI), so the bound is relative.
    let (tight, loose) = (logits(&computing, 7), logits(&computing, 16));
    let computed_moves = max_abs_diff(&tight, &loose);
    assert!(
        computed_moves > 10.0 * skipped_moves.max(1e-7),
        "the padded positions move the scales ({computed_moves:e}, the skipping model {skipped_moves:e}): \
         {tight:?} vs {loose:?}"
    );
}
