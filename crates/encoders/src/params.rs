//! The parameters of a model: their names and shapes in layout order, and their seeded
//! initialisation (Hugging Face's `_init_weights`).

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};

use crate::{ModelConfig, ParamEntry, ParamLayout};

/// The word-embedding table's name: the one parameter whose gradient is nonzero only on the rows
/// a batch's token ids name.
pub fn word_embeddings_name(config: &ModelConfig) -> String {
    config.family.rules().word_embeddings(config)
}

/// Every parameter of the model with its Hugging Face name and shape, in layout order: the
/// embeddings, each layer's, then what the family has after them (shared tables, the head).
pub fn param_shapes(config: &ModelConfig) -> Vec<(String, Vec<usize>)> {
    let rules = config.family.rules();
    let mut out: Vec<(String, Vec<usize>)> = Vec::new();
    let mut add = |name: String, shape: Vec<usize>| out.push((name, shape));
    rules.embedding_params(config, &mut add);
    for layer in 0..config.num_layers {
        rules.layer_params(config, layer, &mut add);
    }
    rules.final_params(config, &mut add);
    out
}

/// The flat layout of a model's parameters.
pub fn layout(config: &ModelConfig) -> ParamLayout {
    ParamLayout::new(param_shapes(config))
}

/// Whether a parameter belongs to a task head, which a pre-trained checkpoint may lack and
/// which is then initialised from the seed.
pub fn is_head(config: &ModelConfig, name: &str) -> bool {
    config.family.rules().is_head(name)
}

/// Initialises one parameter as Hugging Face does: normal(0, `initializer_range`) for weights
/// and embeddings, zeros for biases, ones for LayerNorm scales. The stream depends only on
/// `seed` and the parameter's name.
pub fn init_param(config: &ModelConfig, entry: &ParamEntry, seed: u64, out: &mut [f32]) {
    // DistilBERT names its layers' norms `..._layer_norm`, ModernBERT `norm`, `attn_norm`, ...
    if entry.name.ends_with("LayerNorm.weight") || entry.name.ends_with("norm.weight") {
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

    #[test]
    fn each_family_names_its_own_parameters() {
        let with = |model_type: &str, extra: &str| {
            ModelConfig::from_json(
                &format!(
                    r#"{{"model_type": "{model_type}", "vocab_size": 50, "hidden_size": 8, "num_hidden_layers": 1,
                        "num_attention_heads": 2, "intermediate_size": 16, "max_position_embeddings": 12{extra}}}"#
                ),
                Path::new("config.json"),
            )
            .expect("config")
        };
        let names = |c: &ModelConfig| param_shapes(c).into_iter().map(|(n, _)| n).collect::<Vec<_>>();
        let narrow = with("electra", r#", "embedding_size": 4"#);
        let shapes = param_shapes(&narrow);
        assert!(shapes.contains(&("electra.embeddings_project.weight".into(), vec![8, 4])), "{shapes:?}");
        assert!(shapes.contains(&("electra.embeddings.word_embeddings.weight".into(), vec![50, 4])));
        assert!(!names(&with("electra", "")).iter().any(|n| n.contains("embeddings_project")), "as wide: none");
        let distil = with("distilbert", "");
        assert!(names(&distil).contains(&"distilbert.transformer.layer.0.ffn.lin2.weight".to_string()));
        assert!(is_head(&distil, "pre_classifier.weight") && !is_head(&distil, "distilbert.embeddings.LayerNorm.bias"));
        let roberta = names(&with("camembert", ""));
        assert!(roberta.iter().all(|n| n.starts_with("roberta.") || n.starts_with("classifier.")), "{roberta:?}");
        assert!(!roberta.iter().any(|n| n.contains("pooler")), "no pooler");
        let l = layout(&distil);
        let mut params = vec![0.0; l.total_len()];
        init_all(&distil, &l, 3, &mut params);
        let norm = l.get("distilbert.transformer.layer.0.sa_layer_norm.weight").expect("norm");
        assert!(params[norm.range()].iter().all(|&v| v == 1.0), "a norm's scale starts at one");
    }
}
