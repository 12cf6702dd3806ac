//! Safe bindings to oneDNN's matrix products, over the CPU build that PyPI ships
//! (`onednn-cpu-gomp`), loaded at run time.
//!
//! Owns: finding and loading `libdnnl.so.3` (`RINGTUNE_DNNL_LIB`, else the cache folder that
//! `just setup` fills), one engine and stream, matmul primitives described by
//! memory descriptors with strides (so transposed operands are read in place), created once per
//! shape and cached, in `fp32` or `bf16` (A and B rounded to bf16 by reorder primitives, then
//! multiplied with fp32 accumulation into an fp32 output).
//!
//! Does not own: ONNX Runtime custom operators (`runtime`), or which graph nodes use them.
//! All `unsafe` code of the oneDNN path lives here.
//!
//! ```no_run
//! use onednn::{Engine, Matmul, Precision, Bias};
//! let engine = Engine::load_default().unwrap();
//! let spec = Matmul::plain(2, 3, 2, Precision::F32);
//! let a = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
//! let b = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0];
//! let mut c = [0.0; 4];
//! engine.matmul(&spec, &a, &b, None, &mut c).unwrap();
//! assert_eq!(c, [4.0, 5.0, 10.0, 11.0]);
//! ```

#![allow(unsafe_code)]

mod ffi;

use std::collections::HashMap;
use std::ffi::{c_void, CStr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use ffi::*;

/// The oneDNN version `just setup` provisions.
pub const ONEDNN_VERSION: &str = "2023.2.0";

/// What can go wrong with oneDNN.
#[derive(Debug, Clone, thiserror::Error)]
pub enum DnnlError {
    /// The library could not be loaded.
    #[error(
        "could not load oneDNN from {path}: {reason}; run `just setup`, or set RINGTUNE_DNNL_LIB to \
         libdnnl.so.3"
    )]
    Load {
        /// The path tried.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// A oneDNN call failed.
    #[error("oneDNN {call} failed with status {status}")]
    Call {
        /// The function.
        call: &'static str,
        /// Its status code.
        status: i32,
    },
    /// Buffers that do not fit the product.
    #[error("{0}")]
    Shape(String),
}

/// The arithmetic of a product.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Precision {
    /// fp32 multiplies and accumulation.
    F32,
    /// bf16 multiplies (inputs rounded to bf16), fp32 accumulation and output.
    Bf16,
}

/// A bias added to the product (the `C` of a `Gemm` with `beta = 1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Bias {
    /// `[n]`, added to every row.
    Row,
    /// `[m, 1]`, added to every column.
    Column,
    /// `[m, n]`.
    Full,
}

/// `out[b] = op(A[b]) @ op(B[b]) (+ bias)`, batch axes broadcast numpy-style.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Matmul {
    /// A's leading axes (as many as B's; 1 where broadcast).
    pub batch_a: Vec<i64>,
    /// B's leading axes.
    pub batch_b: Vec<i64>,
    /// Rows of op(A).
    pub m: i64,
    /// Columns of op(A), rows of op(B).
    pub k: i64,
    /// Columns of op(B).
    pub n: i64,
    /// A is stored `[.., k, m]`.
    pub trans_a: bool,
    /// B is stored `[.., n, k]`.
    pub trans_b: bool,
    /// The bias, if any (2-D products only).
    pub bias: Option<Bias>,
    /// Arithmetic.
    pub precision: Precision,
}

impl Matmul {
    /// A 2-D product of `[m, k]` by `[k, n]`.
    pub fn plain(m: i64, k: i64, n: i64, precision: Precision) -> Self {
        Matmul { batch_a: vec![], batch_b: vec![], m, k, n, trans_a: false, trans_b: false, bias: None, precision }
    }

    /// The output's batch axes.
    pub fn batch_out(&self) -> Vec<i64> {
        self.batch_a.iter().zip(&self.batch_b).map(|(&a, &b)| a.max(b)).collect()
    }

    fn count(dims: &[i64]) -> usize {
        dims.iter().product::<i64>().max(0) as usize
    }

