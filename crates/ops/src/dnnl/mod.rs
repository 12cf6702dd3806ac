//! The matrix products on oneDNN: `DnnlMatMul` ([`matmul`]) and `DnnlGemm` ([`gemm`]), their
//! shared attributes, the process's oneDNN engine, and the pass that moves a graph's products
//! onto them.
//!
//! The pass runs on the finished training graph (forward and backward), after
//! differentiation, so the products have no gradient rule.

pub mod gemm;
pub mod matmul;

use std::sync::{Arc, OnceLock};

use ringtune_onednn::{Engine, Precision};
use ringtune_onnx_ir::{Attribute, Dim, Graph, IrError, Node, Value};
use ringtune_runtime::{TensorRef, DOMAIN};

use crate::attributes::AttributeSource;
use crate::OpsError;

/// The attributes both products share: transposes of the last two axes and the precision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProductAttrs {
    /// A is stored with its last two axes swapped.
    pub trans_a: bool,
    /// B is stored with its last two axes swapped.
    pub trans_b: bool,
    /// The arithmetic.
    pub precision: Precision,
}

impl ProductAttrs {
    pub(crate) fn read(node: &(impl AttributeSource + ?Sized)) -> Self {
        let precision = match node.int("precision") {
            Some(1) => Precision::Bf16,
            _ => Precision::F32,
        };
        ProductAttrs { trans_a: node.flag("transA"), trans_b: node.flag("transB"), precision }
    }

    fn write(self, node: &mut Node) {
        let precision = match self.precision {
            Precision::F32 => 0,
            Precision::Bf16 => 1,
        };
        node.attributes.insert("transA".into(), Attribute::Int(self.trans_a as i64));
        node.attributes.insert("transB".into(), Attribute::Int(self.trans_b as i64));
        node.attributes.insert("precision".into(), Attribute::Int(precision));
    }
}

static ENGINE: OnceLock<Result<Arc<Engine>, ringtune_onednn::DnnlError>> = OnceLock::new();

/// The process's oneDNN engine, loaded on first use, running products on `threads` threads
/// (0: one per core).
pub fn engine(threads: usize) -> Result<Arc<Engine>, OpsError> {
    let engine = ENGINE.get_or_init(|| Engine::load_default().map(Arc::new)).clone()?;
    if threads > 0 {
        engine.set_threads(threads);
    }
    Ok(engine)
}

/// Rewrites every supported product of `graph` for oneDNN at `precision`; returns how many.
/// `Gemm` (with `alpha = beta = 1` and a bias that broadcasts as a row, a column or a full
/// matrix) becomes `DnnlGemm`; `MatMul` of rank 2 or more becomes `DnnlMatMul`, and a
/// `Transpose` of the last two axes that feeds only the product is folded into its
/// `transA`/`transB` flag (oneDNN reads the operand through strides).
pub fn lower_products(graph: &mut Graph, precision: Precision) -> Result<usize, IrError> {
    crate::register_shapes(graph);
    let lowered = graph.rewrite(|graph, i| {
        let node = &graph.nodes()[i];
        let (op, inputs, (trans_a, trans_b)) = match (node.domain.as_str(), node.op_type.as_str()) {
            ("", "Gemm") => gemm::rewrite(graph, node)?,
            ("", "MatMul") => matmul::rewrite(graph, node)?,
            _ => return None,
        };
        let mut lowered = node.clone();
        lowered.op_type = op.into();
        lowered.domain = DOMAIN.into();
        lowered.inputs = inputs;
        lowered.attributes.remove("alpha");
        lowered.attributes.remove("beta");
        ProductAttrs { trans_a, trans_b, precision }.write(&mut lowered);
        Some(lowered)
    })?;
    if lowered > 0 {
        graph.prune();
    }
    Ok(lowered)
}

/// A product's new operator, inputs and transpose flags.
type Rewrite = (&'static str, Vec<String>, (bool, bool));

fn dims(graph: &Graph, name: &str) -> Option<Vec<Dim>> {
    graph.shape(&Value::named(name)).ok().cloned()
}

/// The two operands of a product.
pub(crate) fn operands<'a>(inputs: &[Option<TensorRef<'a>>]) -> Result<(TensorRef<'a>, TensorRef<'a>), String> {
    match inputs {
        [Some(a), Some(b), ..] => Ok((*a, *b)),
        _ => Err("missing A or B".into()),
    }
}

/// The `[.., m, k]` by `[.., k, n]` sizes of an operand pair given as stored, and the batch
/// axes padded with ones to one rank.
pub(crate) fn product_dims(a: &[i64], b: &[i64], attrs: ProductAttrs) -> Result<ringtune_onednn::Matmul, String> {
    if a.len() < 2 || b.len() < 2 {
        return Err(format!("operands of rank 2 or more, got {a:?} and {b:?}"));
    }
    let (ra, rb) = (a.len(), b.len());
    let (m, ka) = if attrs.trans_a { (a[ra - 1], a[ra - 2]) } else { (a[ra - 2], a[ra - 1]) };
    let (kb, n) = if attrs.trans_b { (b[rb - 1], b[rb - 2]) } else { (b[rb - 2], b[rb - 1]) };
    if ka != kb {
        return Err(format!("inner sizes differ in {a:?} and {b:?}"));
    }
    let batch = ra.max(rb) - 2;
    let pad = |dims: &[i64]| -> Vec<i64> {
        let own = &dims[..dims.len() - 2];
        std::iter::repeat_n(1, batch - own.len()).chain(own.iter().copied()).collect()
    };
    Ok(ringtune_onednn::Matmul {
        batch_a: pad(a),
        batch_b: pad(b),
        m,
        k: ka,
        n,
        trans_a: attrs.trans_a,
        trans_b: attrs.trans_b,
        bias: None,
        precision: attrs.precision,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_round_trip_through_a_node() {
        let attrs = ProductAttrs { trans_a: true, trans_b: false, precision: Precision::Bf16 };
        let mut node = Node {
            name: "n".into(),
            op_type: "DnnlMatMul".into(),
            domain: DOMAIN.into(),
            inputs: vec![],
            outputs: vec![],
            attributes: Default::default(),
        };
        attrs.write(&mut node);
        assert_eq!(ProductAttrs::read(&node), attrs);
    }

    #[test]
    fn product_sizes_from_shapes() {
        let plain = ProductAttrs { trans_a: false, trans_b: false, precision: Precision::F32 };
        let s = product_dims(&[2, 3, 4, 5], &[5, 6], plain).expect("spec");
        assert_eq!((s.batch_a, s.batch_b, s.m, s.k, s.n), (vec![2, 3], vec![1, 1], 4, 5, 6));
        let both = ProductAttrs { trans_a: true, trans_b: true, ..plain };
        let t = product_dims(&[5, 4], &[6, 5], both).expect("spec");
        assert_eq!((t.m, t.k, t.n), (4, 5, 6));
        assert!(product_dims(&[4, 5], &[4, 5], plain).is_err());
    }
}
