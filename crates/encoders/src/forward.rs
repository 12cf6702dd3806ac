//! The forward graph of a sequence classifier, exact to Hugging Face's
//! `...ForSequenceClassification` of each family: the layers every family shares here, what a
//! family says differently in its module of `families/`.
//!
//! Hidden states run as 2-D `[batch*seq, hidden]` so that every dense layer is one `Gemm` with
//! `transB` (Hugging Face stores weights as `[out, in]`): no transposed weight copies, and the
//! backward pass is plain `Gemm`s too. Only attention goes to 4-D and back.

use ringtune_onnx_ir::{shape, DType, Dim, Graph, Tensor, Value};

use crate::layer_names::LayerNames;
use crate::{ModelConfig, ModelError, ParamLayout, ProblemType};

/// Graph input names of a batch.
pub const INPUT_IDS: &str = "input_ids";
/// Token types (segment ids).
pub const TOKEN_TYPE_IDS: &str = "token_type_ids";
/// 1 for real tokens, 0 for padding.
pub const ATTENTION_MASK: &str = "attention_mask";
/// Labels: class ids (`int64`), or scores (`float`) for a regression head.
pub const LABELS: &str = "labels";
/// Graph output: `[batch, num_labels]` scores.
pub const LOGITS: &str = "logits";
/// Graph output: mean cross-entropy, or mean squared error for a regression head.
pub const LOSS: &str = "loss";

/// Where the parameters come from.
#[derive(Debug, Clone, Copy)]
pub enum Params<'a> {
    /// Graph inputs named as the layout names them (training: the trainer feeds them).
    Inputs,
    /// Initialisers holding these values (a self-contained inference model).
    Embedded(&'a [f32]),
}

/// Which tokens of a padded batch the layers compute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Padding {
    /// Every position, padding included: the graph Hugging Face's model is.
    Computed,
    /// The real tokens alone (an inference graph's choice): after the embeddings the hidden
    /// states hold only the positions the attention mask marks, gathered in order, and the
    /// query, key and value projections are spread back over the padded positions for the
    /// attention scores alone (a padded position takes a neighbour's row: the mask hides it as
    /// a key, and its output is never read). The last layer, past its attention, computes each
    /// sequence's first token alone, all the classifier head reads. The logits equal
    /// [`Padding::Computed`]'s for every sequence that starts with a real token (as tokenizers
    /// write them: `[CLS]` or `<s>` first); a batch of lengths spread over 40-128 tokens padded
    /// to 128 skips a third of the dense layers' work.
    Skipped,
}

/// What to build.
#[derive(Debug, Clone, Copy)]
pub struct GraphOptions<'a> {
    /// Parameter source.
    pub params: Params<'a>,
    /// Add `labels` and the `loss` output (mean cross-entropy, or mean squared error).
    pub with_loss: bool,
    /// Apply the config's dropout (training mode).
    pub dropout: bool,
    /// A classification loss's label smoothing ε, as PyTorch's
    /// `CrossEntropyLoss(label_smoothing=ε)` (0: none; ignored without `with_loss`).
    pub label_smoothing: f64,
    /// Whether the layers compute the padding: [`Padding::Skipped`] only without `with_loss`
    /// (an inference graph).
    pub padding: Padding,
}

impl<'a> GraphOptions<'a> {
    /// A self-contained inference graph: `params` embedded, no loss, no dropout.
    pub fn inference(params: &'a [f32], padding: Padding) -> Self {
        GraphOptions {
            params: Params::Embedded(params),
            with_loss: false,
            dropout: false,
            label_smoothing: 0.0,
            padding,
        }
    }
}

/// A built forward graph.
#[derive(Debug, Clone)]
pub struct ForwardGraph {
    /// The graph.
    pub graph: Graph,
    /// The `logits` output.
    pub logits: Value,
    /// The `loss` output, when asked for.
    pub loss: Option<Value>,
    /// The parameter values (graph inputs or initialisers), in layout order.
    pub params: Vec<Value>,
}

