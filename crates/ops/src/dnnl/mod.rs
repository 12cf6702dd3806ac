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
use crate::matching::{is, only_reader_is_next};
use crate::OpsError;

/// The attributes both products share: transposes of the last two axes, the precision, and
/// whether the output goes through the exact GELU as it is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProductAttrs {
    /// A is stored with its last two axes swapped.
    pub trans_a: bool,
    /// B is stored with its last two axes swapped.
    pub trans_b: bool,
    /// The arithmetic.
    pub precision: Precision,
    /// The output is `gelu(product)`: a GELU folded in by [`fold_gelus`].
    pub gelu: bool,
}

impl ProductAttrs {
    pub(crate) fn read(node: &(impl AttributeSource + ?Sized)) -> Self {
        let precision = match node.int("precision") {
            Some(1) => Precision::Bf16,
            _ => Precision::F32,
        };
        ProductAttrs { trans_a: node.flag("transA"), trans_b: node.flag("transB"), precision, gelu: node.flag("gelu") }
    }

    fn write(self, node: &mut Node) {
        let precision = match self.precision {
            Precision::F32 => 0,
            Precision::Bf16 => 1,
        };
        node.attributes.insert("transA".into(), Attribute::Int(self.trans_a as i64));
        node.attributes.insert("transB".into(), Attribute::Int(self.trans_b as i64));
        node.attributes.insert("precision".into(), Attribute::Int(precision));
        node.attributes.insert("gelu".into(), Attribute::Int(self.gelu as i64));
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
        ProductAttrs { trans_a, trans_b, precision, gelu: false }.write(&mut lowered);
        Some(lowered)
    })?;
    if lowered > 0 {
        graph.prune();
    }
    Ok(lowered)
}

/// Folds each GELU (ONNX's exact one, or ours) whose input is a oneDNN product's output that
/// nothing else reads into that product, as a oneDNN post-op: the GELU is applied while the
/// output is still in cache, and the product's own output is never written. Returns how many.
/// For inference graphs only (see [`crate::fold_for_inference`]).
pub fn fold_gelus(graph: &mut Graph) -> Result<usize, IrError> {
    crate::register_shapes(graph);
    let folded = graph.rewrite(|graph, i| {
        let node = &graph.nodes()[i];
        if !(crate::gelu::is_onnx_exact(node) || is(node, DOMAIN, crate::gelu::NAME)) {
            return None;
        }
        let product = graph.producer(node.input(0)?)?;
        let ours = is(product, DOMAIN, gemm::NAME) || is(product, DOMAIN, matmul::NAME);
        if !ours || !only_reader_is_next(graph, product) || ProductAttrs::read(product).gelu {
            return None;
        }
        let mut fused = product.clone();
        fused.name = format!("{}+gelu", product.name);
        fused.outputs = node.outputs.clone();
        ProductAttrs { gelu: true, ..ProductAttrs::read(product) }.write(&mut fused);
        Some(fused)
    })?;
    if folded > 0 {
        graph.prune();
    }
    Ok(folded)
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
        activation: attrs.gelu.then_some(ringtune_onednn::Activation::GeluErf),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_round_trip_through_a_node() {
        let attrs = ProductAttrs { trans_a: true, trans_b: false, precision: Precision::Bf16, gelu: true };
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
    fn a_gelu_only_the_product_feeds_is_folded_into_it() {
        use ringtune_onnx_ir::{shape, DType};
        for product_read_elsewhere in [false, true] {
            let mut g = Graph::new("ffn");
            let x = g.input("x", DType::F32, shape(&[4, 8])).expect("x");
            let w = g.input("w", DType::F32, shape(&[8, 6])).expect("w");
            let b = g.input("b", DType::F32, shape(&[6])).expect("b");
            let h = g.gemm(&x, &w, Some(&b), false, false).expect("gemm");
            let y = g.gelu(&h).expect("gelu");
            g.output(&y).expect("y");
            if product_read_elsewhere {
                g.output(&h).expect("h");
            }
            assert_eq!(lower_products(&mut g, Precision::F32).expect("lower"), 1);
            let folded = fold_gelus(&mut g).expect("fold");
            let gelus = g.nodes().iter().filter(|n| n.op_type == "Gelu").count();
            let products: Vec<_> = g.nodes().iter().filter(|n| n.op_type == gemm::NAME).collect();
            assert_eq!(products.len(), 1);
            if product_read_elsewhere {
                assert_eq!((folded, gelus), (0, 1));
                assert!(!ProductAttrs::read(products[0]).gelu);
            } else {
                assert_eq!((folded, gelus), (1, 0));
                assert!(ProductAttrs::read(products[0]).gelu);
                assert_eq!(products[0].outputs, [y.name()]);
                assert_eq!(g.shape(&y).expect("shape"), &shape(&[4, 6]));
            }
        }
    }

    #[test]
    fn product_sizes_from_shapes() {
        let plain = ProductAttrs { trans_a: false, trans_b: false, precision: Precision::F32, gelu: false };
        let s = product_dims(&[2, 3, 4, 5], &[5, 6], plain).expect("spec");
        assert_eq!((s.batch_a, s.batch_b, s.m, s.k, s.n), (vec![2, 3], vec![1, 1], 4, 5, 6));
        let both = ProductAttrs { trans_a: true, trans_b: true, ..plain };
        let t = product_dims(&[5, 4], &[6, 5], both).expect("spec");
        assert_eq!((t.m, t.k, t.n), (4, 5, 6));
        assert!(product_dims(&[4, 5], &[4, 5], plain).is_err());
    }
}
