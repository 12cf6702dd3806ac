//! Lays out a small BERT's parameters in one flat buffer, initialises them from a seed, builds
//! the forward graph with the parameters as graph inputs, and exports a self-contained
//! inference model.
//!
//! `cargo run -p ringtune-encoders --example forward_graph`

use std::path::Path;

use ringtune_encoders::{
    export_inference, forward_graph, init_all, layout, GraphOptions, ModelConfig, Padding, Params,
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let config = ModelConfig::from_json(
        r#"{"model_type": "bert", "vocab_size": 1000, "hidden_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "intermediate_size": 128, "max_position_embeddings": 64}"#,
        Path::new("config.json"),
    )?;
    let layout = layout(&config);
    println!(
        "{} parameters in {} tensors, {} floats with alignment",
        layout.num_params(),
        layout.entries().len(),
        layout.total_len()
    );
    let mut params = vec![0.0f32; layout.total_len()];
    init_all(&config, &layout, 42, &mut params);
    let options = GraphOptions {
        params: Params::Inputs,
        with_loss: true,
        dropout: true,
        label_smoothing: 0.0,
        padding: Padding::Computed,
    };
    let forward = forward_graph(&config, &layout, &options)?;
    println!(
        "training forward graph: {} nodes, inputs {} (batch and parameters)",
        forward.graph.nodes().len(),
        forward.graph.inputs.len()
    );
    let onnx = export_inference(&config, &layout, &params)?;
    println!("inference model with embedded weights: {} bytes", onnx.len());
    Ok(())
}