/// Builds the forward graph of `config` over the parameters of `layout`.
pub fn forward_graph(
    config: &ModelConfig,
    layout: &ParamLayout,
    options: &GraphOptions<'_>,
) -> Result<ForwardGraph, ModelError> {
    if let Params::Embedded(values) = options.params {
        layout.check_len(values.len())?;
    }
    if options.with_loss && options.padding == Padding::Skipped {
        let why = "a graph with a loss (training) computes the padding: Padding::Skipped is for inference";
        return Err(ringtune_onnx_ir::IrError::Invalid(why.into()).into());
    }
    let mut b = Builder {
        g: Graph::new("bert_for_sequence_classification"),
        config,
        layout,
        options: *options,
        params: Vec::new(),
    };
    let (logits, loss) = b.build()?;
    Ok(ForwardGraph { graph: b.g, logits, loss, params: b.params })
}

pub(crate) struct Builder<'a> {
    pub(crate) g: Graph,
    pub(crate) config: &'a ModelConfig,
    layout: &'a ParamLayout,
    options: GraphOptions<'a>,
    params: Vec<Value>,
}

/// Where a padded batch's real tokens are (see [`Padding::Skipped`]).
struct RealTokens {
    /// `[tokens]`: the flat (`batch * seq`) positions of the real tokens, in order.
    positions: Value,
    /// `[batch * seq]`: the row of the real tokens' hidden states that fills each position.
    rows: Value,
    /// `[batch]`: each sequence's first token among the real tokens' rows.
    first_rows: Value,
    /// `[batch]`: each sequence's first flat position.
    first_positions: Value,
}

/// What every layer's attention scores take besides the layer's own projections.
#[derive(Clone, Copy)]
struct Attention<'a> {
    /// `[batch, 1, 1, seq]`: 0 at real tokens, `f32::MIN` at padding.
    mask: &'a Value,
    /// `[batch, seq, heads, head size]` as a shape.
    split_heads: &'a Value,
    /// `[1, heads, seq, seq]` added to the scores where the family has it (MPNet).
    bias: Option<&'a Value>,
}

/// The rows an encoder layer's hidden states hold.
#[derive(Clone, Copy)]
enum Tokens<'a> {
    /// Every position of the padded batch.
    Padded,
    /// The real tokens alone, in and out.
    Real(&'a RealTokens),
    /// The real tokens in; out, each sequence's first token alone (the last layer).
    RealThenFirst(&'a RealTokens),
}

impl<'a> Tokens<'a> {
    fn real(self) -> Option<&'a RealTokens> {
        match self {
            Tokens::Padded => None,
            Tokens::Real(real) | Tokens::RealThenFirst(real) => Some(real),
        }
    }
}

