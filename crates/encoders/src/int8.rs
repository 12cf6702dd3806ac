//! The int8 inference model: the inference export with its linear layers' weights in int8.
//!
//! Every `Gemm` of the inference graph whose weight is embedded (`x @ W^T + b`, the Hugging
//! Face linear layers) becomes ONNX Runtime's `com.microsoft.MatMulIntegerToFloat`: the weight
//! stored as int8 (or uint8 around 128, see [`WeightRange`]), symmetric, one scale per output
//! channel; its input quantized per batch (uint8, its own scale and zero point) by one
//! `DynamicQuantizeLinear` that the layers reading the same input share (query, key and value);
//! an integer matmul (VNNI where the CPU has it) scaled back to float, plus the float bias. The
//! feed-forward block's layers need more (see [`FeedForwardInput`]): the one reading the GELU
//! has its input quantized per row, one scale a token (uint8, symmetric around 128), as the
//! GELU's long tail left one scale a batch too coarse for the many small values (MPNet on MRPC
//! lost 2.9 points with it); the one feeding the GELU reads a LayerNorm whose output reaches
//! 26-65 in a few channels (MPNet), so by default its input is smoothed per channel before one
//! scale a batch quantizes it. Every embedding table (a `Gather` of rows from an embedded
//! `[rows, width]` table) is stored as int8 with one scale per row, its gathered rows cast back
//! to float and scaled: the word embeddings are half of a small model's bytes. Built on the
//! inference graph that skips the padding ([`crate::Padding::Skipped`]), the per-batch scales
//! come from the real tokens alone, so the logits no longer depend on how much padding the
//! batch holds ([`crate::Padding::Computed`] builds it on the padded graph, to compare). The stock CPU
//! build of ONNX Runtime runs it, from any language. The weights the caller keeps in float stay
//! as they were; LayerNorm, softmax and the attention matmuls are float throughout.
//!
//! What it does not do: run the model. The calibration that smoothing needs (the largest
//! input of each channel over some rows) is the caller's, on [`calibration_graph`].

use std::collections::{BTreeMap, HashMap};

use ringtune_onnx_ir::{Attribute, DType, Dim, Graph, InferCtx, Node, Tensor, Value, ValueType};

use crate::{forward_graph, GraphOptions, ModelConfig, ModelError, Padding, ParamLayout};

/// ONNX Runtime's domain of contrib operators.
const CONTRIB: &str = "com.microsoft";
const QUANTIZED_LINEAR: &str = "MatMulIntegerToFloat";
const QUANTIZE_INPUT: &str = "DynamicQuantizeLinear";
/// A bound on the magnitude of GELU's negative values: its least value is -0.16997 (erf),
/// -0.17004 (the tanh approximation).
const GELU_LEAST_MAGNITUDE: f32 = 0.1701;
/// The zero point of uint8 values symmetric around it: inputs quantized per row, and the
/// weights of [`WeightRange::Unsigned`].
const ZERO_POINT: u8 = 128;

/// How the weights are rounded and stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WeightRange {
    /// `[-127, 127]`: full precision, for CPUs with VNNI (their uint8 x int8 dot products
    /// accumulate in 32 bits).
    Full,
    /// `[-63, 63]`: one bit less, for CPUs without VNNI, whose uint8 x int8 instructions
    /// (`vpmaddubsw`) add pairs of products in 16 bits and saturate with full-range weights.
    Reduced,
    /// `[-127, 127]` stored as uint8 around a zero point of 128: ONNX Runtime multiplies uint8
    /// by uint8 in 32 bits on any x86 CPU (`vpmaddwd` on AVX2), so without VNNI this computes
    /// what a VNNI CPU computes with [`WeightRange::Full`], exactly, at about 1.3x the int8
    /// matmul's time (a Zen 3).
    Unsigned,
}

impl WeightRange {
    fn limit(self) -> f32 {
        match self {
            WeightRange::Full | WeightRange::Unsigned => 127.0,
            WeightRange::Reduced => 63.0,
        }
    }
}

impl std::fmt::Display for WeightRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            WeightRange::Full => "8-bit",
            WeightRange::Reduced => "7-bit",
            WeightRange::Unsigned => "8-bit unsigned",
        })
    }
}

/// The largest magnitude each input channel of a linear layer took over some calibration rows,
/// by the layer's weight name (see [`calibration_graph`]).
pub type InputMaxima = HashMap<String, Vec<f32>>;

/// How the feed-forward block's first layer (the one feeding a GELU) has its input quantized;
/// the second (reading the GELU) has its input per token always.
#[derive(Debug, Clone, Copy)]
pub enum FeedForwardInput<'a> {
    /// Per batch after smoothing (SmoothQuant, with alpha 1/2): input channel `j` divided by
    /// `s_j = sqrt(a_j / w_j)` and the weight's column `j` multiplied by it (the product
    /// unchanged), `a_j` the channel's calibrated largest magnitude, `w_j` the column's. Both
    /// then span `sqrt(a_j * w_j)`: the few channels of outlying inputs no longer set the
    /// batch's step for all the others. It costs one product of the input (`[tokens, width]`)
    /// where per token costs two reductions of it and a product of the wider output.
    Smoothed(&'a InputMaxima),
    /// Per token, as the second layer.
    PerToken,
    /// Per batch, as the attention's layers.
    PerBatch,
}

