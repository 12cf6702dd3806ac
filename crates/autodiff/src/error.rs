//! Errors of gradient construction.

/// What can go wrong differentiating a graph.
#[derive(Debug, thiserror::Error)]
pub enum AutodiffError {
    /// An operator with no gradient rule lies on a path from a parameter to the loss.
    #[error("no gradient rule for operator {op} (node `{node}`)")]
    NoRule {
        /// The operator type.
        op: String,
        /// The node.
        node: String,
    },
    /// A rule cannot handle this use of its operator.
    #[error("node `{node}` ({op}): {reason}")]
    Unsupported {
        /// The node.
        node: String,
        /// Its operator.
        op: String,
        /// Why.
        reason: String,
    },
    /// The loss is not a scalar float value of the graph.
    #[error("the loss `{0}` must be a float scalar produced by the graph")]
    BadLoss(String),
    /// A value to differentiate with respect to is not a float graph input or initialiser.
    #[error("cannot differentiate with respect to `{0}`: it is not a float graph input or initialiser")]
    BadParameter(String),
    /// The graph builder refused a backward node.
    #[error(transparent)]
    Graph(#[from] ringtune_onnx_ir::IrError),
}
