//! `ringtune info`: what this machine and the loaded ONNX Runtime offer.

use std::fmt;

use ringtune_runtime::{default_library_path, CpuFeatures, Runtime};

/// Everything `ringtune info` prints.
pub struct Report {
    /// The ONNX Runtime library, its version and providers, or why it did not load.
    pub runtime: Result<(String, String, Vec<String>), String>,
    /// CPU features.
    pub cpu: CpuFeatures,
    /// The oneDNN library for `--kernels onednn`, or why it is not usable.
    pub onednn: Result<String, String>,
}

impl Report {
    /// Loads ONNX Runtime (from the usual places) and reads the CPU's features.
    pub fn gather() -> Self {
        let runtime = Runtime::get()
            .map(|rt| (rt.library().display().to_string(), rt.version().to_string(), rt.providers().to_vec()))
            .map_err(|e| e.to_string());
        let onednn = ringtune_ops::dnnl::engine(0)
            .map(|e| {
                let bf16 = if e.supports(ringtune_ops::Precision::Bf16) { "bf16 and fp32" } else { "fp32 only" };
                format!("{} ({bf16} products on this CPU)", e.library().display())
            })
            .map_err(|e| e.to_string());
        Report { runtime, cpu: CpuFeatures::detect(), onednn }
    }

    /// The CPU part only (for contexts where loading ONNX Runtime is not wanted).
    pub fn gather_without_runtime() -> Self {
        Report {
            runtime: Err(format!("not loaded (would load {})", default_library_path().path.display())),
            cpu: CpuFeatures::detect(),
            onednn: Err("not loaded".into()),
        }
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.runtime {
            Ok((library, version, providers)) => {
                writeln!(f, "ONNX Runtime   {version}")?;
                writeln!(f, "library        {library}")?;
                writeln!(f, "providers      {}", providers.join(", "))?;
            }
            Err(e) => writeln!(f, "ONNX Runtime   {e}")?,
        }
        writeln!(f, "CPU model      {}", ringtune_runtime::cpu_model())?;
        writeln!(f, "CPU            {}", self.cpu)?;
        let auto = if self.cpu.has_native_bf16() {
            "bf16 (the CPU multiplies bf16 natively)"
        } else {
            "fp32 (no AVX512-BF16 or AMX)"
        };
        writeln!(f, "precision auto {auto}")?;
        match &self.onednn {
            Ok(path) => writeln!(f, "oneDNN         {path}")?,
            Err(e) => writeln!(f, "oneDNN         {e}")?,
        }
        writeln!(f, "threads        {}", std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1))
    }
}