/// What the int8 export did (weights by name).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Int8Report {
    /// The linear layers whose weights are int8.
    pub linear: Vec<String>,
    /// Those of them whose input is quantized per row (token) rather than per batch.
    pub per_row: Vec<String>,
    /// Those of them whose input is smoothed per channel (see [`FeedForwardInput::Smoothed`]).
    pub smoothed: Vec<String>,
    /// The embedding tables stored as int8.
    pub tables: Vec<String>,
    /// The weights kept in float.
    pub kept_float: Vec<String>,
}

/// The int8 inference model as ONNX bytes, and what it quantized: every linear layer and
/// embedding table whose weight's name `keep_float` does not claim. With [`Padding::Skipped`]
/// (what `ringtune quantize` writes) the layers skip the padding, and the inputs quantized per
/// batch take their ranges from the real tokens alone.
pub fn export_inference_int8(
    config: &ModelConfig,
    layout: &ParamLayout,
    params: &[f32],
    range: WeightRange,
    feed_forward: FeedForwardInput<'_>,
    keep_float: &dyn Fn(&str) -> bool,
    padding: Padding,
) -> Result<(Vec<u8>, Int8Report), ModelError> {
    let mut graph = forward_graph(config, layout, &GraphOptions::inference(params, padding))?.graph;
    let report = quantize_linear_layers(&mut graph, range, feed_forward, keep_float)?;
    graph.prune();
    Ok((graph.to_bytes()?, report))
}

/// The float inference model that calibrates [`FeedForwardInput::Smoothed`].
#[derive(Debug, Clone)]
pub struct CalibrationGraph {
    /// The model, its weights embedded, as ONNX bytes.
    pub model: Vec<u8>,
    /// The layers it smooths, as (weight name, name of the model's output that is its input).
    pub layers: Vec<(String, String)>,
}

/// The float inference model (weights embedded) with one more output for each layer that
/// [`FeedForwardInput::Smoothed`] smooths, its input (`[tokens, width]`, padding included).
pub fn calibration_graph(
    config: &ModelConfig,
    layout: &ParamLayout,
    params: &[f32],
) -> Result<CalibrationGraph, ModelError> {
    let mut graph = forward_graph(config, layout, &GraphOptions::inference(params, Padding::Computed))?.graph;
    let mut layers = Vec::new();
    for node in graph.nodes() {
        if let Some(linear) = Linear::of(&graph, node).filter(|l| l.feeds_gelu(&graph)) {
            layers.push((linear.weight_name, linear.input));
        }
    }
    for (_, input) in &layers {
        graph.output(&Value::named(input.as_str()))?;
    }
    Ok(CalibrationGraph { model: graph.to_bytes()?, layers })
}

/// Rewrites `graph`'s linear layers (`Gemm`s of an embedded weight) and embedding tables (see
/// the module doc), those whose weight's name `keep_float` claims left in float.
pub fn quantize_linear_layers(
    graph: &mut Graph,
    range: WeightRange,
    feed_forward: FeedForwardInput<'_>,
    keep_float: &dyn Fn(&str) -> bool,
) -> Result<Int8Report, ModelError> {
    graph.register_op(CONTRIB, QUANTIZED_LINEAR, quantized_linear_shape);
    graph.register_op("", QUANTIZE_INPUT, quantize_input_shape);
    graph.register_op("", "QuantizeLinear", quantize_linear_shape);
    let mut report = Int8Report::default();
    // Each float input's quantized form (value, scale, zero point), made once.
    let mut quantized_inputs: HashMap<String, [String; 3]> = HashMap::new();
    let mut index = 0;
    while index < graph.nodes().len() {
        let node = &graph.nodes()[index];
        if let Some(linear) = Linear::of(graph, node) {
            if keep_float(&linear.weight_name) {
                report.kept_float.push(linear.weight_name);
            } else if linear.reads_gelu(graph)
                || (matches!(feed_forward, FeedForwardInput::PerToken) && linear.feeds_gelu(graph))
            {
                index += linear.quantize_per_row(graph, index, range)?;
                report.per_row.push(linear.weight_name.clone());
                report.linear.push(linear.weight_name);
            } else if let (FeedForwardInput::Smoothed(maxima), true) = (feed_forward, linear.feeds_gelu(graph)) {
                let (smoothed, inverse) = linear.smoothed(maxima)?;
                let inverse = graph.initializer(&format!("{}_smoothing", linear.weight_name), inverse)?;
                let input = graph.fresh_name(&format!("{}_smoothed", linear.input));
                let inputs = vec![linear.input.clone(), inverse.name().to_string()];
                let product = standard_node(graph, "Mul", inputs, vec![input.clone()], None);
                graph.insert_node(index, product)?;
                let quantized = quantize_input(graph, index + 1, &input)?;
                index += 2;
                let node = smoothed.quantized(graph, range, quantized)?;
                graph.replace_node(index, node)?;
                report.smoothed.push(linear.weight_name.clone());
                report.linear.push(linear.weight_name);
            } else {
                let input = match quantized_inputs.get(&linear.input) {
                    Some(q) => q.clone(),
                    None => {
                        let q = quantize_input(graph, index, &linear.input)?;
                        index += 1;
                        quantized_inputs.insert(linear.input.clone(), q.clone());
                        q
                    }
                };
                let node = linear.quantized(graph, range, input)?;
                graph.replace_node(index, node)?;
                report.linear.push(linear.weight_name);
            }
        } else if let Some(table) = Table::of(graph, node) {
            if keep_float(&table.name) {
                report.kept_float.push(table.name);
            } else {
                index += table.quantize(graph, index)?;
                report.tables.push(table.name);
            }
        }
        index += 1;
    }
    Ok(report)
}

