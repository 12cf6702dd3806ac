//! Where the gradient hand-over runs, read from ONNX Runtime's own profile of a MiniLM training
//! step: one `GradReady` per parameter, each as the backward pass produces its gradient (last
//! layer first), so that the first bucket of the sync plan is complete while most of the
//! backward pass is still to run and the ring can reduce it meanwhile.

use std::sync::{Arc, Mutex};

use ringtune_bert::{load_params, ModelConfig};
use ringtune_ops::grad_ready::GradSink;
use ringtune_ops::Kernels;
use ringtune_runtime::{FlatBuffer, SessionOptions};
use ringtune_tests::{fixtures, minilm_dir, read_batch, runtime};
use ringtune_trainer::distributed::sync_plan;
use ringtune_trainer::engine::Engine;
use ringtune_trainer::model::ModelDir;

/// Which gradients arrived, in order.
#[derive(Default)]
struct Arrivals(Mutex<Vec<usize>>);

impl GradSink for Arrivals {
    fn take(&self, tensor: usize, _grad: &[f32]) -> Result<(), String> {
        self.0.lock().map_err(|e| e.to_string())?.push(tensor);
        Ok(())
    }
}

/// A node's run in the profile: its operator, start and duration (microseconds).
struct Ran {
    op: String,
    start: u64,
    end: u64,
}

fn node_events(profile: &str) -> Vec<Ran> {
    let events: Vec<serde_json::Value> = serde_json::from_str(profile).expect("the profile is a JSON array");
    let mut ran: Vec<Ran> = events
        .iter()
        .filter(|e| e["cat"] == "Node" && e["name"].as_str().is_some_and(|n| n.ends_with("_kernel_time")))
        .filter_map(|e| {
            let (start, dur) = (e["ts"].as_u64()?, e["dur"].as_u64()?);
            Some(Ran { op: e["args"]["op_name"].as_str()?.to_string(), start, end: start + dur })
        })
        .collect();
    ran.sort_by_key(|r| r.start);
    ran
}

#[test]
fn every_gradient_is_handed_over_as_the_backward_pass_produces_it() {
    let dir = tempfile::tempdir().expect("dir");
    let model = minilm_dir();
    let config = ModelConfig::from_dir(&model).expect("config").with_dropout(0.0);
    let layout = ringtune_bert::layout(&config);
    let mut params = FlatBuffer::zeros(layout.total_len());
    let weights = [model.join("model.safetensors"), fixtures().join("minilm-mrpc/classifier.safetensors")];
    load_params(&weights, &config, &layout, 0, &mut params).expect("weights");
    let arrivals = Arc::new(Arrivals::default());
    let options = SessionOptions { threads: 1, profile: Some(dir.path().join("step")), ..SessionOptions::default() };
    let sink: Arc<dyn GradSink> = arrivals.clone();
    let mut engine =
        Engine::new(runtime(), &config, &layout, params, false, Kernels::Mlas, &options, Some(sink)).expect("engine");
    let batch = read_batch(&fixtures().join("minilm-mrpc/batch.safetensors"));
    engine.step(&batch).expect("warm-up step");
    arrivals.0.lock().expect("lock").clear();
    engine.step(&batch).expect("step");
    let file = engine.end_profiling().expect("profile");
    let ran = node_events(&std::fs::read_to_string(&file).expect("profile file"));

    // The step's nodes: the second run's, from its first node on.
    let per_run = ran.len() / 2;
    let step = &ran[ran.len() - per_run..];
    let hand_overs: Vec<&Ran> = step.iter().filter(|r| r.op == "GradReady").collect();
    let entries = layout.entries().len();
    assert_eq!(hand_overs.len(), entries, "one GradReady per parameter ran");
    let order = arrivals.0.lock().expect("lock").clone();
    assert_eq!(order.len(), entries, "every gradient reached the sink once");

    // When each bucket of the sync plan is complete, as a share of the step's time.
    let (t0, t1) = (step[0].start, step.last().map_or(0, |r| r.end));
    let share = |t: u64| (t - t0) as f64 / (t1 - t0).max(1) as f64;
    let plan = sync_plan(&ModelDir::open(&model).expect("model"), 2);
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