    /// Elements of A, B, the bias and the output.
    pub fn lens(&self) -> (usize, usize, usize, usize) {
        let bias = match self.bias {
            None => 0,
            Some(Bias::Row) => self.n as usize,
            Some(Bias::Column) => self.m as usize,
            Some(Bias::Full) => (self.m * self.n) as usize,
        };
        (
            Self::count(&self.batch_a) * (self.m * self.k) as usize,
            Self::count(&self.batch_b) * (self.k * self.n) as usize,
            bias,
            Self::count(&self.batch_out()) * (self.m * self.n) as usize,
        )
    }

    fn check(&self) -> Result<(), DnnlError> {
        let bad = |why: String| Err(DnnlError::Shape(why));
        if self.batch_a.len() != self.batch_b.len() || self.batch_a.len() + 2 > DNNL_MAX_NDIMS {
            return bad(format!(
                "batch axes {:?} and {:?} must have one rank (at most 10)",
                self.batch_a, self.batch_b
            ));
        }
        if self.m <= 0 || self.k <= 0 || self.n <= 0 {
            return bad(format!("empty product {}x{}x{}", self.m, self.k, self.n));
        }
        for (&a, &b) in self.batch_a.iter().zip(&self.batch_b) {
            if a != b && a != 1 && b != 1 {
                return bad(format!("batch axes {:?} and {:?} do not broadcast", self.batch_a, self.batch_b));
            }
        }
        if self.bias.is_some() && !self.batch_a.is_empty() {
            return bad("a bias is supported on 2-D products only".into());
        }
        Ok(())
    }
}

/// Row-major strides of `dims`.
fn dense_strides(dims: &[i64]) -> Vec<i64> {
    let mut strides = vec![1; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * dims[i + 1].max(1);
    }
    strides
}

/// Logical dims and strides of an operand stored with its last two axes swapped or not.
fn operand(batch: &[i64], rows: i64, cols: i64, transposed: bool) -> (Vec<i64>, Vec<i64>) {
    let stored_last: [i64; 2] = if transposed { [cols, rows] } else { [rows, cols] };
    let mut stored = batch.to_vec();
    stored.extend(stored_last);
    let mut strides = dense_strides(&stored);
    let r = strides.len();
    if transposed {
        strides.swap(r - 2, r - 1);
    }
    let mut dims = batch.to_vec();
    dims.extend([rows, cols]);
    (dims, strides)
}

/// A primitive and its descriptor.
struct Handle {
    pd: dnnl_primitive_desc_t,
    prim: dnnl_primitive_t,
}

/// Everything one product needs: the matmul; the reorder that packs B into the layout the
/// matmul prefers (and rounds it to bf16); for bf16, the reorder that rounds A.
struct Primitive {
    matmul: Handle,
    /// f32 A, f32 B, f32 output, then the bias if any.
    mds: Vec<dnnl_memory_desc_t>,
    /// B as the matmul wants it (owned by the matmul's descriptor), its size in bytes, and the
    /// reorder from the caller's B.
    packed_b: (dnnl_memory_desc_t, usize, Handle),
    /// bf16 A and the reorder into it.
    bf16_a: Option<(dnnl_memory_desc_t, Handle)>,
    /// The bias descriptor, if any (also in `mds`).
    bias_md: Option<dnnl_memory_desc_t>,
    implementation: String,
}

/// The loaded library, its CPU engine and stream, and the primitives made so far.
pub struct Engine {
    api: Api,
    engine: dnnl_engine_t,
    stream: Mutex<dnnl_stream_t>,
    primitives: Mutex<HashMap<Matmul, Arc<Primitive>>>,
    /// bf16 copies of A and B, reused across calls.
    scratch: Mutex<(Vec<u16>, Vec<u16>)>,
    omp_set_num_threads: Option<unsafe extern "C" fn(i32)>,
    threads: std::sync::atomic::AtomicI32,
    path: PathBuf,
    // Last, so that it is unloaded after everything above is destroyed.
    _lib: libloading::Library,
}

// SAFETY: oneDNN engines and primitives may be used from any thread; the stream is behind a
// mutex; the raw pointers are only handed to oneDNN.
unsafe impl Send for Engine {}
// SAFETY: as above.
unsafe impl Sync for Engine {}
// SAFETY: a primitive is immutable after creation and oneDNN executes it from any thread.
unsafe impl Send for Primitive {}
// SAFETY: as above.
unsafe impl Sync for Primitive {}