/// A `Gather` of rows (axis 0) from an embedded float table `[rows, width]`.
struct Table {
    name: String,
    indices: String,
    output: String,
    values: Vec<f32>,
    width: usize,
}

impl Table {
    fn of(graph: &Graph, node: &Node) -> Option<Table> {
        if node.op_type != "Gather" || !node.domain.is_empty() || node.int("axis").unwrap_or(0) != 0 {
            return None;
        }
        let name = node.input(0)?.to_string();
        let table = graph.constant_value(&name)?;
        let (DType::F32, &[_, width]) = (table.dtype, table.dims.as_slice()) else { return None };
        Some(Table {
            indices: node.input(1)?.to_string(),
            output: node.outputs.first()?.clone(),
            values: table.to_f32()?,
            width: usize::try_from(width).ok().filter(|&w| w > 0)?,
            name,
        })
    }

    /// Replaces the `Gather` at `index` by a gather of int8 rows, a cast to float and a product
    /// with the gathered rows' scales; returns how many nodes went in before it.
    fn quantize(&self, graph: &mut Graph, index: usize) -> Result<usize, ModelError> {
        let rows = self.values.len() / self.width;
        let (q, scales) = quantize_rows(&self.values, self.width, 127.0);
        let (r, w) = (rows as i64, self.width as i64);
        let table = graph.initializer(&format!("{}_int8", self.name), Tensor::from_i8(&[r, w], &q))?;
        // `[rows, 1]`: the gathered scales broadcast over each row's width.
        let scale = graph.initializer(&format!("{}_scale", self.name), Tensor::from_f32(&[r, 1], &scales))?;
        let node = |graph: &mut Graph, op: &str, inputs: Vec<String>, attribute: Option<(&str, i64)>| {
            let output = graph.fresh_name(&op.to_ascii_lowercase());
            standard_node(graph, op, inputs, vec![output], attribute)
        };
        let gathered = node(graph, "Gather", vec![table.name().into(), self.indices.clone()], None);
        let widened = node(graph, "Cast", vec![gathered.outputs[0].clone()], Some(("to", DType::F32.onnx() as i64)));
        let row_scales = node(graph, "Gather", vec![scale.name().into(), self.indices.clone()], None);
        let inputs = vec![widened.outputs[0].clone(), row_scales.outputs[0].clone()];
        let scaled = standard_node(graph, "Mul", inputs, vec![self.output.clone()], None);
        let before = [gathered, widened, row_scales];
        let inserted = before.len();
        for (offset, n) in before.into_iter().enumerate() {
            graph.insert_node(index + offset, n)?;
        }
        graph.replace_node(index + inserted, scaled)?;
        Ok(inserted)
    }
}

/// A node of the standard domain with at most one integer attribute.
fn standard_node(
    graph: &mut Graph,
    op: &str,
    inputs: Vec<String>,
    outputs: Vec<String>,
    attribute: Option<(&str, i64)>,
) -> Node {
    Node {
        name: graph.fresh_name(op),
        op_type: op.into(),
        domain: String::new(),
        inputs,
        outputs,
        attributes: attribute.map(|(k, v)| (k.to_string(), Attribute::Int(v))).into_iter().collect::<BTreeMap<_, _>>(),
    }
}

/// `values` (rows of `width`) as integers in `[-limit, limit]`, symmetric with one scale per
/// row: `v ≈ q * scale`.
fn quantize_rows(values: &[f32], width: usize, limit: f32) -> (Vec<i8>, Vec<f32>) {
    let scales: Vec<f32> = values.chunks_exact(width).map(|row| symmetric_scale(row, limit)).collect();
    let q = values
        .chunks_exact(width)
        .zip(&scales)
        .flat_map(|(row, scale)| row.iter().map(move |v| (v / scale).round().clamp(-limit, limit) as i8))
        .collect();
    (q, scales)
}

