//! Where the sync's operators run, read from ONNX Runtime's own profile of a MiniLM training
//! step: one `GradReady` per parameter, each as the backward pass produces its gradient (last
//! layer first), so that the first bucket of the sync plan is complete while most of the
//! backward pass is still to run and the ring can reduce it meanwhile; and one `ParamReady`
//! per parameter, each just before the forward pass first reads it (first layer first), so that
//! the parameters of later layers can still be on the wire while earlier layers compute. On one
//! node (no sync), each layer's gradients are computed as the backward pass passes the layer,
//! so its saved values die there.

use std::sync::{Arc, Mutex};

use ringtune_collective::Wire;
use ringtune_encoders::{load_params, ModelConfig};
use ringtune_ops::grad_ready::GradSink;
use ringtune_ops::param_ready::ParamSource;
use ringtune_runtime::{FlatBuffer, SessionOptions};
use ringtune_tests::{fixtures, minilm_dir, read_batch, runtime};
use ringtune_trainer::engine::{Engine, SyncHooks};
use ringtune_trainer::model::GraphChoices;
use ringtune_trainer::model::ModelDir;
use ringtune_trainer::sync::{sync_plan, SyncMode};

/// Which gradients arrived, in order.
#[derive(Default)]
struct Arrivals(Mutex<Vec<usize>>);

impl GradSink for Arrivals {
    fn take(&self, tensor: usize, _grad: &[f32]) -> Result<(), String> {
        self.0.lock().map_err(|e| e.to_string())?.push(tensor);
        Ok(())
    }
}

/// Which parameters were waited for, in order.
#[derive(Default)]
struct Waits(Mutex<Vec<usize>>);

impl ParamSource for Waits {
    fn wait(&self, tensor: usize) -> Result<(), String> {
        self.0.lock().map_err(|e| e.to_string())?.push(tensor);
        Ok(())
    }
}

/// A node's run in the profile: its node, operator, start and duration (microseconds).
struct Ran {
    node: String,
    op: String,
    start: u64,
    end: u64,
}

fn node_events(profile: &str) -> Vec<Ran> {
    let events: Vec<serde_json::Value> = serde_json::from_str(profile).expect("the profile is a JSON array");
    let mut ran: Vec<Ran> = events
        .iter()
        .filter(|e| e["cat"] == "Node")
        .filter_map(|e| {
            let node = e["name"].as_str()?.strip_suffix("_kernel_time")?.to_string();
            let (start, dur) = (e["ts"].as_u64()?, e["dur"].as_u64()?);
            Some(Ran { node, op: e["args"]["op_name"].as_str()?.to_string(), start, end: start + dur })
        })
        .collect();
    ran.sort_by_key(|r| r.start);
    ran
}

/// The profile of MiniLM's second training step (the first warms up) with `hooks`: every
/// node's run, in order.
fn profiled_step(hooks: SyncHooks) -> Vec<Ran> {
    let dir = tempfile::tempdir().expect("dir");
    let model = minilm_dir();
    let config = ModelConfig::from_dir(&model).expect("config").with_dropout(0.0);
    let layout = ringtune_encoders::layout(&config);
    let mut params = FlatBuffer::zeros(layout.total_len());
    let weights = [model.join("model.safetensors"), fixtures().join("minilm-mrpc/classifier.safetensors")];
    load_params(&weights, &config, &layout, 0, &mut params).expect("weights");
    let options = SessionOptions { threads: 1, profile: Some(dir.path().join("step")), ..SessionOptions::default() };
    let mut engine =
        Engine::new(runtime(), &config, &layout, params, GraphChoices::default(), &options, hooks).expect("engine");
    let batch = read_batch(&fixtures().join("minilm-mrpc/batch.safetensors"));
    engine.step(&batch).expect("warm-up step");
    engine.step(&batch).expect("step");
    let file = engine.end_profiling().expect("profile");
    let ran = node_events(&std::fs::read_to_string(&file).expect("profile file"));
    // The step's nodes: the second run's, from its first node on.
    let per_run = ran.len() / 2;
    ran.into_iter().skip(per_run).collect()
}

#[test]
fn every_gradient_is_handed_over_as_the_backward_pass_produces_it() {
    let model = minilm_dir();
    let layout = ringtune_encoders::layout(&ModelConfig::from_dir(&model).expect("config"));
    let arrivals = Arc::new(Arrivals::default());
    let sink: Arc<dyn GradSink> = arrivals.clone();
    let step = profiled_step(SyncHooks { grads: Some(sink), params: None });
    let hand_overs: Vec<&Ran> = step.iter().filter(|r| r.op == "GradReady").collect();
    let entries = layout.entries().len();
    assert_eq!(hand_overs.len(), entries, "one GradReady per parameter ran");
    let all = arrivals.0.lock().expect("lock").clone();
    let order = all[entries..].to_vec();
    assert_eq!(all.len(), 2 * entries, "every gradient reached the sink once per step");

    // When each bucket of the sync plan is complete, as a share of the step's time.
    let (t0, t1) = (step[0].start, step.last().map_or(0, |r| r.end));
    let share = |t: u64| (t - t0) as f64 / (t1 - t0).max(1) as f64;
    let bf16_mode = SyncMode { wire: Wire::Bf16, overlap: true, shard_optimizer: false, low_rank: None };
    let plan = sync_plan(&ModelDir::open(&model).expect("model"), 2, &bf16_mode);
    let mut complete = Vec::new();
    for bucket in &plan.buckets {
        let last = bucket.tensors.iter().filter_map(|t| order.iter().position(|o| o == t)).max().expect("arrived");
        complete.push(share(hand_overs[last].end));
    }
    let backward_starts = step.iter().position(|r| r.op == "SoftmaxCrossEntropyLossGrad" || r.op == "Sub");
    eprintln!(
        "{} nodes per step; buckets complete at {complete:.2?} of the step; backward from node {backward_starts:?}",
        step.len()
    );
    eprintln!("gradients in arrival order: {order:?}");
    assert!(complete[0] < 0.5, "the first bucket is complete only at {:.2} of the step", complete[0]);
    assert!(complete.windows(2).all(|w| w[0] <= w[1]), "buckets complete in plan order: {complete:?}");
    // The hand-overs are spread over the backward pass, not bunched at its end.
    let first = share(hand_overs[0].start);
    assert!(first < 0.6, "the first gradient is handed over only at {first:.2} of the step");
}

