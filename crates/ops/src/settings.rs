//! The kernel settings as a command line or a config file names them, and the choice they
//! resolve to on this CPU.

use ringtune_onednn::Precision;
use serde::{Deserialize, Serialize};

/// Which kernels run the matrix products.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum KernelChoice {
    /// ONNX Runtime's own (MLAS), in fp32.
    Mlas,
    /// Our oneDNN operators (the default: fastest in `just bench`).
    #[default]
    Onednn,
}

/// The precision of the oneDNN products.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum PrecisionChoice {
    /// fp32 throughout.
    Fp32,
    /// bf16 inputs, fp32 accumulation and outputs (as PyTorch's autocast).
    Bf16,
    /// bf16 where the CPU multiplies it natively (AVX512-BF16 or AMX), else fp32.
    #[default]
    Auto,
}

/// The kernels a graph is lowered for and a session registers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Kernels {
    /// ONNX Runtime's own (MLAS).
    #[default]
    Mlas,
    /// oneDNN, through the `ai.ringtune` operators, at this precision.
    OneDnn(Precision),
}

impl Kernels {
    /// The choice of `kernels` and `precision` on this CPU (`auto` resolved).
    pub fn resolve(kernels: KernelChoice, precision: PrecisionChoice) -> Self {
        let native_bf16 = ringtune_runtime::CpuFeatures::detect().has_native_bf16();
        match (kernels, precision) {
            (KernelChoice::Mlas, _) => Kernels::Mlas,
            (KernelChoice::Onednn, PrecisionChoice::Fp32) => Kernels::OneDnn(Precision::F32),
            (KernelChoice::Onednn, PrecisionChoice::Bf16) => Kernels::OneDnn(Precision::Bf16),
            (KernelChoice::Onednn, PrecisionChoice::Auto) if native_bf16 => Kernels::OneDnn(Precision::Bf16),
            (KernelChoice::Onednn, PrecisionChoice::Auto) => Kernels::OneDnn(Precision::F32),
        }
    }
}

impl std::fmt::Display for Kernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Kernels::Mlas => "mlas fp32",
            Kernels::OneDnn(Precision::F32) => "onednn fp32",
            Kernels::OneDnn(Precision::Bf16) => "onednn bf16",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_read_as_their_lowercase_names() {
        #[derive(Deserialize)]
        struct S {
            kernels: KernelChoice,
            precision: PrecisionChoice,
        }
        let s: S = serde_json::from_str(r#"{"kernels": "mlas", "precision": "bf16"}"#).expect("parse");
        assert_eq!((s.kernels, s.precision), (KernelChoice::Mlas, PrecisionChoice::Bf16));
        assert!(serde_json::from_str::<S>(r#"{"kernels": "cublas", "precision": "bf16"}"#).is_err());
        assert_eq!(Kernels::resolve(KernelChoice::Mlas, PrecisionChoice::Bf16), Kernels::Mlas);
        assert_eq!(Kernels::resolve(KernelChoice::Onednn, PrecisionChoice::Fp32), Kernels::OneDnn(Precision::F32));
    }
}
