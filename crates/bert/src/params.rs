//! The parameters of a model: their names and shapes in layout order, and their seeded
//! initialisation (Hugging Face's `_init_weights`).

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};

use crate::{Family, ModelConfig, ParamEntry, ParamLayout};

/// The word-embedding table's name: the one parameter whose gradient is nonzero only on the rows
/// a batch's token ids name.
pub fn word_embeddings_name(config: &ModelConfig) -> String {
    format!("{}embeddings.word_embeddings.weight", config.family.prefix())
}

/// Every parameter of the model with its Hugging Face name and shape, in layout order.
pub fn param_shapes(config: &ModelConfig) -> Vec<(String, Vec<usize>)> {
    let (h, i) = (config.hidden_size, config.intermediate_size);
    let p = config.family.prefix();
    let mut out: Vec<(String, Vec<usize>)> = Vec::new();
    let mut add = |name: String, shape: Vec<usize>| out.push((name, shape));
    match config.family {
        Family::Bert => {
            add(word_embeddings_name(config), vec![config.vocab_size, h]);
            add(format!("{p}embeddings.position_embeddings.weight"), vec![config.max_position_embeddings, h]);
            add(format!("{p}embeddings.token_type_embeddings.weight"), vec![config.type_vocab_size, h]);
            add(format!("{p}embeddings.LayerNorm.weight"), vec![h]);
            add(format!("{p}embeddings.LayerNorm.bias"), vec![h]);
            for l in 0..config.num_layers {
                let layer = format!("{p}encoder.layer.{l}.");
                for proj in ["query", "key", "value"] {
                    add(format!("{layer}attention.self.{proj}.weight"), vec![h, h]);
                    add(format!("{layer}attention.self.{proj}.bias"), vec![h]);
                }
                add(format!("{layer}attention.output.dense.weight"), vec![h, h]);
                add(format!("{layer}attention.output.dense.bias"), vec![h]);
                add(format!("{layer}attention.output.LayerNorm.weight"), vec![h]);
                add(format!("{layer}attention.output.LayerNorm.bias"), vec![h]);
                add(format!("{layer}intermediate.dense.weight"), vec![i, h]);
                add(format!("{layer}intermediate.dense.bias"), vec![i]);
                add(format!("{layer}output.dense.weight"), vec![h, i]);
                add(format!("{layer}output.dense.bias"), vec![h]);
                add(format!("{layer}output.LayerNorm.weight"), vec![h]);
                add(format!("{layer}output.LayerNorm.bias"), vec![h]);
            }
            add(format!("{p}pooler.dense.weight"), vec![h, h]);
            add(format!("{p}pooler.dense.bias"), vec![h]);
            add("classifier.weight".into(), vec![config.num_labels, h]);
            add("classifier.bias".into(), vec![config.num_labels]);
        }
        Family::MPNet => {
            add(word_embeddings_name(config), vec![config.vocab_size, h]);
            add(format!("{p}embeddings.position_embeddings.weight"), vec![config.max_position_embeddings, h]);
            add(format!("{p}embeddings.LayerNorm.weight"), vec![h]);
            add(format!("{p}embeddings.LayerNorm.bias"), vec![h]);
            for l in 0..config.num_layers {
                let layer = format!("{p}encoder.layer.{l}.");
                for proj in ["q", "k", "v", "o"] {
                    add(format!("{layer}attention.attn.{proj}.weight"), vec![h, h]);
                    add(format!("{layer}attention.attn.{proj}.bias"), vec![h]);
                }
                add(format!("{layer}attention.LayerNorm.weight"), vec![h]);
                add(format!("{layer}attention.LayerNorm.bias"), vec![h]);
                add(format!("{layer}intermediate.dense.weight"), vec![i, h]);
                add(format!("{layer}intermediate.dense.bias"), vec![i]);
                add(format!("{layer}output.dense.weight"), vec![h, i]);
                add(format!("{layer}output.dense.bias"), vec![h]);
                add(format!("{layer}output.LayerNorm.weight"), vec![h]);
                add(format!("{layer}output.LayerNorm.bias"), vec![h]);
            }
            add(
                format!("{p}encoder.relative_attention_bias.weight"),
                vec![config.relative_attention_buckets, config.num_heads],
            );
            add("classifier.dense.weight".into(), vec![h, h]);
            add("classifier.dense.bias".into(), vec![h]);
            add("classifier.out_proj.weight".into(), vec![config.num_labels, h]);
            add("classifier.out_proj.bias".into(), vec![config.num_labels]);
        }
    }
    out
}