fn call(name: &'static str, status: dnnl_status_t) -> Result<(), DnnlError> {
    if status == DNNL_SUCCESS {
        Ok(())
    } else {
        Err(DnnlError::Call { call: name, status })
    }
}

/// The library `load_default` uses: `RINGTUNE_DNNL_LIB`, else the workspace's cache.
pub fn default_library_path() -> PathBuf {
    match std::env::var_os("RINGTUNE_DNNL_LIB").filter(|v| !v.is_empty()) {
        Some(p) => PathBuf::from(p),
        None => {
            let cache = std::env::var_os("RINGTUNE_CACHE")
                .map(PathBuf::from)
                .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.cache"));
            cache.join(format!("onednn-{ONEDNN_VERSION}")).join("lib/libdnnl.so.3")
        }
    }
}

impl Engine {
    /// Loads the library from [`default_library_path`].
    pub fn load_default() -> Result<Self, DnnlError> {
        Self::load(&default_library_path())
    }

    /// Loads oneDNN from `path` and creates a CPU engine and stream.
    pub fn load(path: &Path) -> Result<Self, DnnlError> {
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
        let mut engine: dnnl_engine_t = std::ptr::null_mut();
        // SAFETY: out-pointer to a local; index 0 of the CPU engine always exists.
        call("dnnl_engine_create", unsafe { (api.engine_create)(&mut engine, DNNL_CPU, 0) })?;
        let mut stream: dnnl_stream_t = std::ptr::null_mut();
        // SAFETY: out-pointer to a local; `engine` was just created.
        call("dnnl_stream_create", unsafe { (api.stream_create)(&mut stream, engine, DNNL_STREAM_IN_ORDER) })?;
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get() as i32);
        Ok(Engine {
            api,
            engine,
            stream: Mutex::new(stream),
            primitives: Mutex::new(HashMap::new()),
            scratch: Mutex::new((Vec::new(), Vec::new())),
            omp_set_num_threads,
            threads: std::sync::atomic::AtomicI32::new(threads),
            path: path.to_path_buf(),
            _lib: lib,
        })
    }

    /// The library in use.
    pub fn library(&self) -> &Path {
        &self.path
    }

    /// Threads oneDNN's OpenMP regions use (default: one per core).
    pub fn set_threads(&self, threads: usize) {
        self.threads.store(threads.max(1) as i32, std::sync::atomic::Ordering::Relaxed);
    }

    /// oneDNN's name for the implementation chosen for `spec` (`brg:avx512_core_bf16`, ...).
    pub fn implementation(&self, spec: &Matmul) -> Result<String, DnnlError> {
        Ok(self.primitive(spec)?.implementation.clone())
    }

    fn memory_desc(&self, dims: &[i64], strides: &[i64], data_type: i32) -> Result<dnnl_memory_desc_t, DnnlError> {
        let mut d = [0i64; DNNL_MAX_NDIMS];
        let mut s = [0i64; DNNL_MAX_NDIMS];
        d[..dims.len()].copy_from_slice(dims);
        s[..strides.len()].copy_from_slice(strides);
        let mut md: dnnl_memory_desc_t = std::ptr::null_mut();
        // SAFETY: `d` and `s` hold `dims.len()` valid entries (checked <= 12 by `Matmul::check`).
        call("dnnl_memory_desc_create_with_strides", unsafe {
            (self.api.memory_desc_create_with_strides)(&mut md, dims.len() as i32, d.as_ptr(), data_type, s.as_ptr())
        })?;
        Ok(md)
    }

    fn memory_desc_any(&self, dims: &[i64], data_type: i32) -> Result<dnnl_memory_desc_t, DnnlError> {
        let mut d = [0i64; DNNL_MAX_NDIMS];
        d[..dims.len()].copy_from_slice(dims);
        let mut md: dnnl_memory_desc_t = std::ptr::null_mut();
        // SAFETY: `d` holds `dims.len()` valid entries.
        call("dnnl_memory_desc_create_with_tag", unsafe {
            (self.api.memory_desc_create_with_tag)(&mut md, dims.len() as i32, d.as_ptr(), data_type, DNNL_FORMAT_ANY)
        })?;
        Ok(md)
    }

    fn primitive(&self, spec: &Matmul) -> Result<Arc<Primitive>, DnnlError> {
        if let Some(p) = self.primitives.lock().unwrap_or_else(|p| p.into_inner()).get(spec) {
            return Ok(p.clone());
        }
        spec.check()?;
        let rank = spec.batch_a.len() + 2;
        let (a_dims, a_strides) = operand(&spec.batch_a, spec.m, spec.k, spec.trans_a);
        let (b_dims, b_strides) = operand(&spec.batch_b, spec.k, spec.n, spec.trans_b);
        let mut c_dims = spec.batch_out();
        c_dims.extend([spec.m, spec.n]);
        let c_strides = dense_strides(&c_dims);
        let mut mds = vec![
            self.memory_desc(&a_dims, &a_strides, DNNL_F32)?,
            self.memory_desc(&b_dims, &b_strides, DNNL_F32)?,
            self.memory_desc(&c_dims, &c_strides, DNNL_F32)?,
        ];
        let bias_md: dnnl_memory_desc_t = match spec.bias {
            None => std::ptr::null_mut(),
            Some(kind) => {
                let mut dims = vec![1i64; rank];
                match kind {
                    Bias::Row => dims[rank - 1] = spec.n,
                    Bias::Column => dims[rank - 2] = spec.m,
                    Bias::Full => {
                        dims[rank - 2] = spec.m;
                        dims[rank - 1] = spec.n;
                    }
                }
                let md = self.memory_desc(&dims, &dense_strides(&dims), DNNL_F32)?;
                mds.push(md);
                md
            }
        };
        // B goes through a reorder into the layout the matmul prefers (blocked, and bf16 for
        // bf16 products): the packing a fast kernel needs is paid once per call, in parallel.
        // For bf16, A is rounded into a bf16 copy of the same layout.
        let data_type = match spec.precision {
            Precision::F32 => DNNL_F32,
            Precision::Bf16 => DNNL_BF16,
        };
        let bf16_a = match spec.precision {
            Precision::F32 => None,
            Precision::Bf16 => {
                let a16 = self.memory_desc(&a_dims, &dense_strides_like(&a_dims, &a_strides), DNNL_BF16)?;
                mds.push(a16);
                Some((a16, self.reorder(mds[0], a16)?))
            }
        };
        let src = bf16_a.as_ref().map_or(mds[0], |(md, _)| *md);
        let weights_any = self.memory_desc_any(&b_dims, data_type)?;
        mds.push(weights_any);
        let mut pd: dnnl_primitive_desc_t = std::ptr::null_mut();
        // SAFETY: every descriptor was created above and is live.
        call("dnnl_matmul_primitive_desc_create", unsafe {
            (self.api.matmul_primitive_desc_create)(
                &mut pd,
                self.engine,
                src,
                weights_any,
                bias_md,
                mds[2],
                std::ptr::null_mut(),
            )
        })?;
        let matmul = self.handle(pd)?;
        // SAFETY: the descriptor belongs to `pd`, which the primitive keeps alive.
        let packed = unsafe { (self.api.primitive_desc_query_md)(pd, DNNL_QUERY_WEIGHTS_MD, 0) };
        if packed.is_null() {
            return Err(DnnlError::Call { call: "dnnl_primitive_desc_query_md", status: -1 });
        }
        // SAFETY: a live descriptor.
        let packed_size = unsafe { (self.api.memory_desc_get_size)(packed) };
        let packed_b = (packed, packed_size, self.reorder(mds[1], packed)?);
        let mut name: *const std::ffi::c_char = std::ptr::null();
        // SAFETY: the query writes a pointer to a string owned by `pd`, copied at once.
        let implementation = unsafe {
            if (self.api.primitive_desc_query)(
                pd,
                DNNL_QUERY_IMPL_INFO_STR,
                0,
                (&mut name as *mut *const std::ffi::c_char).cast(),
            ) == DNNL_SUCCESS
                && !name.is_null()
            {
                CStr::from_ptr(name).to_string_lossy().into_owned()
            } else {
                String::from("unknown")
            }
        };
        let bias_md = (!bias_md.is_null()).then_some(bias_md);
        let p = Arc::new(Primitive { matmul, mds, packed_b, bf16_a, bias_md, implementation });
        self.primitives.lock().unwrap_or_else(|p| p.into_inner()).insert(spec.clone(), p.clone());
        Ok(p)
    }

    fn handle(&self, pd: dnnl_primitive_desc_t) -> Result<Handle, DnnlError> {
        let mut prim: dnnl_primitive_t = std::ptr::null_mut();
        // SAFETY: `pd` was just created.
        let status = unsafe { (self.api.primitive_create)(&mut prim, pd) };
        if status != DNNL_SUCCESS {
            // SAFETY: the descriptor is not referenced anywhere else.
            unsafe { (self.api.primitive_desc_destroy)(pd) };
        }
        call("dnnl_primitive_create", status)?;
        Ok(Handle { pd, prim })
    }

    fn reorder(&self, from: dnnl_memory_desc_t, to: dnnl_memory_desc_t) -> Result<Handle, DnnlError> {
        let mut pd: dnnl_primitive_desc_t = std::ptr::null_mut();
        // SAFETY: both descriptors are live; same engine on both sides.
        call("dnnl_reorder_primitive_desc_create", unsafe {
            (self.api.reorder_primitive_desc_create)(&mut pd, from, self.engine, to, self.engine, std::ptr::null_mut())
        })?;
        self.handle(pd)
    }

    /// Runs `prim` with `(argument, descriptor, buffer)` triples.
    fn execute(
        &self,
        prim: dnnl_primitive_t,
        buffers: &[(i32, dnnl_memory_desc_t, *mut c_void)],
    ) -> Result<(), DnnlError> {
        let mut args: Vec<dnnl_exec_arg_t> = Vec::with_capacity(buffers.len());
        let mut result = Ok(());
        for &(arg, md, handle) in buffers {
            let mut memory: dnnl_memory_t = std::ptr::null_mut();
            // SAFETY: `md` describes exactly the buffer behind `handle` (lengths checked by the
            // caller); oneDNN reads inputs and writes only the output buffer.
            result =
                call("dnnl_memory_create", unsafe { (self.api.memory_create)(&mut memory, md, self.engine, handle) });
            if result.is_err() {
                break;
            }
            args.push(dnnl_exec_arg_t { arg, memory });
        }
        if result.is_ok() {
            let stream = self.stream.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(set) = self.omp_set_num_threads {
                // SAFETY: plain libgomp call.
                unsafe { set(self.threads.load(std::sync::atomic::Ordering::Relaxed)) };
            }
            // SAFETY: primitive, stream and memories are live; the stream is ours while locked.
            result = call("dnnl_primitive_execute", unsafe {
                (self.api.primitive_execute)(prim, *stream, args.len() as i32, args.as_ptr())
            })
            .and_then(|_| call("dnnl_stream_wait", unsafe { (self.api.stream_wait)(*stream) }));
        }
        for a in args {
            // SAFETY: created above, used by nothing else.
            unsafe { (self.api.memory_destroy)(a.memory) };
        }
        result
    }

    /// Computes `spec` on row-major buffers; lengths must be those of [`Matmul::lens`].
    pub fn matmul(
        &self,
        spec: &Matmul,
        a: &[f32],
        b: &[f32],
        bias: Option<&[f32]>,
        out: &mut [f32],
    ) -> Result<(), DnnlError> {
        let (la, lb, lbias, lout) = spec.lens();
        let got_bias = bias.map_or(0, <[f32]>::len);
        if a.len() != la || b.len() != lb || got_bias != lbias || out.len() != lout {
            return Err(DnnlError::Shape(format!(
                "buffers of {}, {}, {got_bias} and {} floats for a product that needs {la}, {lb}, {lbias} and {lout}",
                a.len(),
                b.len(),
                out.len()
            )));
        }
        let p = self.primitive(spec)?;
        let (a_ptr, b_ptr) = (a.as_ptr() as *mut c_void, b.as_ptr() as *mut c_void);
        let mut scratch = self.scratch.lock().unwrap_or_else(|p| p.into_inner());
        let (packed_md, packed_size, to_packed) = &p.packed_b;
        scratch.1.resize(packed_size.div_ceil(2), 0);
        let packed = scratch.1.as_mut_ptr() as *mut c_void;
        self.execute(to_packed.prim, &[(DNNL_ARG_FROM, p.mds[1], b_ptr), (DNNL_ARG_TO, *packed_md, packed)])?;
        let weights = (*packed_md, packed);
        let src = match &p.bf16_a {
            None => (p.mds[0], a_ptr),
            Some((a16, to_a)) => {
                scratch.0.resize(la, 0);
                let sa = scratch.0.as_mut_ptr() as *mut c_void;
                self.execute(to_a.prim, &[(DNNL_ARG_FROM, p.mds[0], a_ptr), (DNNL_ARG_TO, *a16, sa)])?;
                (*a16, sa)
            }
        };
        let mut buffers = vec![
            (DNNL_ARG_SRC, src.0, src.1),
            (DNNL_ARG_WEIGHTS, weights.0, weights.1),
            (DNNL_ARG_DST, p.mds[2], out.as_mut_ptr() as *mut c_void),
        ];
        if let (Some(bias), Some(md)) = (bias, p.bias_md) {
            buffers.push((DNNL_ARG_BIAS, md, bias.as_ptr() as *mut c_void));
        }
        self.execute(p.matmul.prim, &buffers)
    }
}