/// The scale that maps `values`' largest magnitude to `limit` (any positive one for zeros,
/// which round to 0 either way).
fn symmetric_scale(values: &[f32], limit: f32) -> f32 {
    let largest = values.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    if largest > 0.0 {
        largest / limit
    } else {
        1.0
    }
}

/// A `Gemm` computing `x @ W^T + b` with `W` (`[out, in]`) and `b` embedded.
#[derive(Clone)]
struct Linear {
    node_name: String,
    input: String,
    output: String,
    weight_name: String,
    weight: Vec<f32>,
    outputs: usize,
    inputs: usize,
    bias: Option<String>,
}

impl Linear {
    fn of(graph: &Graph, node: &Node) -> Option<Linear> {
        let plain = node.op_type == "Gemm"
            && node.domain.is_empty()
            && node.int("transB") == Some(1)
            && node.int("transA").unwrap_or(0) == 0
            && node.float("alpha").unwrap_or(1.0) == 1.0
            && node.float("beta").unwrap_or(1.0) == 1.0;
        if !plain {
            return None;
        }
        let weight_name = node.input(1)?.to_string();
        let weight = graph.constant_value(&weight_name)?;
        let &[outputs, inputs] = weight.dims.as_slice() else { return None };
        let bias = match node.input(2) {
            Some(b) => {
                let t = graph.constant_value(b)?;
                Some((t.dtype == DType::F32 && t.dims == [outputs]).then(|| b.to_string())?)
            }
            None => None,
        };
        Some(Linear {
            node_name: node.name.clone(),
            input: node.input(0)?.to_string(),
            output: node.outputs.first()?.clone(),
            weight: weight.to_f32()?,
            weight_name,
            outputs: usize::try_from(outputs).ok()?,
            inputs: usize::try_from(inputs).ok()?,
            bias,
        })
    }

    /// The node that replaces this layer's `Gemm`, reading its input as `input` quantized
    /// (value, scale, zero point); its int8 weight, scales and zero points are added to the
    /// graph as initialisers.
    fn quantized(&self, graph: &mut Graph, range: WeightRange, input: [String; 3]) -> Result<Node, ModelError> {
        let [weight, scale, zero] = self.int8_weight(graph, range)?;
        let [value, input_scale, input_zero] = input;
        let mut inputs = vec![value, weight, input_scale, scale, input_zero, zero];
        inputs.extend(self.bias.clone());
        Ok(Node {
            name: format!("{}_int8", self.node_name),
            op_type: QUANTIZED_LINEAR.into(),
            domain: CONTRIB.into(),
            inputs,
            outputs: vec![self.output.clone()],
            attributes: Default::default(),
        })
    }

    /// The weight as `[inputs, outputs]` (int8, or uint8 for [`WeightRange::Unsigned`]), its
    /// scale and zero point per output, added to the graph as initialisers; their names.
    fn int8_weight(&self, graph: &mut Graph, range: WeightRange) -> Result<[String; 3], ModelError> {
        let names = ["int8", "scale", "zero_point"].map(|part| format!("{}_{part}", self.weight_name));
        // A weight two products share (DeBERTa's key projection reads the tokens and the
        // relative positions) is quantized once.
        if names.iter().all(|name| graph.has_value(name)) {
            return Ok(names);
        }
        let (q, scales) = quantize_per_output(&self.weight, self.outputs, self.inputs, range);
        let (k, n) = (self.inputs as i64, self.outputs as i64);
        let (weight, zero) = match range {
            WeightRange::Unsigned => {
                let unsigned: Vec<u8> = q.iter().map(|&v| (i16::from(v) + i16::from(ZERO_POINT)) as u8).collect();
                (Tensor::from_u8(&[k, n], &unsigned), Tensor::from_u8(&[n], &vec![ZERO_POINT; self.outputs]))
            }
            WeightRange::Full | WeightRange::Reduced => {
                (Tensor::from_i8(&[k, n], &q), Tensor::from_i8(&[n], &vec![0; self.outputs]))
            }
        };
        let [weight_name, scale_name, zero_name] = &names;
        graph.initializer(weight_name, weight)?;
        graph.initializer(scale_name, Tensor::from_f32(&[n], &scales))?;
        graph.initializer(zero_name, zero)?;
        Ok(names)
    }

