//! Errors of graph construction and serialisation.

/// What can go wrong building or writing a graph.
#[derive(Debug, thiserror::Error)]
pub enum IrError {
    /// A value that the graph does not define.
    #[error("value `{0}` is not defined in the graph")]
    UnknownValue(String),
    /// A value whose rank is needed but unknown.
    #[error("value `{0}` has an unknown rank")]
    UnknownRank(String),
    /// A name defined twice.
    #[error("`{0}` is defined twice")]
    Duplicate(String),
    /// A node reads a value defined nowhere before it.
    #[error("node `{node}` reads `{input}`, which nothing before it defines")]
    UndefinedInput {
        /// The node.
        node: String,
        /// The missing input.
        input: String,
    },
    /// Shape or type inference refused a node.
    #[error("node `{node}` ({op}): {reason}")]
    Shape {
        /// The node.
        node: String,
        /// Its operator.
        op: String,
        /// Why.
        reason: String,
    },
    /// Anything else that makes the graph invalid.
    #[error("{0}")]
    Invalid(String),
    /// The protobuf encoder failed.
    #[error("serialising the model: {0}")]
    Serialize(String),
}
