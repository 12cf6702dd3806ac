//! Lowering passes over the finished training graph (forward and backward), swapping standard
//! nodes for our `ai.ringtune` operators.
//!
//! [`seed_dropouts`]: each training-mode `Dropout` becomes `SeededDropout`, fed the step's seed.
//!
//! [`ordered_scatters`]: each `ScatterND` with `reduction = add` (the embedding gradients)
//! becomes `ScatterNdAdd`, which adds repeated indices in order, so a step gives the same bits
//! on every run.
//!
//! [`lower_to_onednn`] moves the matrix products onto oneDNN: `Gemm` (with
//! `alpha = beta = 1` and a bias that broadcasts as a row, a column or a full matrix) becomes
//! `DnnlGemm`, `MatMul` of rank 2 or more becomes `DnnlMatMul`, and a `Transpose` of the last
//! two axes that feeds only the product is folded into its `transA`/`transB` flag (oneDNN reads
//! the operand through strides). Forward and backward nodes alike.

use onnx_ir::{shape, Attribute, DType, Dim, Graph, IrError, Value};
use runtime::dropout::{SEEDED_DROPOUT, SEED_INPUT};
use runtime::kernels::{DOMAIN, GEMM, MATMUL};
use runtime::scatter::SCATTER_ND_ADD;
use runtime::Precision;

/// Swaps every training-mode `Dropout` for `SeededDropout(X, ratio, seed)` with its own `site`
/// number, `seed` being a new graph input ([`SEED_INPUT`], int64 `[1]`); returns how many.
///
/// The backward `Where(mask, dy * 1/(1 - ratio), 0)` that the autodiff rule emits becomes
/// `SeededDropout(dy)` of the same site: the mask is redrawn rather than stored, which saves a
/// byte per element of memory and two passes over the gradient. Other readers of a mask keep
/// it as an output.
pub fn seed_dropouts(graph: &mut Graph) -> Result<usize, IrError> {
    let training = |graph: &Graph, i: usize| {
        graph.nodes[i]
            .input(2)
            .and_then(|name| graph.constant_value(name))
            .is_some_and(|t| t.dtype == DType::Bool && t.data.first() == Some(&1))
    };
    let sites: Vec<usize> = (0..graph.nodes.len())
        .filter(|&i| {
            let node = &graph.nodes[i];
            node.domain.is_empty() && node.op_type == "Dropout" && node.input(1).is_some() && training(graph, i)
        })
        .collect();
    if sites.is_empty() {
        return Ok(0);
    }
    graph.input(SEED_INPUT, DType::I64, shape(&[1]))?;
    for (site, &i) in sites.iter().enumerate() {
        let ratio = graph.nodes[i].inputs[1].clone();
        let mask = graph.nodes[i].outputs.get(1).filter(|m| !m.is_empty()).cloned();
        let backward: Option<Vec<(usize, String)>> = mask.as_deref().and_then(|mask| {
            let readers = graph.consumers(mask);
            let redrawn: Vec<_> =
                readers.iter().filter_map(|&w| Some((w, mask_gradient_input(graph, w, mask, &ratio)?))).collect();
            let kept_as_output = graph.outputs.iter().any(|o| o == mask);
            (redrawn.len() == readers.len() && !kept_as_output).then_some(redrawn)
        });
        let seeded = |node: &mut onnx_ir::Node, x: String| {
            node.op_type = SEEDED_DROPOUT.into();
            node.domain = DOMAIN.into();
            node.inputs = vec![x, ratio.clone(), SEED_INPUT.into()];
            node.attributes.clear();
            node.attributes.insert("site".into(), Attribute::Int(site as i64));
        };
        let x = graph.nodes[i].inputs[0].clone();
        seeded(&mut graph.nodes[i], x);
        if let Some(backward) = backward {
            graph.nodes[i].outputs.truncate(1);
            for (w, dy) in backward {
                seeded(&mut graph.nodes[w], dy);
            }
        }
    }
    graph.domains.insert(DOMAIN.into(), 1);
    graph.prune();
    Ok(sites.len())
}

/// Swaps every float `ScatterND` with `reduction = add` for `ScatterNdAdd`; returns how many.
pub fn ordered_scatters(graph: &mut Graph) -> usize {
    let mut swapped = 0;
    for i in 0..graph.nodes.len() {
        let node = &graph.nodes[i];
        let float_data = node.input(0).is_some_and(|d| graph.dtype(&Value::named(d)).ok() == Some(DType::F32));
        let scatter_add =
            node.domain.is_empty() && node.op_type == "ScatterND" && node.string("reduction") == Some("add");
        if !(scatter_add && float_data) {
            continue;
        }
        let node = &mut graph.nodes[i];
        node.op_type = SCATTER_ND_ADD.into();
        node.domain = DOMAIN.into();
        node.attributes.remove("reduction");
        swapped += 1;
    }
    if swapped > 0 {
        graph.domains.insert(DOMAIN.into(), 1);
    }
    swapped
}

