//! Hugging Face Trainer's conventions that the trainer follows.

use ringtune_bert::ParamLayout;
use ringtune_optim::Group;

/// Whether Hugging Face's Trainer exempts a parameter from weight decay (biases and LayerNorm
/// weights).
pub fn exempt_from_decay(name: &str) -> bool {
    name.ends_with("bias") || name.contains("LayerNorm")
}

/// One optimizer group per parameter, with weight decay `wd` unless exempt.
pub fn param_groups(layout: &ParamLayout, wd: f64) -> Vec<Group> {
    layout
        .entries()
        .iter()
        .map(|e| Group { range: e.range(), weight_decay: if exempt_from_decay(&e.name) { 0.0 } else { wd as f32 } })
        .collect()
}

/// Warmup steps for a share of the total: `int(ratio * total)`, as the reference script does.
pub fn warmup_steps(ratio: f64, total: u64) -> u64 {
    (ratio * total as f64).floor() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decay_grouping() {
        assert!(exempt_from_decay("bert.encoder.layer.0.attention.output.LayerNorm.weight"));
        assert!(exempt_from_decay("classifier.bias"));
        assert!(!exempt_from_decay("bert.embeddings.word_embeddings.weight"));
        assert_eq!(warmup_steps(0.1, 345), 34);
    }
}