impl Builder<'_> {
    fn build(&mut self) -> Result<(Value, Option<Value>), ModelError> {
        let c = self.config;
        let batch_seq = shape(&["batch", "seq"]);
        let ids = self.g.input(INPUT_IDS, DType::I64, batch_seq.clone())?;
        let types = if c.reads_token_types() {
            Some(self.g.input(TOKEN_TYPE_IDS, DType::I64, batch_seq.clone())?)
        } else {
            None
        };
        let mask = self.g.input(ATTENTION_MASK, DType::I64, batch_seq)?;
        let labels = if self.options.with_loss {
            let dtype = match c.problem {
                ProblemType::SingleLabel => DType::I64,
                ProblemType::Regression => DType::F32,
            };
            Some(self.g.input(LABELS, dtype, vec![Dim::sym("batch")])?)
        } else {
            None
        };
        // Declare every parameter first, in layout order, so graph inputs follow the layout.
        for entry in self.layout.entries() {
            let v = match self.options.params {
                Params::Inputs => self.g.input(&entry.name, DType::F32, shape(&entry.dims_i64()))?,
                Params::Embedded(values) => {
                    self.g.initializer(&entry.name, Tensor::from_f32(&entry.dims_i64(), &values[entry.range()]))?
                }
            };
            self.params.push(v);
        }

        let dims = self.g.shape_of(&ids)?;
        let rules = c.family.rules();
        let x = rules.embeddings(self, &ids, types.as_ref(), &dims)?;
        let first = match rules.encoder(self, &x, &mask, &dims)? {
            Some(pooled) => pooled,
            None => self.shared_encoder(&x, &mask, &dims)?,
        };
        let logits = rules.head(self, &first)?;
        let logits = self.g.output_as(&logits, LOGITS)?;
        let loss = match labels {
            Some(labels) => {
                let loss = self.loss(&logits, &labels)?;
                Some(self.g.output_as(&loss, LOSS)?)
            }
            None => None,
        };
        Ok((logits, loss))
    }

    /// The shared layers over the embeddings `x`, then each sequence's first token
    /// (`[batch, hidden]`).
    fn shared_encoder(&mut self, x: &Value, mask: &Value, dims: &Value) -> Result<Value, ModelError> {
        let c = self.config;
        let rules = c.family.rules();
        let position_bias = rules.position_bias(self, dims)?;
        let h = c.hidden_size as i64;
        let mut x = self.g.reshape(x, &[-1, h])?;
        let real = match self.options.padding {
            Padding::Computed => None,
            Padding::Skipped => Some(self.real_tokens(mask, dims)?),
        };
        if let Some(real) = &real {
            x = self.g.gather(&x, &real.positions, 0)?;
        }
        let additive_mask = self.additive_mask(mask)?;
        let split_heads = self.split_heads(dims)?;
        for layer in 0..c.num_layers {
            self.g.push_scope(&layer_scope(layer));
            let names = rules
                .layer_names(c, layer)
                .ok_or_else(|| ringtune_onnx_ir::IrError::Invalid(format!("{:?} has no shared layers", c.family)))?;
            let tokens = match &real {
                None => Tokens::Padded,
                Some(real) if layer + 1 == c.num_layers => Tokens::RealThenFirst(real),
                Some(real) => Tokens::Real(real),
            };
            let attention = Attention { mask: &additive_mask, split_heads: &split_heads, bias: position_bias.as_ref() };
            x = self.encoder_layer(&names, &x, attention, tokens)?;
            self.g.pop_scope();
        }
        self.first_tokens(&x, dims, real.as_ref())
    }

    /// `[batch, seq, heads, head size]` as a shape, from the batch's `dims`.
    pub(crate) fn split_heads(&mut self, dims: &Value) -> Result<Value, ModelError> {
        let c = self.config;
        let heads = self.g.const_i64(&[c.num_heads as i64, c.head_size() as i64])?;
        Ok(self.g.concat(&[dims, &heads], 0)?)
    }

    /// The loss Hugging Face's heads compute: mean cross-entropy over the classes (with label
    /// smoothing where asked), or for a regression the mean of `(logits.squeeze() - labels)^2`.
    fn loss(&mut self, logits: &Value, labels: &Value) -> Result<Value, ModelError> {
        match self.config.problem {
            ProblemType::SingleLabel if self.options.label_smoothing > 0.0 => {
                // PyTorch's smoothed cross-entropy: (1 - ε) NLL + ε times the mean over rows and
                // classes of -log p (the loss against a target spread evenly over the classes).
                let epsilon = self.options.label_smoothing;
                let nll = self.g.softmax_cross_entropy(logits, labels)?.0;
                let log_probs = self.g.log_softmax(logits, 1)?;
                let total = self.g.reduce_sum(&log_probs, &[0, 1], false)?;
                let rows = self.batch_rows(labels)?;
                let per_row = self.g.div(&total, &rows)?;
                let kept = self.g.scale(&nll, 1.0 - epsilon)?;
                let spread = self.g.scale(&per_row, -epsilon / self.config.num_labels as f64)?;
                Ok(self.g.add(&kept, &spread)?)
            }
            ProblemType::SingleLabel => Ok(self.g.softmax_cross_entropy(logits, labels)?.0),
            ProblemType::Regression => {
                let scores = self.g.reshape(logits, &[-1])?;
                let error = self.g.sub(&scores, labels)?;
                let squared = self.g.mul(&error, &error)?;
                let total = self.g.reduce_sum(&squared, &[0], false)?;
                let rows = self.batch_rows(labels)?;
                Ok(self.g.div(&total, &rows)?)
            }
        }
    }

    /// The batch's rows as a float, counted from the labels, which no gradient flows into.
    fn batch_rows(&mut self, labels: &Value) -> Result<Value, ModelError> {
        let dims = self.g.shape_of(labels)?;
        let zero = self.g.constant(Tensor::scalar_i64(0))?;
        let rows = self.g.gather(&dims, &zero, 0)?;
        Ok(self.g.cast(&rows, DType::F32)?)
    }

    pub(crate) fn param(&self, name: &str) -> Result<Value, ModelError> {
        match self.layout.entries().iter().position(|e| e.name == name) {
            Some(i) => Ok(self.params[i].clone()),
            None => Err(ringtune_onnx_ir::IrError::UnknownValue(name.to_string()).into()),
        }
    }

    /// Each sequence's first token (`[batch, hidden]`) of the last layer's output `x`, whose rows
    /// `real` says (the padded batch's when `None`).
    fn first_tokens(&mut self, x: &Value, dims: &Value, real: Option<&RealTokens>) -> Result<Value, ModelError> {
        let h = self.config.hidden_size as i64;
        match real {
            // The last layer left each sequence's first token alone.
            Some(_) if self.config.num_layers > 0 => Ok(x.clone()),
            Some(real) => Ok(self.g.gather(x, &real.first_rows, 0)?),
            None => {
                let hidden = self.g.const_i64(&[h])?;
                let unflatten = self.g.concat(&[dims, &hidden], 0)?;
                let x3 = self.g.reshape_to(x, &unflatten)?;
                let first = self.g.slice(&x3, &[0], &[1], &[1])?;
                Ok(self.g.reshape(&first, &[-1, h])?)
            }
        }
    }

    /// Where a batch's real tokens are, from its 0/1 `mask` (`[batch, seq]`, whose shape is `dims`).
    fn real_tokens(&mut self, mask: &Value, dims: &Value) -> Result<RealTokens, ModelError> {
        let zero = self.g.constant(Tensor::scalar_i64(0))?;
        let one = self.g.constant(Tensor::scalar_i64(1))?;
        let flat = self.g.reshape(mask, &[-1])?;
        let found = self.g.non_zero(&flat)?;
        let positions = self.g.reshape(&found, &[-1])?;
        // A real token's row is the count of real tokens up to it, less one; a padded position
        // takes the row of the real token before it (row 0 when none is).
        let counted = self.g.cumsum(&flat, 0)?;
        let rows = self.g.sub(&counted, &one)?;
        let rows = self.g.max(&rows, &zero)?;
        let by_sequence = self.g.reshape_to(&rows, dims)?;
        let first_rows = self.g.gather(&by_sequence, &zero, 1)?;
        let batch = self.g.gather(dims, &zero, 0)?;
        let seq = self.g.gather(dims, &one, 0)?;
        let padded = self.g.mul(&batch, &seq)?;
        let first_positions = self.g.range(&zero, &padded, &seq)?;
        Ok(RealTokens { positions, rows, first_rows, first_positions })
    }

    /// `(1 - mask) * f32::MIN` as `[batch, 1, 1, seq]`, added to attention scores.
    pub(crate) fn additive_mask(&mut self, mask: &Value) -> Result<Value, ModelError> {
        let m = self.g.cast(mask, DType::F32)?;
        let one = self.g.scalar(DType::F32, 1.0)?;
        let inverted = self.g.sub(&one, &m)?;
        let additive = self.g.scale(&inverted, f32::MIN as f64)?;
        Ok(self.g.unsqueeze(&additive, &[1, 2])?)
    }

    /// One encoder layer. `x` holds the rows `tokens` says.
    fn encoder_layer(
        &mut self,
        names: &LayerNames,
        x: &Value,
        Attention { mask, split_heads, bias: position_bias }: Attention<'_>,
        tokens: Tokens<'_>,
    ) -> Result<Value, ModelError> {
        let c = self.config;
        let heads = |b: &mut Self, projected: Value, perm: &[i64]| -> Result<Value, ModelError> {
            let projected = match tokens.real() {
                Some(real) => b.g.gather(&projected, &real.rows, 0)?,
                None => projected,
            };
            let split = b.g.reshape_to(&projected, split_heads)?;
            Ok(b.g.transpose(&split, perm)?)
        };
        let q = self.dense(x, &names.query)?;
        let q = heads(self, q, &[0, 2, 1, 3])?;
        // The key bias adds `q_i . b_k` to every score of row i, which softmax cancels exactly:
        // it cannot change the output, so the graph leaves it out and its gradient is exactly
        // zero (computing it would only add rounding noise that Adam would then amplify).
        let k = self.dense_without_bias(x, &names.key)?;
        let k = heads(self, k, &[0, 2, 3, 1])?;
        let v = self.dense(x, &names.value)?;
        let v = heads(self, v, &[0, 2, 1, 3])?;
        let q = self.g.scale(&q, 1.0 / (c.head_size() as f64).sqrt())?;
        let scores = self.g.matmul(&q, &k)?;
        let scores = match position_bias {
            Some(bias) => self.g.add(&scores, bias)?,
            None => scores,
        };
        let context = self.attend(&scores, mask, &v)?;
        let (context, x) = match tokens {
            Tokens::Padded => (context, x.clone()),
            Tokens::Real(real) => (self.g.gather(&context, &real.positions, 0)?, x.clone()),
            Tokens::RealThenFirst(real) => {
                (self.g.gather(&context, &real.first_positions, 0)?, self.g.gather(x, &real.first_rows, 0)?)
            }
        };
        self.post_norm_output(names, &context, &x)
    }

    /// The attention's probabilities and what they read: `scores` plus the additive `mask`,
    /// softmax over the keys, dropout, times `v` (`[batch, heads, seq, head size]`), as rows
    /// `[batch * seq, hidden]`.
    pub(crate) fn attend(&mut self, scores: &Value, mask: &Value, v: &Value) -> Result<Value, ModelError> {
        let c = self.config;
        let scores = self.g.add(scores, mask)?;
        let probs = self.g.softmax(&scores, -1)?;
        let probs = self.dropout(&probs, c.attention_dropout)?;
        let context = self.g.matmul(&probs, v)?;
        let context = self.g.transpose(&context, &[0, 2, 1, 3])?;
        Ok(self.g.reshape(&context, &[-1, c.hidden_size as i64])?)
    }

    /// A post-norm layer past its attention: the output projection of `context` (with the
    /// family's dropout) added to `x` and normalised, then the GELU feed-forward block added and
    /// normalised.
    pub(crate) fn post_norm_output(
        &mut self,
        names: &LayerNames,
        context: &Value,
        x: &Value,
    ) -> Result<Value, ModelError> {
        let c = self.config;
        let attended = self.dense(context, &names.attention_out)?;
        let attended = if c.family.rules().attention_output_dropout() {
            self.dropout(&attended, c.hidden_dropout)?
        } else {
            attended
        };
        let attended = self.g.add(&attended, x)?;
        let attended = self.layer_norm(&attended, &names.attention_norm)?;

        let inner = self.dense(&attended, &names.intermediate)?;
        let inner = self.g.gelu(&inner)?;
        let out = self.dense(&inner, &names.output)?;
        let out = self.dropout(&out, c.hidden_dropout)?;
        let out = self.g.add(&out, &attended)?;
        self.layer_norm(&out, &names.output_norm)
    }

    /// `x @ W^T` for a Hugging Face linear layer named `prefix`, its bias (if any) left out.
    pub(crate) fn dense_without_bias(&mut self, x: &Value, prefix: &str) -> Result<Value, ModelError> {
        let w = self.param(&format!("{prefix}.weight"))?;
        Ok(self.g.gemm(x, &w, None, false, true)?)
    }

    /// `x @ W^T + b` for a Hugging Face linear layer named `prefix`.
    pub(crate) fn dense(&mut self, x: &Value, prefix: &str) -> Result<Value, ModelError> {
        let w = self.param(&format!("{prefix}.weight"))?;
        let b = self.param(&format!("{prefix}.bias"))?;
        Ok(self.g.gemm(x, &w, Some(&b), false, true)?)
    }

    pub(crate) fn layer_norm(&mut self, x: &Value, prefix: &str) -> Result<Value, ModelError> {
        let scale = self.param(&format!("{prefix}.weight"))?;
        let bias = self.param(&format!("{prefix}.bias"))?;
        Ok(self.g.layer_norm(x, &scale, &bias, self.config.layer_norm_eps as f32)?.y)
    }

    pub(crate) fn dropout(&mut self, x: &Value, p: f64) -> Result<Value, ModelError> {
        if self.options.dropout && p > 0.0 {
            Ok(self.g.dropout(x, p as f32)?.y)
        } else {
            Ok(x.clone())
        }
    }
}