/// Row-major strides in the storage order implied by `strides` (a transposed operand stays
/// transposed), for a copy of the same logical tensor.
fn dense_strides_like(dims: &[i64], strides: &[i64]) -> Vec<i64> {
    let mut order: Vec<usize> = (0..dims.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(strides[i]));
    let mut out = vec![0; dims.len()];
    let mut next = 1;
    for &i in order.iter().rev() {
        out[i] = next;
        next *= dims[i].max(1);
    }
    out
}

impl Drop for Engine {
    fn drop(&mut self) {
        let primitives: Vec<Arc<Primitive>> =
            self.primitives.lock().unwrap_or_else(|p| p.into_inner()).drain().map(|(_, p)| p).collect();
        for p in primitives {
            // SAFETY: the engine owns the only remaining references.
            unsafe {
                let handles = [&p.packed_b.2].into_iter().chain(p.bf16_a.as_ref().map(|(_, h)| h)).chain([&p.matmul]);
                for h in handles {
                    (self.api.primitive_destroy)(h.prim);
                    (self.api.primitive_desc_destroy)(h.pd);
                }
                // The packed-B descriptor belongs to the matmul's descriptor, destroyed above.
                for md in &p.mds {
                    (self.api.memory_desc_destroy)(*md);
                }
            }
        }
        let stream = *self.stream.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: nothing uses the stream or engine after this.
        unsafe {
            (self.api.stream_destroy)(stream);
            (self.api.engine_destroy)(self.engine);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transposed_operands_are_strides() {
        assert_eq!(operand(&[], 2, 3, false), (vec![2, 3], vec![3, 1]));
        assert_eq!(operand(&[], 2, 3, true), (vec![2, 3], vec![1, 2]));
        assert_eq!(operand(&[4], 2, 3, true), (vec![4, 2, 3], vec![6, 1, 2]));
    }

    #[test]
    fn copies_keep_the_storage_order() {
        assert_eq!(dense_strides_like(&[2, 3], &[1, 2]), vec![1, 2]);
        assert_eq!(dense_strides_like(&[4, 2, 3], &[6, 1, 2]), vec![6, 1, 2]);
        assert_eq!(dense_strides_like(&[4, 2, 3], &[6, 3, 1]), vec![6, 3, 1]);
    }

    #[test]
    fn specs_are_checked() {
        let mut s = Matmul::plain(2, 3, 4, Precision::F32);
        assert_eq!(s.lens(), (6, 12, 0, 8));
        s.batch_a = vec![2];
        assert!(s.check().is_err(), "ranks differ");
        s.batch_b = vec![3];
        assert!(s.check().is_err(), "2 and 3 do not broadcast");
        s.batch_b = vec![1];
        assert!(s.check().is_ok());
        assert_eq!(s.batch_out(), vec![2]);
    }
}