    /// This layer with its weight's input columns multiplied by the smoothing factors of
    /// `maxima`'s entry for it (see [`FeedForwardInput::Smoothed`]), and the factors' inverses
    /// (`[inputs]`) that its input takes. A channel that calibration never saw away from zero,
    /// or whose column is zero, keeps a factor of 1.
    fn smoothed(&self, maxima: &InputMaxima) -> Result<(Linear, Tensor), ModelError> {
        let inputs = self.inputs;
        let calibrated =
            maxima.get(&self.weight_name).filter(|m| m.len() == inputs).ok_or_else(|| ModelError::Calibration {
                weight: self.weight_name.clone(),
                found: maxima.get(&self.weight_name).map_or(0, Vec::len),
                expected: inputs,
            })?;
        let mut column_max = vec![0.0f32; inputs];
        for row in self.weight.chunks_exact(inputs.max(1)) {
            for (m, w) in column_max.iter_mut().zip(row) {
                *m = m.max(w.abs());
            }
        }
        let factors: Vec<f32> = calibrated
            .iter()
            .zip(&column_max)
            .map(|(&a, &w)| {
                let s = (a / w).sqrt();
                if a > 0.0 && w > 0.0 && s.is_normal() {
                    s
                } else {
                    1.0
                }
            })
            .collect();
        let mut weight = self.weight.clone();
        for row in weight.chunks_exact_mut(inputs.max(1)) {
            for (w, s) in row.iter_mut().zip(&factors) {
                *w *= s;
            }
        }
        let inverse: Vec<f32> = factors.iter().map(|s| 1.0 / s).collect();
        let smoothed = Linear { weight, ..self.clone() };
        Ok((smoothed, Tensor::from_f32(&[inputs as i64], &inverse)))
    }

    /// Whether the layer's input is a GELU's output.
    fn reads_gelu(&self, graph: &Graph) -> bool {
        graph.producer(&self.input).is_some_and(is_gelu)
    }

    /// Whether the layer's output goes to a GELU alone.
    fn feeds_gelu(&self, graph: &Graph) -> bool {
        let readers = graph.consumers(&self.output);
        !readers.is_empty() && readers.iter().all(|&i| is_gelu(&graph.nodes()[i]))
    }

    /// Replaces this layer's `Gemm` at `index` by a matmul of its input quantized per row:
    /// `q = round(x / s) + 128` with `s = max |x| / 127` along the row (so `q` is in `[1, 255]`;
    /// symmetric, so one zero point serves every row; a GELU's output is above -0.1701, so
    /// there `max(max x, 0.1701)` bounds `|x|` with one reduction, and rows whose every value
    /// stays below 0.1701 share that bound's step), the integer product scaled by the weight's
    /// scales, then by the row's, plus the bias. Unsigned, as the per-batch inputs
    /// are: ONNX Runtime's int8 x int8 product ran 3.4x slower than its uint8 x int8 one on a
    /// Zen 3 (AVX2). One blocked `QuantizeLinear` quantizes: on MiniLM's `[4096, 1536]` it took
    /// 2.4 ms against 13.9 ms for `Div`, `Round`, `Add` and `Cast` (ONNX Runtime 1.31.1, 2
    /// threads). Returns how many nodes went in before the layer's place.
    fn quantize_per_row(&self, graph: &mut Graph, index: usize, range: WeightRange) -> Result<usize, ModelError> {
        let [weight, scale, weight_zero] = self.int8_weight(graph, range)?;
        let constant = |graph: &mut Graph, hint: &str, tensor: Tensor| -> Result<String, ModelError> {
            let name = graph.fresh_name(&format!("{}_{hint}", self.node_name));
            Ok(graph.initializer(&name, tensor)?.name().to_string())
        };
        let last_axis = constant(graph, "axis", Tensor::from_i64(&[1], &[-1]))?;
        let per_step = constant(graph, "inverse_limit", Tensor::scalar_f32(1.0 / 127.0))?;
        let unit = constant(graph, "unit_scale", Tensor::scalar_f32(1.0))?;
        let zero_point = constant(graph, "zero_point", Tensor::scalar_u8(ZERO_POINT))?;
        let mut before = Vec::new();
        let mut node = |graph: &mut Graph, op: &str, inputs: Vec<String>, attributes: &[(&str, i64)]| {
            let output = graph.fresh_name(&format!("{}_{}", self.node_name, op.to_ascii_lowercase()));
            let mut n = standard_node(graph, op, inputs, vec![output.clone()], None);
            n.attributes.extend(attributes.iter().map(|(k, v)| (k.to_string(), Attribute::Int(*v))));
            before.push(n);
            output
        };
        let highest = node(graph, "ReduceMax", vec![self.input.clone(), last_axis.clone()], &[("keepdims", 1)]);
        let largest = if self.reads_gelu(graph) {
            // A GELU's output is at least -GELU_LEAST_MAGNITUDE, so the larger of the row's
            // maximum and that bounds its magnitudes: one read of the row, no zero scale.
            let gelu_floor = constant(graph, "gelu_floor", Tensor::scalar_f32(GELU_LEAST_MAGNITUDE))?;
            node(graph, "Max", vec![highest, gelu_floor], &[])
        } else {
            // max |x| as the larger of max x and -min x (no tensor of magnitudes written), and
            // above zero.
            let lowest = node(graph, "ReduceMin", vec![self.input.clone(), last_axis], &[("keepdims", 1)]);
            let negated = node(graph, "Neg", vec![lowest], &[]);
            let smallest = constant(graph, "smallest", Tensor::scalar_f32(f32::MIN_POSITIVE * 127.0))?;
            node(graph, "Max", vec![highest, negated, smallest], &[])
        };
        let row_scale = node(graph, "Mul", vec![largest, per_step], &[]);
        let scale_shape = node(graph, "Shape", vec![row_scale.clone()], &[]);
        let zero_points = node(graph, "Expand", vec![zero_point.clone(), scale_shape], &[]);
        // One block per row: the row's scale and zero point (opset 21's blocked quantization).
        let blocked = [("axis", -1), ("block_size", self.inputs as i64)];
        let quantized =
            node(graph, "QuantizeLinear", vec![self.input.clone(), row_scale.clone(), zero_points], &blocked);
        let product = graph.fresh_name(&format!("{}_product", self.node_name));
        before.push(Node {
            name: format!("{}_int8", self.node_name),
            op_type: QUANTIZED_LINEAR.into(),
            domain: CONTRIB.into(),
            inputs: vec![quantized, weight, unit, scale, zero_point, weight_zero],
            outputs: vec![product.clone()],
            attributes: Default::default(),
        });
        // The last node takes the layer's place (and its output's name).
        let last = match &self.bias {
            Some(bias) => {
                let scaled = graph.fresh_name(&format!("{}_scaled", self.node_name));
                before.push(standard_node(graph, "Mul", vec![product, row_scale], vec![scaled.clone()], None));
                standard_node(graph, "Add", vec![scaled, bias.clone()], vec![self.output.clone()], None)
            }
            None => standard_node(graph, "Mul", vec![product, row_scale], vec![self.output.clone()], None),
        };
        let inserted = before.len();
        for (offset, n) in before.into_iter().enumerate() {
            graph.insert_node(index + offset, n)?;
        }
        graph.replace_node(index + inserted, last)?;
        Ok(inserted)
    }
}