/// `dy` when node `w` is `Where(mask, Mul(dy, 1/(1 - ratio)), 0)`: the gradient of a dropout
/// through `mask`, which is that dropout applied to `dy`.
fn mask_gradient_input(graph: &Graph, w: usize, mask: &str, ratio: &str) -> Option<String> {
    let node = &graph.nodes[w];
    if node.op_type != "Where" || !node.domain.is_empty() || node.input(0)? != mask {
        return None;
    }
    let scalar = |name: &str| graph.constant_value(name)?.as_f64s().filter(|v| v.len() == 1).map(|v| v[0]);
    if scalar(node.input(2)?)? != 0.0 {
        return None;
    }
    let scale = 1.0 / (1.0 - scalar(ratio)?);
    let mul = graph.producer(node.input(1)?)?;
    if mul.op_type != "Mul" || !mul.domain.is_empty() {
        return None;
    }
    let (a, b) = (mul.input(0)?, mul.input(1)?);
    let is_scale = |name: &str| scalar(name).is_some_and(|v| ((v - scale) / scale).abs() < 1e-6);
    let dy = if is_scale(b) {
        a
    } else if is_scale(a) {
        b
    } else {
        return None;
    };
    Some(dy.to_string())
}

/// Rewrites every supported product of `graph` for oneDNN at `precision`; returns how many.
pub fn lower_to_onednn(graph: &mut Graph, precision: Precision) -> usize {
    let precision_code = match precision {
        Precision::F32 => 0,
        Precision::Bf16 => 1,
    };
    let mut lowered = 0;
    for i in 0..graph.nodes.len() {
        let rewrite = match (graph.nodes[i].domain.as_str(), graph.nodes[i].op_type.as_str()) {
            ("", "Gemm") => gemm_rewrite(graph, i),
            ("", "MatMul") => matmul_rewrite(graph, i),
            _ => None,
        };
        if let Some((op, inputs, trans)) = rewrite {
            let node = &mut graph.nodes[i];
            node.op_type = op.into();
            node.domain = DOMAIN.into();
            node.inputs = inputs;
            node.attributes.remove("alpha");
            node.attributes.remove("beta");
            node.attributes.insert("transA".into(), Attribute::Int(trans.0 as i64));
            node.attributes.insert("transB".into(), Attribute::Int(trans.1 as i64));
            node.attributes.insert("precision".into(), Attribute::Int(precision_code));
            lowered += 1;
        }
    }
    if lowered > 0 {
        graph.domains.insert(DOMAIN.into(), 1);
        graph.prune();
    }
    lowered
}

