//! The names of an encoder layer's parameters: every family's layer has the same parts in the
//! same order, under its own Hugging Face module names (each family's module says them).

use crate::param_shapes::AddParam;
use crate::param_shapes::{linear, norm};

/// The names of one encoder layer's parameters (prefixes of Hugging Face linear and
/// LayerNorm modules).
pub(crate) struct LayerNames {
    pub query: String,
    pub key: String,
    pub value: String,
    pub attention_out: String,
    pub attention_norm: String,
    pub intermediate: String,
    pub output: String,
    pub output_norm: String,
}

impl LayerNames {
    /// The layer's parameters with their shapes, in layout order, for hidden size `h` and
    /// feed-forward size `i`.
    pub(crate) fn params(&self, h: usize, i: usize, add: AddParam<'_>) {
        for projection in [&self.query, &self.key, &self.value, &self.attention_out] {
            linear(add, projection, h, h);
        }
        norm(add, &self.attention_norm, h);
        linear(add, &self.intermediate, h, i);
        linear(add, &self.output, i, h);
        norm(add, &self.output_norm, h);
    }
}
