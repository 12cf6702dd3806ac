//! Sessions: options, execution providers, running on borrowed tensors.

use std::borrow::Cow;
use std::path::PathBuf;

use ort::ep::{self, ExecutionProviderDispatch};
use ort::session::builder::{GraphOptimizationLevel, SessionBuilder};
use ort::session::{OutputSelector, RunOptions, SessionInputValue};

use std::sync::Arc;

use crate::{CustomOp, OwnedTensor, Result, Runtime, RuntimeError, TensorView};

const CPU: &str = "CPUExecutionProvider";
const DNNL: &str = "DnnlExecutionProvider";
const OPENVINO: &str = "OpenVINOExecutionProvider";

/// Which execution provider runs the graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum Provider {
    /// ONNX Runtime's own CPU kernels (MLAS).
    #[default]
    #[serde(alias = "mlas")]
    #[cfg_attr(feature = "clap", value(alias = "mlas"))]
    Cpu,
    /// The oneDNN (DNNL) provider, in builds that have it.
    #[serde(rename = "onednn", alias = "dnnl")]
    #[cfg_attr(feature = "clap", value(name = "onednn", alias = "dnnl"))]
    OneDnn,
    /// The OpenVINO provider, in builds that have it.
    #[serde(rename = "openvino")]
    #[cfg_attr(feature = "clap", value(name = "openvino"))]
    OpenVino,
    /// The best provider the library has (OpenVINO, then oneDNN, then CPU).
    Auto,
}

impl Provider {
    fn ort_name(self) -> &'static str {
        match self {
            Provider::Cpu | Provider::Auto => CPU,
            Provider::OneDnn => DNNL,
            Provider::OpenVino => OPENVINO,
        }
    }
}

impl std::fmt::Display for Provider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Provider::Cpu => "cpu",
            Provider::OneDnn => "onednn",
            Provider::OpenVino => "openvino",
            Provider::Auto => "auto",
        })
    }
}

/// Where a session's tensors get their memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum Arena {
    /// One arena for every session of the process (training and evaluation share it), grown
    /// by what each allocation needs: a bert-base training step's arena holds 3 % more than
    /// its tensors' peak.
    #[default]
    Shared,
    /// ONNX Runtime's arena of each session, grown by powers of two: the same step reserved
    /// 4 GiB for a 3.4 GiB peak, and touched all of it.
    Session,
    /// No arena: every tensor from the C library's allocator.
    Off,
}

/// How much ONNX Runtime rewrites the graph before running it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GraphOptimization {
    /// Run the graph as built.
    Disable,
    /// Constant folding and redundancy removal.
    Basic,
    /// Plus fusions (Gelu, LayerNorm, MatMul+Transpose, ...).
    Extended,
    /// Everything, including layout changes.
    #[default]
    All,
}

/// Options for a session.
#[derive(Debug, Clone)]
pub struct SessionOptions {
    /// Intra-op threads (0: ONNX Runtime's default, one per core).
    pub threads: usize,
    /// Graph optimisation level.
    pub optimization: GraphOptimization,
    /// Where tensors' memory comes from.
    pub arena: Arena,
    /// Whether ONNX Runtime plans each input shape's tensors as one block after its first run
    /// (the memory pattern). Off by default: the block sits on top of what the first run left
    /// in the arena, which doubled a bert-base training step's memory (9.0 against 5.5 GiB).
    pub memory_pattern: bool,
    /// Whether idle intra-op threads spin (faster steps, but they steal a core from other work).
    pub spinning: bool,
    /// The execution provider.
    pub provider: Provider,
    /// Writes ONNX Runtime's profile (JSON) with this file prefix.
    pub profile: Option<PathBuf>,
    /// Our operators that graphs of this session may use (registered in the
    /// [`crate::DOMAIN`] domain).
    pub custom_ops: CustomOps,
}

/// The custom operators a session registers.
#[derive(Clone, Default)]
pub struct CustomOps(pub Vec<Arc<dyn CustomOp>>);

