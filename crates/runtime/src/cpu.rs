//! The CPU features that decide which kernels are fast here.

use std::fmt;

/// x86 features that matter for the matmul kernels.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuFeatures {
    /// AVX-512 foundation.
    pub avx512f: bool,
    /// AVX-512 VNNI (int8 dot products).
    pub avx512_vnni: bool,
    /// AVX-512 BF16 (bf16 dot products).
    pub avx512_bf16: bool,
    /// AMX tiles with bf16.
    pub amx_bf16: bool,
}

impl CpuFeatures {
    /// The features of the CPU this process runs on.
    pub fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            CpuFeatures {
                avx512f: std::arch::is_x86_feature_detected!("avx512f"),
                avx512_vnni: std::arch::is_x86_feature_detected!("avx512vnni"),
                avx512_bf16: std::arch::is_x86_feature_detected!("avx512bf16"),
                amx_bf16: cpuinfo_has("amx_bf16"),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        CpuFeatures::default()
    }

    /// Whether bf16 matmuls run natively (AVX512-BF16 or AMX).
    pub fn has_native_bf16(&self) -> bool {
        self.avx512_bf16 || self.amx_bf16
    }
}

/// The CPU's model name (`/proc/cpuinfo`), to name the machine beside every measurement.
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

#[cfg(target_arch = "x86_64")]
fn cpuinfo_has(flag: &str) -> bool {
    std::fs::read_to_string("/proc/cpuinfo")
        .map(|text| text.lines().filter(|l| l.starts_with("flags")).any(|l| l.split_whitespace().any(|f| f == flag)))
        .unwrap_or(false)
}

impl fmt::Display for CpuFeatures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let yes = |b: bool| if b { "yes" } else { "no" };
        write!(
            f,
            "AVX-512 {}, AVX512-VNNI {}, AVX512-BF16 {}, AMX-BF16 {}",
            yes(self.avx512f),
            yes(self.avx512_vnni),
            yes(self.avx512_bf16),
            yes(self.amx_bf16)
        )
    }
}