/// The flat layout of a model's parameters.
pub fn layout(config: &ModelConfig) -> ParamLayout {
    ParamLayout::new(param_shapes(config))
}

/// Whether a parameter belongs to a task head, which a pre-trained checkpoint may lack and
/// which is then initialised from the seed.
pub fn is_head(config: &ModelConfig, name: &str) -> bool {
    name.starts_with("classifier.") || name.starts_with(&format!("{}pooler.", config.family.prefix()))
}

/// Initialises one parameter as Hugging Face does: normal(0, `initializer_range`) for weights
/// and embeddings, zeros for biases, ones for LayerNorm scales. The stream depends only on
/// `seed` and the parameter's name.
pub fn init_param(config: &ModelConfig, entry: &ParamEntry, seed: u64, out: &mut [f32]) {
    if entry.name.ends_with("LayerNorm.weight") {
        out.fill(1.0);
    } else if entry.name.ends_with("bias") {
        out.fill(0.0);
    } else {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ name_hash(&entry.name));
        let std = config.initializer_range as f32;
        for v in out.iter_mut() {
            let z: f32 = StandardNormal.sample(&mut rng);
            *v = z * std;
        }
    }
}

/// Initialises every parameter from `seed` (random models for speed work).
pub fn init_all(config: &ModelConfig, layout: &ParamLayout, seed: u64, params: &mut [f32]) {
    for entry in layout.entries() {
        init_param(config, entry, seed, &mut params[entry.range()]);
    }
}

/// FNV-1a: a stable hash of a name, to give each parameter its own random stream.
fn name_hash(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    pub(crate) fn tiny() -> ModelConfig {
        ModelConfig::from_json(
            r#"{"vocab_size": 50, "hidden_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2,
                "intermediate_size": 16, "max_position_embeddings": 12}"#,
            Path::new("tiny.json"),
        )
        .expect("tiny config")
    }

    #[test]
    fn counts_match_the_architecture() {
        let c = tiny();
        let shapes = param_shapes(&c);
        assert_eq!(shapes.len(), 5 + 2 * 16 + 2 + 2);
        let per_layer = 4 * (8 * 8 + 8) + 2 * 8 + (16 * 8 + 16) + (8 * 16 + 8) + 2 * 8;
        let expected = 50 * 8 + 12 * 8 + 2 * 8 + 16 + 2 * per_layer + 72 + 18;
        assert_eq!(layout(&c).num_params(), expected);
    }

    #[test]
    fn init_is_deterministic_per_name() {
        let c = tiny();
        let l = layout(&c);
        let mut a = vec![0.0; l.total_len()];
        let mut b = vec![0.0; l.total_len()];
        init_all(&c, &l, 7, &mut a);
        init_all(&c, &l, 7, &mut b);
        assert_eq!(a, b);
        let w = l.get("classifier.weight").expect("head");
        assert!(a[w.range()].iter().all(|v| v.abs() < 0.2) && a[w.range()].iter().any(|&v| v != 0.0));
        let ln = l.get("bert.embeddings.LayerNorm.weight").expect("ln");
        assert!(a[ln.range()].iter().all(|&v| v == 1.0));
        init_all(&c, &l, 8, &mut b);
        assert_ne!(a[w.range()], b[w.range()]);
    }
}