#[test]
fn every_parameter_waits_just_before_the_forward_pass_first_reads_it() {
    let model = minilm_dir();
    let layout = ringtune_encoders::layout(&ModelConfig::from_dir(&model).expect("config"));
    let waits = Arc::new(Waits::default());
    let source: Arc<dyn ParamSource> = waits.clone();
    let sink: Arc<dyn GradSink> = Arc::new(Arrivals::default());
    let step = profiled_step(SyncHooks { grads: Some(sink), params: Some(source) });
    let entries = layout.entries().len();
    let gates: Vec<&Ran> = step.iter().filter(|r| r.op == "ParamReady").collect();
    let all = waits.0.lock().expect("lock").clone();
    // The graph never reads the key biases (softmax cancels them), so nothing waits for them.
    let unread: Vec<&str> =
        layout.entries().iter().enumerate().filter(|(i, _)| !all.contains(i)).map(|(_, e)| e.name.as_str()).collect();
    assert!(unread.iter().all(|name| name.ends_with("attention.self.key.bias")), "never waited for: {unread:?}");
    let read = entries - unread.len();
    assert_eq!(gates.len(), read, "one ParamReady per parameter read ran");
    assert_eq!(all.len(), 2 * read, "every parameter read was waited for once per step");
    let order = all[read..].to_vec();

    // When each bucket of the sync plan is first needed, as a share of the step's time; the
    // gather sends them in the reverse of the plan's order (forward order).
    let (t0, t1) = (step[0].start, step.last().map_or(0, |r| r.end));
    let share = |t: u64| (t - t0) as f64 / (t1 - t0).max(1) as f64;
    let fp32_mode = SyncMode { wire: Wire::F32, overlap: true, shard_optimizer: true, low_rank: None };
    let plan = sync_plan(&ModelDir::open(&model).expect("model"), 2, &fp32_mode);
    let needed: Vec<f64> = plan
        .buckets
        .iter()
        .rev()
        .map(|bucket| {
            let first = bucket.tensors.iter().filter_map(|t| order.iter().position(|o| o == t)).min().expect("waited");
            share(gates[first].start)
        })
        .collect();
    // The forward pass ends before the first gradient is handed over.
    let first_gradient = step.iter().find(|r| r.op == "GradReady").map(|r| share(r.start)).expect("a GradReady");
    eprintln!(
        "buckets first needed at {needed:.3?} of the step (forward order); first gradient at {first_gradient:.3}"
    );
    // The embeddings' buckets are all read by the first nodes; from there on, each bucket is
    // needed no earlier than the one gathered before it.
    let at_start = 0.01;
    assert!(
        needed.windows(2).all(|w| w[0] <= w[1] || w[0] < at_start),
        "buckets are needed in gather order: {needed:?}"
    );
    // The waits are spread over the forward pass, not bunched at its start: the last bucket is
    // first read after most of the forward pass.
    let last = needed.last().copied().unwrap_or(0.0);
    assert!(
        last > 0.5 * first_gradient,
        "the last bucket is needed at {last:.3}, the first gradient at {first_gradient:.3}"
    );
}

#[test]
fn each_layer_is_done_before_most_of_the_layer_below_runs() {
    let step = profiled_step(SyncHooks::default());
    let layers = ModelConfig::from_dir(&minilm_dir()).expect("config").num_layers;
    // A layer's backward nodes: when the last one ends, and when the median one starts (a few,
    // which read only forward values, run during the forward pass).
    let backward = |layer: usize| {
        let scope = format!("grad/{}/", ringtune_encoders::layer_scope(layer));
        let mut starts: Vec<u64> = step.iter().filter(|r| r.node.starts_with(&scope)).map(|r| r.start).collect();
        starts.sort_unstable();
        let done = step.iter().filter(|r| r.node.starts_with(&scope)).map(|r| r.end).max();
        (done.expect("the layer's backward nodes ran"), starts[starts.len() / 2])
    };
    for layer in 1..layers {
        let (done, _) = backward(layer);
        let (_, below) = backward(layer - 1);
        // ONNX Runtime's own order ran every layer's weight gradients after the whole chain of
        // input gradients, the first layer's first.
        assert!(done <= below, "layer {layer}'s backward pass ends after most of layer {}'s ran", layer - 1);
    }
}