fn is_gelu(node: &Node) -> bool {
    node.op_type == "Gelu" && node.domain.is_empty()
}

/// `weight` (`[outputs, inputs]`, row-major) as int8 `[inputs, outputs]` (the layout of
/// MatMul's right-hand side), symmetric with one scale per output: `w ≈ q * scale`.
fn quantize_per_output(weight: &[f32], outputs: usize, inputs: usize, range: WeightRange) -> (Vec<i8>, Vec<f32>) {
    let (rows, scales) = quantize_rows(weight, inputs.max(1), range.limit());
    let mut q = vec![0i8; outputs * inputs];
    for (o, row) in rows.chunks_exact(inputs.max(1)).enumerate() {
        for (i, &v) in row.iter().enumerate() {
            q[i * outputs + o] = v;
        }
    }
    (q, scales)
}

/// Inserts at `index` the `DynamicQuantizeLinear` of `input`; its three outputs' names.
fn quantize_input(graph: &mut Graph, index: usize, input: &str) -> Result<[String; 3], ModelError> {
    let outputs = ["quantized", "scale", "zero_point"].map(|hint| graph.fresh_name(&format!("{input}_{hint}")));
    let node = standard_node(graph, QUANTIZE_INPUT, vec![input.to_string()], outputs.to_vec(), None);
    graph.insert_node(index, node)?;
    Ok(outputs)
}

/// `DynamicQuantizeLinear(x)`: uint8 `x`'s shape, a float scale, a uint8 zero point.
fn quantize_input_shape(ctx: &InferCtx<'_>) -> Result<Vec<ValueType>, String> {
    let x = ctx.ranked(0)?.clone();
    Ok(vec![ValueType::new(DType::U8, x), ValueType::new(DType::F32, vec![]), ValueType::new(DType::U8, vec![])])
}

/// `QuantizeLinear(x, scale, zero_point)`: `x`'s shape in the zero point's type.
fn quantize_linear_shape(ctx: &InferCtx<'_>) -> Result<Vec<ValueType>, String> {
    let dtype = if ctx.has_input(2) { ctx.dtype(2)? } else { DType::U8 };
    Ok(vec![ValueType::new(dtype, ctx.ranked(0)?.clone())])
}