/// A self-contained inference model (parameters embedded; inputs ids, mask, and token types
/// for families that have them; output
/// logits) as ONNX bytes, loadable by ONNX Runtime in any language.
pub fn export_inference(config: &ModelConfig, layout: &ParamLayout, params: &[f32]) -> Result<Vec<u8>, ModelError> {
    let mut forward = forward_graph(config, layout, &GraphOptions::inference(params, Padding::Computed))?;
    forward.graph.prune();
    Ok(forward.graph.to_bytes()?)
}

/// The scope that names the nodes of encoder layer `layer` (`layer3` makes `layer3/MatMul_12`).
pub fn layer_scope(layer: usize) -> String {
    format!("layer{layer}")
}

/// The name prefix of every node of each encoder layer, in layer order.
pub fn layer_prefixes(config: &ModelConfig) -> Vec<String> {
    (0..config.num_layers).map(|layer| format!("{}/", layer_scope(layer))).collect()
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn only_an_inference_graph_skips_the_padding() {
        let config = ModelConfig::from_json(
            r#"{"vocab_size": 30, "hidden_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2,
                "intermediate_size": 16, "max_position_embeddings": 10}"#,
            Path::new("config.json"),
        )
        .expect("config");
        let layout = crate::layout(&config);
        let graph = |with_loss, padding| {
            let options =
                GraphOptions { params: Params::Inputs, with_loss, dropout: false, label_smoothing: 0.0, padding };
            forward_graph(&config, &layout, &options)
        };
        assert!(graph(true, Padding::Skipped).is_err(), "a training graph computes the padding");
        let count = |padding, op: &str| {
            let graph = graph(false, padding).expect("inference graph").graph;
            graph.nodes().iter().filter(|n| n.op_type == op).count()
        };
        assert_eq!(count(Padding::Skipped, "NonZero"), 1);
        // The real tokens gathered after the embeddings; in each layer the query, key and value
        // spread over the padded positions and the attention's output gathered back (the last
        // layer's at the first tokens, with its input); three more for the first tokens' rows
        // and positions. The padded graph's slice of the first tokens goes.
        let gathers = count(Padding::Skipped, "Gather") - count(Padding::Computed, "Gather");
        assert_eq!(gathers, 1 + 2 * 4 + 1 + 3);
        assert_eq!((count(Padding::Skipped, "Slice"), count(Padding::Computed, "Slice")), (0, 1));
    }
}
