//! Finding and loading `libdnnl.so.3`, and the function table resolved from it.

use std::path::{Path, PathBuf};

use crate::ffi::{resolve, Api};
use crate::DnnlError;

/// The oneDNN version `just setup` provisions.
pub const ONEDNN_VERSION: &str = "2023.2.0";

/// The library `Engine::load_default` uses: `RINGTUNE_DNNL_LIB`, else the cache folder
/// ([`ringtune_files::cache_dir`]).
pub fn default_library_path() -> PathBuf {
    match std::env::var_os("RINGTUNE_DNNL_LIB").filter(|v| !v.is_empty()) {
        Some(p) => PathBuf::from(p),
        None => ringtune_files::cache_dir().path.join(format!("onednn-{ONEDNN_VERSION}")).join("lib/libdnnl.so.3"),
    }
}

/// The loaded library and its functions. Every handle keeps it alive (through an `Arc`), so
/// the library is unloaded only after the last handle is destroyed.
pub(crate) struct Library {
    pub(crate) api: Api,
    /// libgomp's `omp_set_num_threads`, when the library's dependencies provide it.
    pub(crate) omp_set_num_threads: Option<unsafe extern "C" fn(i32)>,
    pub(crate) path: PathBuf,
    // Last: unloaded after the table above is no longer used.
    _lib: libloading::Library,
}

impl Library {
    pub(crate) fn load(path: &Path) -> Result<Self, DnnlError> {
        let fail = |reason: String| DnnlError::Load { path: path.to_path_buf(), reason };
        if !path.is_file() {
            return Err(fail("no such file".into()));
        }
        // SAFETY: loading runs the library's initialisers; oneDNN's are benign.
        let lib = unsafe { libloading::Library::new(path) }.map_err(|e| fail(e.to_string()))?;
        // SAFETY: the symbols are oneDNN 3.x's, with the signatures of `ffi::Api`.
        let api = unsafe { resolve(&lib) }.map_err(fail)?;
        // SAFETY: libgomp's function, found through the library's dependencies when present.
        let omp_set_num_threads =
            unsafe { lib.get::<unsafe extern "C" fn(i32)>(b"omp_set_num_threads\0") }.ok().map(|s| *s);
        Ok(Library { api, omp_set_num_threads, path: path.to_path_buf(), _lib: lib })
    }
}