impl std::fmt::Debug for CustomOps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.0.iter().map(|op| op.name())).finish()
    }
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            threads: 0,
            optimization: GraphOptimization::All,
            arena: Arena::Shared,
            memory_pattern: false,
            spinning: true,
            provider: Provider::Cpu,
            profile: None,
            custom_ops: CustomOps::default(),
        }
    }
}

/// A graph loaded into ONNX Runtime.
pub struct Session {
    pub(crate) inner: ort::session::Session,
    provider: &'static str,
    inputs: Vec<String>,
    outputs: Vec<String>,
}

/// Held while a session with custom operators loads.
static CUSTOM_DOMAIN_LOAD: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl Session {
    /// Loads the ONNX model `model` (serialised `ModelProto`) with `options`.
    pub fn from_bytes(runtime: &Runtime, model: &[u8], options: &SessionOptions) -> Result<Self> {
        let (builder, provider) = configure(runtime, options)?;
        let mut builder = builder;
        // ONNX Runtime registers a custom operator domain in a process-wide table with a check
        // and an insert that are not atomic: two sessions with our operators loading at once
        // fail with "the domain is already exist". Loading one at a time avoids it.
        let _one_at_a_time = CUSTOM_DOMAIN_LOAD.lock().unwrap_or_else(|p| p.into_inner());
        let inner =
            builder.commit_from_memory(model).map_err(RuntimeError::ort("loading the model into ONNX Runtime"))?;
        let inputs = inner.inputs().iter().map(|o| o.name().to_string()).collect();
        let outputs = inner.outputs().iter().map(|o| o.name().to_string()).collect();
        Ok(Session { inner, provider, inputs, outputs })
    }

    /// The graph's input names, in order.
    pub fn input_names(&self) -> &[String] {
        &self.inputs
    }

    /// The graph's output names, in order.
    pub fn output_names(&self) -> &[String] {
        &self.outputs
    }

    /// The execution provider the session was built with (`CPUExecutionProvider`, ...).
    pub fn provider(&self) -> &str {
        self.provider
    }

    /// Runs the graph on borrowed `inputs` (no copy) and returns copies of the named `outputs`
    /// (every output when `outputs` is empty).
    pub fn run(&mut self, inputs: &[(&str, TensorView<'_>)], outputs: &[&str]) -> Result<Vec<OwnedTensor>> {
        let feeds = inputs
            .iter()
            .map(|(name, view)| Ok((Cow::Borrowed(*name), view.to_ort(name)?)))
            .collect::<Result<Vec<(Cow<'_, str>, SessionInputValue<'_>)>>>()?;
        let wanted: Vec<String> = if outputs.is_empty() {
            self.outputs.clone()
        } else {
            for name in outputs {
                if !self.outputs.iter().any(|o| o == name) {
                    return Err(RuntimeError::Binding(format!(
                        "the graph has no output `{name}`; it has: {}",
                        self.outputs.join(", ")
                    )));
                }
            }
            outputs.iter().map(|s| s.to_string()).collect()
        };
        let selector = wanted.iter().fold(OutputSelector::no_default(), |sel, name| sel.with(name.as_str()));
        let options = RunOptions::new().map_err(RuntimeError::ort("creating run options"))?.with_outputs(selector);
        let results = self.inner.run_with_options(feeds, &options).map_err(RuntimeError::ort("running the graph"))?;
        wanted
            .iter()
            .map(|name| {
                let value = results
                    .get(name.as_str())
                    .ok_or_else(|| RuntimeError::Binding(format!("ONNX Runtime returned no `{name}`")))?;
                OwnedTensor::from_ort(name, value)
            })
            .collect()
    }

    /// Ends profiling and returns the profile file, when profiling was on.
    pub fn end_profiling(&mut self) -> Result<String> {
        self.inner.end_profiling().map_err(RuntimeError::ort("ending the profile"))
    }
}

fn configure(runtime: &Runtime, options: &SessionOptions) -> Result<(SessionBuilder, &'static str)> {
    let context = "configuring the session";
    let level = match options.optimization {
        GraphOptimization::Disable => GraphOptimizationLevel::Disable,
        GraphOptimization::Basic => GraphOptimizationLevel::Level1,
        GraphOptimization::Extended => GraphOptimizationLevel::Level2,
        GraphOptimization::All => GraphOptimizationLevel::All,
    };
    let provider = choose_provider(runtime, options.provider)?;
    let dispatch: ExecutionProviderDispatch = match provider {
        DNNL => ep::OneDNN::default().with_arena_allocator(options.arena != Arena::Off).build(),
        OPENVINO => ep::OpenVINO::default().with_device_type("CPU").build(),
        _ => ep::CPU::default().with_arena_allocator(options.arena != Arena::Off).build(),
    };
    let mut builder = ort::session::Session::builder(&runtime.env)
        .map_err(RuntimeError::ort(context))?
        .with_optimization_level(level)
        .map_err(RuntimeError::ort(context))?
        .with_intra_threads(options.threads)
        .map_err(RuntimeError::ort(context))?
        .with_intra_op_spinning(options.spinning)
        .map_err(RuntimeError::ort(context))?
        .with_memory_pattern(options.memory_pattern)
        .map_err(RuntimeError::ort(context))?
        .with_execution_providers([dispatch.error_on_failure()])
        .map_err(RuntimeError::ort(format!("registering {provider}")))?;
    if options.arena == Arena::Shared {
        runtime.register_shared_arena()?;
        builder = builder.with_env_allocators().map_err(RuntimeError::ort(context))?;
    }
    if provider != CPU {
        // Nodes the provider does not take fall back to the CPU provider; keep its arena setting.
        builder = builder
            .with_execution_providers([ep::CPU::default().with_arena_allocator(options.arena != Arena::Off).build()])
            .map_err(RuntimeError::ort(context))?;
    }
    if !options.custom_ops.0.is_empty() {
        builder = builder
            .with_operators(crate::custom_op::domain(&options.custom_ops.0)?)
            .map_err(RuntimeError::ort(format!("registering the {} operators", crate::DOMAIN)))?;
    }
    if let Some(prefix) = &options.profile {
        builder = builder.with_profiling(prefix).map_err(RuntimeError::ort(context))?;
    }
    Ok((builder, provider))
}

/// The ONNX Runtime name of the provider to use, or an error listing what the library has.
fn choose_provider(runtime: &Runtime, wanted: Provider) -> Result<&'static str> {
    let has = |name: &str| runtime.providers().iter().any(|p| p == name);
    if wanted == Provider::Auto {
        let best = [OPENVINO, DNNL].into_iter().find(|p| has(p)).unwrap_or(CPU);
        tracing::info!(provider = best, "execution provider chosen automatically");
        return Ok(best);
    }
    let name = wanted.ort_name();
    if has(name) {
        Ok(name)
    } else {
        Err(RuntimeError::ProviderUnavailable {
            requested: wanted.to_string(),
            library: runtime.library().to_path_buf(),
            available: runtime.providers().to_vec(),
        })
    }
}

/// Every execution provider the loaded library offers, through `GetAvailableProviders`.
#[allow(unsafe_code)]
pub(crate) fn available_providers() -> Result<Vec<String>> {
    use std::ffi::{c_char, c_int, CStr};
    let api = ort::api();
    let mut names: *mut *mut c_char = std::ptr::null_mut();
    let mut count: c_int = 0;
    // SAFETY: ONNX Runtime fills `names` with `count` NUL-terminated strings, which we copy
    // before handing them back with ReleaseAvailableProviders.
    let status = unsafe { (api.GetAvailableProviders)(&mut names, &mut count) };
    // SAFETY: `status` comes straight from the call above.
    unsafe { ort::Error::result_from_status(status) }.map_err(RuntimeError::ort("listing execution providers"))?;
    if names.is_null() {
        return Ok(Vec::new());
    }
    let providers = (0..count.max(0) as usize)
        // SAFETY: index below `count`, each entry a valid C string (see above).
        .map(|i| unsafe { CStr::from_ptr(*names.add(i)) }.to_string_lossy().into_owned())
        .collect();
    // SAFETY: releases exactly what GetAvailableProviders allocated.
    let status = unsafe { (api.ReleaseAvailableProviders)(names, count) };
    // SAFETY: as above.
    unsafe { ort::Error::result_from_status(status) }.map_err(RuntimeError::ort("listing execution providers"))?;
    Ok(providers)
}
