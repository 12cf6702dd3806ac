//! The lowering pass that moves a graph's matrix products onto oneDNN: `Gemm` (with
//! `alpha = beta = 1` and a bias that broadcasts as a row, a column or a full matrix) becomes
//! `DnnlGemm`, `MatMul` of rank 2 or more becomes `DnnlMatMul`, and a `Transpose` of the last
//! two axes that feeds only the product is folded into its `transA`/`transB` flag (oneDNN reads
//! the operand through strides). Forward and backward nodes alike.

use onnx_ir::{Attribute, Dim, Graph, Value};
use runtime::kernels::{DOMAIN, GEMM, MATMUL};
use runtime::Precision;

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
    use onnx_ir::{shape, DType};

    use super::*;

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