type Rewrite = (&'static str, Vec<String>, (bool, bool));

fn dims(graph: &Graph, name: &str) -> Option<Vec<Dim>> {
    graph.shape(&Value::named(name)).ok().cloned()
}

fn gemm_rewrite(graph: &Graph, i: usize) -> Option<Rewrite> {
    let node = &graph.nodes[i];
    if node.float("alpha").unwrap_or(1.0) != 1.0 || node.float("beta").unwrap_or(1.0) != 1.0 {
        return None;
    }
    let trans = (node.int("transA").unwrap_or(0) != 0, node.int("transB").unwrap_or(0) != 0);
    if let Some(c) = node.input(2) {
        let (a, b) = (dims(graph, node.input(0)?)?, dims(graph, node.input(1)?)?);
        let m = if trans.0 { &a[1] } else { &a[0] };
        let n = if trans.1 { &b[0] } else { &b[1] };
        let one = Dim::Known(1);
        let fits = match dims(graph, c)?.as_slice() {
            [x] => x == n,
            [x, y] => (x == &one && y == n) || (x == m && (y == n || (y == &one && m != &one))),
            _ => false,
        };
        if !fits {
            return None;
        }
    }
    Some((GEMM, node.inputs.clone(), trans))
}

fn matmul_rewrite(graph: &Graph, i: usize) -> Option<Rewrite> {
    let node = &graph.nodes[i];
    let mut inputs = node.inputs.clone();
    let mut trans = [false, false];
    for (k, slot) in inputs.iter_mut().enumerate().take(2) {
        if dims(graph, slot)?.len() < 2 {
            return None;
        }
        if let Some(source) = swapped_transpose_input(graph, slot) {
            *slot = source;
            trans[k] = true;
        }
    }
    Some((MATMUL, inputs, (trans[0], trans[1])))
}

/// The input of the `Transpose` producing `name`, when it only swaps the last two axes and
/// nothing else reads its output.
fn swapped_transpose_input(graph: &Graph, name: &str) -> Option<String> {
    let producer = graph.producer(name)?;
    if producer.op_type != "Transpose" || !producer.domain.is_empty() {
        return None;
    }
    let perm = producer.ints("perm")?;
    let r = perm.len();
    let swaps_last_two = r >= 2
        && perm[..r - 2].iter().enumerate().all(|(i, &p)| p == i as i64)
        && perm[r - 2] == r as i64 - 1
        && perm[r - 1] == r as i64 - 2;
    let only_reader = graph.consumers(name).len() == 1 && !graph.outputs.iter().any(|o| o == name);
    (swaps_last_two && only_reader).then(|| producer.inputs[0].clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedding_gradients_scatter_in_order() {
        let mut g = Graph::new("s");
        let table = g.input("table", DType::F32, shape(&[10, 4])).expect("table");
        let ids = g.input("ids", DType::I64, shape(&[Dim::sym("n")])).expect("ids");
        let rows = g.gather(&table, &ids, 0).expect("gather");
        let loss = g.reduce_sum(&rows, &[0, 1], false).expect("sum");
        g.output(&loss).expect("out");
        let grads = autodiff::backward(&mut g, &loss, std::slice::from_ref(&table)).expect("backward");
        g.output(&grads[0]).expect("grad");
        assert_eq!(ordered_scatters(&mut g), 1);
        assert!(!g.nodes.iter().any(|n| n.op_type == "ScatterND"));
        let node = g.nodes.iter().find(|n| n.op_type == SCATTER_ND_ADD).expect("swapped");
        assert_eq!((node.domain.as_str(), node.string("reduction")), (DOMAIN, None));
        assert!(g.to_bytes().is_ok());
    }

    #[test]
    fn training_dropouts_are_seeded_and_numbered() {
        let mut g = Graph::new("t");
        let x = g.input("x", DType::F32, shape(&[Dim::sym("n"), Dim::Known(8)])).expect("x");
        let a = g.dropout(&x, 0.1).expect("dropout");
        let b = g.dropout(&a.y, 0.2).expect("dropout");
        g.output(&b.y).expect("out");
        g.output(&a.mask).expect("out");
        assert_eq!(seed_dropouts(&mut g).expect("lowered"), 2);
        let seeded: Vec<_> = g.nodes.iter().filter(|n| n.op_type == SEEDED_DROPOUT).collect();
        assert_eq!(seeded.len(), 2);
        for (site, node) in seeded.iter().enumerate() {
            assert_eq!((node.domain.as_str(), node.int("site")), (DOMAIN, Some(site as i64)));
            assert_eq!(node.inputs.len(), 3);
            assert_eq!(node.inputs[2], SEED_INPUT);
        }
        assert!(g.to_bytes().is_ok());
        // The backward graph redraws the mask: no `Where` over it, no mask output left.
        let mut g = Graph::new("b");
        let x = g.input("x", DType::F32, shape(&[3, 8])).expect("x");
        let d = g.dropout(&x, 0.25).expect("dropout");
        let squared = g.mul(&d.y, &d.y).expect("mul");
        let loss = g.reduce_sum(&squared, &[0, 1], false).expect("sum");
        g.output(&loss).expect("out");
        let grads = autodiff::backward(&mut g, &loss, std::slice::from_ref(&x)).expect("backward");
        g.output(&grads[0]).expect("grad");
        assert_eq!(seed_dropouts(&mut g).expect("lowered"), 1);
        let seeded: Vec<_> = g.nodes.iter().filter(|n| n.op_type == SEEDED_DROPOUT).collect();
        assert_eq!(seeded.len(), 2, "forward and backward");
        assert!(seeded.iter().all(|n| n.int("site") == Some(0) && n.outputs.len() == 1));
        assert!(!g.nodes.iter().any(|n| n.op_type == "Where"));
        assert!(g.to_bytes().is_ok());
        // A graph without training dropout gains no seed input.
        let mut plain = Graph::new("p");
        let x = plain.input("x", DType::F32, shape(&[2])).expect("x");
        plain.output(&x).expect("out");
        assert_eq!(seed_dropouts(&mut plain).expect("lowered"), 0);
        assert_eq!(plain.inputs.len(), 1);
    }

    #[test]
    fn products_are_lowered_and_transposes_folded() {
        let mut g = Graph::new("t");
        let x = g.input("x", DType::F32, shape(&[Dim::sym("n"), Dim::Known(8)])).expect("x");
        let w = g.input("w", DType::F32, shape(&[4, 8])).expect("w");
        let b = g.input("b", DType::F32, shape(&[4])).expect("b");
        let y = g.gemm(&x, &w, Some(&b), false, true).expect("gemm");
        let q = g.input("q", DType::F32, shape(&[2, 3, 5, 6])).expect("q");
        let k = g.input("k", DType::F32, shape(&[2, 3, 5, 6])).expect("k");
        let kt = g.transpose(&k, &[0, 1, 3, 2]).expect("transpose");
        let s = g.matmul(&q, &kt).expect("matmul");
        g.output(&y).expect("out");
        g.output(&s).expect("out");
        assert_eq!(lower_to_onednn(&mut g, Precision::Bf16), 2);
        let ops: Vec<&str> = g.nodes.iter().map(|n| n.op_type.as_str()).collect();
        assert!(!ops.contains(&"Transpose"), "{ops:?}");
        let mm = g.nodes.iter().find(|n| n.op_type == MATMUL).expect("matmul");
        assert_eq!((mm.int("transB"), mm.int("precision"), mm.inputs[1].as_str()), (Some(1), Some(1), "k"));
        assert!(g.to_bytes().is_ok());
    }
}