/// `MatMulIntegerToFloat(A [..., K], B [K, N], ...)`: float `[..., N]`.
fn quantized_linear_shape(ctx: &InferCtx<'_>) -> Result<Vec<ValueType>, String> {
    let a = ctx.ranked(0)?;
    let b = ctx.ranked(1)?;
    let (Some(_), [_, n]) = (a.split_last(), b.as_slice()) else {
        return Err(format!("{QUANTIZED_LINEAR} needs a ranked A and a 2-D B"));
    };
    let mut out: Vec<Dim> = a[..a.len() - 1].to_vec();
    out.push(n.clone());
    Ok(vec![ValueType::new(DType::F32, out)])
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn tiny() -> (ModelConfig, ParamLayout, Vec<f32>) {
        let config = ModelConfig::from_json(
            r#"{"vocab_size": 30, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                "intermediate_size": 128, "max_position_embeddings": 10}"#,
            Path::new("config.json"),
        )
        .expect("config");
        let layout = crate::layout(&config);
        let mut params = vec![0.0; layout.total_len()];
        crate::init_all(&config, &layout, 3, &mut params);
        (config, layout, params)
    }

    #[test]
    fn every_linear_layer_but_the_kept_ones_becomes_an_int8_matmul() {
        let (config, layout, params) = tiny();
        let options = GraphOptions::inference(&params, Padding::Computed);
        let mut graph = forward_graph(&config, &layout, &options).expect("graph").graph;
        let keep = |w: &str| w.contains("classifier");
        let report = quantize_linear_layers(&mut graph, WeightRange::Full, FeedForwardInput::PerToken, &keep)
            .expect("quantized");
        graph.prune();
        // Query, key, value, attention output, intermediate, output, and the pooler.
        assert_eq!(report.linear.len(), 7, "{report:?}");
        assert!(report.linear.contains(&"bert.encoder.layer.0.attention.self.key.weight".to_string()));
        assert_eq!(report.kept_float, vec!["classifier.weight".to_string()]);
        // Words, token types, positions.
        assert_eq!(report.tables.len(), 3, "{report:?}");
        let count = |op: &str| graph.nodes().iter().filter(|n| n.op_type == op).count();
        assert_eq!((count(QUANTIZED_LINEAR), count("Gemm")), (7, 1));
        // One quantized input for query, key and value, one for the attention output and the
        // pooler; the feed-forward layers' inputs are quantized per row, the GELU's output's
        // with one reduction.
        assert_eq!(count(QUANTIZE_INPUT), 3);
        let feed_forward = ["intermediate", "output"].map(|l| format!("bert.encoder.layer.0.{l}.dense.weight"));
        assert_eq!(report.per_row, feed_forward.to_vec());
        assert_eq!((count("QuantizeLinear"), count("ReduceMax"), count("ReduceMin")), (2, 2, 1));
        let int8_rows =
            graph.nodes().iter().filter(|n| n.op_type == "Gather" && n.inputs[0].ends_with("_int8")).count();
        assert_eq!(int8_rows, 3);
        for node in graph.nodes() {
            assert!(node.inputs.iter().all(|i| !i.is_empty()), "{} has an empty input", node.name);
        }
        let int8 = graph.to_bytes().expect("valid").len();
        let float = crate::export_inference(&config, &layout, &params).expect("float").len();
        // The linear layers hold most of the weights; their scales and names add a little.
        assert!(int8 * 2 < float, "int8 {int8} bytes, float {float}");

        // Per token for the layer reading the GELU alone.
        let mut graph = forward_graph(&config, &layout, &options).expect("graph").graph;
        let report = quantize_linear_layers(&mut graph, WeightRange::Full, FeedForwardInput::PerBatch, &keep)
            .expect("quantized");
        assert_eq!(report.per_row, feed_forward[1..].to_vec());
        assert!(report.smoothed.is_empty());

        // Smoothed: the first layer's input scaled per channel, then quantized per batch.
        let mut graph = forward_graph(&config, &layout, &options).expect("graph").graph;
        let maxima = InputMaxima::from([(feed_forward[0].clone(), vec![1.0; 32])]);
        let smoothed = FeedForwardInput::Smoothed(&maxima);
        let report = quantize_linear_layers(&mut graph, WeightRange::Full, smoothed, &keep).expect("quantized");
        assert_eq!((report.per_row, report.smoothed), (feed_forward[1..].to_vec(), feed_forward[..1].to_vec()));
        graph.prune();
        let count = |op: &str| graph.nodes().iter().filter(|n| n.op_type == op).count();
        assert_eq!((count(QUANTIZE_INPUT), count("QuantizeLinear"), count("ReduceMin")), (4, 1, 0));
        let factors = graph.constant_value(&format!("{}_smoothing", feed_forward[0])).expect("the inverse factors");
        assert_eq!(factors.dims, [32]);

        // Maxima of the wrong width, or none, name the layer.
        for maxima in [InputMaxima::from([(feed_forward[0].clone(), vec![1.0; 31])]), InputMaxima::new()] {
            let mut graph = forward_graph(&config, &layout, &options).expect("graph").graph;
            let smoothed = FeedForwardInput::Smoothed(&maxima);
            let err = quantize_linear_layers(&mut graph, WeightRange::Full, smoothed, &keep).expect_err("refused");
            assert!(err.to_string().contains(&feed_forward[0]), "{err}");
        }
    }

    #[test]
    fn smoothing_moves_each_channels_range_into_its_weight_column() {
        let (config, layout, params) = tiny();
        let options = GraphOptions::inference(&params, Padding::Computed);
        let graph = forward_graph(&config, &layout, &options).expect("graph").graph;
        let linear = graph
            .nodes()
            .iter()
            .filter_map(|n| Linear::of(&graph, n))
            .find(|l| l.feeds_gelu(&graph))
            .expect("the feed-forward block's first layer");
        let column_max =
            |weight: &[f32], j: usize| weight.iter().skip(j).step_by(32).fold(0.0f32, |m, w| m.max(w.abs()));
        // Channel 0 reaches 400, channel 1 was never seen away from zero, the rest reach 1.
        let mut maxima = vec![1.0; 32];
        maxima[0] = 400.0;
        maxima[1] = 0.0;
        let (smoothed, inverse) =
            linear.smoothed(&InputMaxima::from([(linear.weight_name.clone(), maxima.clone())])).expect("smoothed");
        let inverse = inverse.to_f32().expect("floats");
        for j in 0..32 {
            let (w, ws) = (column_max(&linear.weight, j), column_max(&smoothed.weight, j));
            // The product is unchanged: column j times s_j, input j times 1 / s_j.
            assert!((ws * inverse[j] - w).abs() <= 1e-6 * w, "channel {j}");
            if j == 1 {
                assert_eq!(inverse[j], 1.0, "an unseen channel keeps its scale");
            } else {
                // Input and weight both span sqrt(a_j * w_j).
                let both = (maxima[j] * w).sqrt();
                assert!((maxima[j] * inverse[j] - both).abs() <= 1e-4 * both, "channel {j}");
                assert!((ws - both).abs() <= 1e-4 * both, "channel {j}");
            }
        }
    }

    #[test]
    fn calibration_reads_the_input_of_each_layer_feeding_a_gelu() {
        let (config, layout, params) = tiny();
        // Its outputs as ONNX Runtime computes them: crates/trainer's calibration tests.
        let layers = calibration_graph(&config, &layout, &params).expect("graph").layers;
        let weights: Vec<&str> = layers.iter().map(|(w, _)| w.as_str()).collect();
        assert_eq!(weights, ["bert.encoder.layer.0.intermediate.dense.weight"]);
    }

    #[test]
    fn unsigned_weights_are_the_full_range_shifted_to_a_zero_point_of_128() {
        let (config, layout, params) = tiny();
        let options = GraphOptions::inference(&params, Padding::Computed);
        let quantized = |range| {
            let mut graph = forward_graph(&config, &layout, &options).expect("graph").graph;
            let keep = |w: &str| w.contains("classifier");
            quantize_linear_layers(&mut graph, range, FeedForwardInput::PerToken, &keep).expect("quantized");
            graph
        };
        let (signed, unsigned) = (quantized(WeightRange::Full), quantized(WeightRange::Unsigned));
        let linear = |graph: &Graph| -> Vec<Node> {
            graph.nodes().iter().filter(|n| n.op_type == QUANTIZED_LINEAR).cloned().collect()
        };
        let (signed_layers, unsigned_layers) = (linear(&signed), linear(&unsigned));
        // Per batch and per row (the feed-forward layers) alike.
        assert_eq!(unsigned_layers.len(), 7);
        for (s, u) in signed_layers.iter().zip(&unsigned_layers) {
            let value =
                |graph: &Graph, node: &Node, i: usize| graph.constant_value(&node.inputs[i]).expect("constant").clone();
            let (q, shifted) =
                (value(&signed, s, 1).to_i8().expect("int8"), value(&unsigned, u, 1).to_u8().expect("uint8"));
            assert!(q.iter().zip(&shifted).all(|(&q, &u)| i16::from(q) + 128 == i16::from(u)), "{}", u.name);
            assert_eq!(value(&signed, s, 3), value(&unsigned, u, 3), "the same scales");
            let zero = value(&unsigned, u, 5).to_u8().expect("uint8 zero points");
            assert!(
                zero.len() == shifted.len() / value(&unsigned, u, 1).dims[0] as usize && zero.iter().all(|&z| z == 128)
            );
            assert!(value(&signed, s, 5).to_i8().expect("int8 zero points").iter().all(|&z| z == 0));
        }
    }

    #[test]
    fn weights_round_per_output_channel_into_matmul_layout() {
        // Two outputs, three inputs: rows [1, -2, 0.5] and [0, 0, 0].
        let w = [1.0, -2.0, 0.5, 0.0, 0.0, 0.0];
        let (q, scales) = quantize_per_output(&w, 2, 3, WeightRange::Full);
        assert_eq!(scales, vec![2.0 / 127.0, 1.0]);
        // Transposed: q[i * outputs + o].
        assert_eq!(q, vec![64, 0, -127, 0, 32, 0]);
        let (q, _) = quantize_per_output(&w, 2, 3, WeightRange::Reduced);
        assert_eq!(q[2], -63, "the largest weight takes the reduced range's end");
    }

    #[test]
    fn table_rows_round_with_a_scale_each() {
        let (q, scales) = quantize_rows(&[0.5, -1.0, 0.0, 0.0, 4.0, 2.0], 2, 127.0);
        assert_eq!(scales, vec![1.0 / 127.0, 1.0, 4.0 / 127.0]);
        assert_eq!(q, vec![64, -127, 0, 0, 127, 64]);
    }
}
