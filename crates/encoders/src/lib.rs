//! Encoder models for sequence classification as ONNX graphs: BERT, MPNet, RoBERTa (and
//! XLM-RoBERTa, CamemBERT), DistilBERT, ELECTRA, ModernBERT and DeBERTa-v2/v3, each family a
//! module of `families/`.
//!
//! Owns: the model config (from Hugging Face `config.json`, unsupported values refused by name),
//! checkpoints (`model.safetensors` in, with or without the family's prefix, `bert.` or
//! `roberta.` say; Hugging Face names out), the flat parameter layout shared by gradients, optimizer, checkpoints and the
//! all-reduce, seeded initialisation, the forward graph with parameters as graph inputs, and the
//! self-contained inference export, in float or with int8 linear layers.
//!
//! Does not own: gradients (`autodiff`), running graphs (`runtime`) or tokenization (`data`).
//!
//! ```
//! use std::path::Path;
//! use ringtune_encoders::{forward_graph, layout, GraphOptions, ModelConfig, Padding, Params};
//! let config = ModelConfig::from_json(
//!     r#"{"vocab_size": 30, "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
//!         "intermediate_size": 16, "max_position_embeddings": 10}"#,
//!     Path::new("config.json"),
//! ).unwrap();
//! let layout = layout(&config);
//! let options = GraphOptions {
//!     params: Params::Inputs,
//!     with_loss: true,
//!     dropout: false,
//!     label_smoothing: 0.0,
//!     padding: Padding::Computed,
//! };
//! let forward = forward_graph(&config, &layout, &options).unwrap();
//! assert_eq!(forward.params.len(), layout.entries().len());
//! assert!(forward.graph.to_bytes().is_ok());
//! ```

mod checkpoint;
mod config;
mod error;
mod families;
mod forward;
mod int8;
mod layer_names;
mod layout;
mod param_shapes;
mod params;
mod tensor_file;

pub use checkpoint::{load_params, save_params, LoadReport};
pub use config::{DebertaSettings, ModelConfig, ModernBertSettings, ProblemType, RelativeAttention};
pub use error::ModelError;
pub use families::Family;
pub use forward::{
    export_inference, forward_graph, layer_prefixes, layer_scope, ForwardGraph, GraphOptions, Padding, Params,
    ATTENTION_MASK, INPUT_IDS, LABELS, LOGITS, LOSS, TOKEN_TYPE_IDS,
};
pub use int8::{
    calibration_graph, export_inference_int8, quantize_linear_layers, CalibrationGraph, FeedForwardInput, InputMaxima,
    Int8Report, WeightRange,
};
pub use layout::{ParamEntry, ParamLayout, ALIGN_FLOATS};
pub use params::{init_all, init_param, is_head, layout, param_shapes, word_embeddings_name};
pub use tensor_file::{read_tensor_file, write_tensor_file, HostTensor};
