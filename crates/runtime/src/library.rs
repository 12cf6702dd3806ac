//! Finding, loading and describing the ONNX Runtime library.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use crate::{Result, RuntimeError};

/// The ONNX Runtime version that `just setup` provisions and `ort` is built against.
pub const ORT_VERSION: &str = "1.31.1";

/// A library path and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LibraryChoice {
    /// The library file.
    pub path: PathBuf,
    /// `RINGTUNE_ORT_LIB`, `ORT_DYLIB_PATH` or the cache folder.
    pub origin: String,
}

/// The library to load: `RINGTUNE_ORT_LIB`, else `ORT_DYLIB_PATH`, else the cache folder
/// that `just setup` fills ([`ringtune_files::cache_dir`]).
pub fn default_library_path() -> LibraryChoice {
    choose_library(|var| std::env::var_os(var), ringtune_files::cache_dir())
}

fn choose_library(
    var_os: impl Fn(&str) -> Option<std::ffi::OsString>,
    cache: ringtune_files::CacheDir,
) -> LibraryChoice {
    for var in ["RINGTUNE_ORT_LIB", "ORT_DYLIB_PATH"] {
        if let Some(path) = var_os(var).filter(|v| !v.is_empty()) {
            return LibraryChoice { path: PathBuf::from(path), origin: var.to_string() };
        }
    }
    LibraryChoice {
        path: cache.path.join(format!("onnxruntime-{ORT_VERSION}")).join(format!("libonnxruntime.so.{ORT_VERSION}")),
        origin: cache.origin.to_string(),
    }
}

/// The loaded ONNX Runtime: one per process.
pub struct Runtime {
    pub(crate) env: ort::environment::Environment,
    library: PathBuf,
    version: String,
    providers: Vec<String>,
    /// Whether the environment's shared CPU arena is registered (or why it could not be).
    pub(crate) shared_arena: OnceLock<std::result::Result<(), String>>,
}

static RUNTIME: OnceLock<Runtime> = OnceLock::new();
static LOADING: Mutex<()> = Mutex::new(());

impl Runtime {
    /// The runtime, loading the library from [`default_library_path`] on first use.
    pub fn get() -> Result<&'static Runtime> {
        if let Some(rt) = RUNTIME.get() {
            return Ok(rt);
        }
        let choice = default_library_path();
        Self::load(&choice.path, &choice.origin)
    }

    /// Loads ONNX Runtime from `path` (`origin` says where the path came from, for messages).
    /// Loading the same library twice returns the first; a different one is an error.
    pub fn load(path: &Path, origin: &str) -> Result<&'static Runtime> {
        let _guard = LOADING.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let requested = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
        if let Some(rt) = RUNTIME.get() {
            return if rt.library == requested {
                Ok(rt)
            } else {
                Err(RuntimeError::AlreadyLoaded { loaded: rt.library.clone(), requested })
            };
        }
        if !requested.is_file() {
            return Err(RuntimeError::LibraryNotFound { path: path.to_path_buf(), origin: origin.to_string() });
        }
        // `ort::init_from` must come before any other ort call: others would load a default
        // library and panic when it is missing.
        let builder = ort::init_from(&requested)
            .map_err(|e| RuntimeError::LibraryLoad { path: requested.clone(), reason: e.to_string() })?;
        let env = builder
            .with_name("ringtune")
            .with_telemetry(false)
            .build()
            .map_err(RuntimeError::ort("creating the ONNX Runtime environment"))?;
        let runtime = Runtime {
            env,
            version: version_of(&requested)?,
            providers: crate::session::available_providers()?,
            library: requested,
            shared_arena: OnceLock::new(),
        };
        tracing::debug!(library = %runtime.library.display(), version = %runtime.version, "loaded ONNX Runtime");
        Ok(RUNTIME.get_or_init(|| runtime))
    }

    /// The library file in use.
    pub fn library(&self) -> &Path {
        &self.library
    }

    /// ONNX Runtime's version, as its build reports it.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The execution providers this build offers (`CPUExecutionProvider`, ...).
    pub fn providers(&self) -> &[String] {
        &self.providers
    }
}

/// The library's own version string (`OrtGetApiBase()->GetVersionString()`); ort does not
/// expose it, and the build-info string need not carry it.
#[allow(unsafe_code)]
fn version_of(library: &Path) -> Result<String> {
    let fail = |reason: String| RuntimeError::LibraryLoad { path: library.to_path_buf(), reason };
    // SAFETY: the same library is already loaded by ort; opening it again only takes a reference.
    let lib = unsafe { libloading::Library::new(library) }.map_err(|e| fail(e.to_string()))?;
    // SAFETY: `OrtGetApiBase` has this signature in every ONNX Runtime release.
    let get_base: libloading::Symbol<'_, unsafe extern "C" fn() -> *const ort::sys::OrtApiBase> =
        unsafe { lib.get(b"OrtGetApiBase") }.map_err(|e| fail(e.to_string()))?;
    // SAFETY: the base is a static table inside the library, and the version a static C string.
    let version = unsafe {
        let base = get_base();
        if base.is_null() {
            return Err(fail("OrtGetApiBase returned null".into()));
        }
        std::ffi::CStr::from_ptr(((*base).GetVersionString)())
    };
    Ok(version.to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn library_search_order() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |var: &str| pairs.iter().find(|(k, _)| *k == var).map(|(_, v)| (*v).into())
        };
        let cache = || ringtune_files::CacheDir { path: PathBuf::from("/c"), origin: "RINGTUNE_CACHE" };
        let both = env(&[("RINGTUNE_ORT_LIB", "/a.so"), ("ORT_DYLIB_PATH", "/b.so")]);
        assert_eq!(choose_library(both, cache()).path, PathBuf::from("/a.so"));
        let ort_only = env(&[("RINGTUNE_ORT_LIB", ""), ("ORT_DYLIB_PATH", "/b.so")]);
        assert_eq!(choose_library(ort_only, cache()).origin, "ORT_DYLIB_PATH");
        let cached = choose_library(env(&[]), cache());
        assert_eq!(cached.path, PathBuf::from("/c/onnxruntime-1.31.1/libonnxruntime.so.1.31.1"));
        assert_eq!(cached.origin, "RINGTUNE_CACHE");
    }
}
