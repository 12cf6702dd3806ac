//! The engine: one CPU engine and stream, the primitives made so far (one set per product
//! shape), and running a product on the caller's buffers.

use std::collections::HashMap;
use std::ffi::c_void;
use std::path::Path;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crate::ffi::*;
use crate::handle::{check, EngineHandle, Memory, StreamHandle};
use crate::library::{default_library_path, Library};
use crate::primitive::MatmulPrimitives;
use crate::{DnnlError, Matmul, Precision};

/// The loaded library, its CPU engine and stream, and the primitives made so far.
pub struct Engine {
    // Dropped in this order: primitives, then the stream, then the engine, then the library.
    primitives: Mutex<HashMap<Matmul, Arc<MatmulPrimitives>>>,
    stream: Mutex<StreamHandle>,
    engine: EngineHandle,
    /// bf16 copies of A and packed B, reused across calls.
    scratch: Mutex<(Vec<u16>, Vec<u16>)>,
    threads: AtomicI32,
    bf16: OnceLock<bool>,
    lib: Arc<Library>,
}

// SAFETY: oneDNN engines and primitives may be used from any thread; the stream is behind a
// mutex; the raw pointers are only handed to oneDNN.
unsafe impl Send for Engine {}
// SAFETY: as above.
unsafe impl Sync for Engine {}

impl Engine {
    /// Loads the library from [`default_library_path`].
    pub fn load_default() -> Result<Self, DnnlError> {
        Self::load(&default_library_path())
    }

    /// Loads oneDNN from `path` and creates a CPU engine and stream.
    pub fn load(path: &Path) -> Result<Self, DnnlError> {
        let lib = Arc::new(Library::load(path)?);
        let engine = EngineHandle::cpu(&lib)?;
        let stream = StreamHandle::in_order(&engine)?;
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get() as i32);
        Ok(Engine {
            primitives: Mutex::new(HashMap::new()),
            stream: Mutex::new(stream),
            engine,
            scratch: Mutex::new((Vec::new(), Vec::new())),
            threads: AtomicI32::new(threads),
            bf16: OnceLock::new(),
            lib,
        })
    }

    /// The library in use.
    pub fn library(&self) -> &Path {
        &self.lib.path
    }

    /// Threads oneDNN's OpenMP regions use (default: one per core).
    pub fn set_threads(&self, threads: usize) {
        self.threads.store(threads.max(1) as i32, Ordering::Relaxed);
    }

    /// Whether this CPU has products at `precision` (oneDNN 3.2 has bf16 products only where
    /// the CPU has AVX-512).
    pub fn supports(&self, precision: Precision) -> bool {
        match precision {
            Precision::F32 => true,
            Precision::Bf16 => *self.bf16.get_or_init(|| self.primitives(&Matmul::plain(1, 1, 1, precision)).is_ok()),
        }
    }

    /// oneDNN's name for the implementation chosen for `spec` (`brg:avx512_core_bf16`, ...).
    pub fn implementation(&self, spec: &Matmul) -> Result<String, DnnlError> {
        Ok(self.primitives(spec)?.implementation.clone())
    }

    fn primitives(&self, spec: &Matmul) -> Result<Arc<MatmulPrimitives>, DnnlError> {
        if let Some(p) = self.primitives.lock().unwrap_or_else(|p| p.into_inner()).get(spec) {
            return Ok(p.clone());
        }
        let p = MatmulPrimitives::create(&self.lib, &self.engine, spec).map_err(|e| match e {
            DnnlError::Unimplemented { call } if spec.precision == Precision::Bf16 => DnnlError::NoBf16 { call },
            other => other,
        })?;
        let p = Arc::new(p);
        self.primitives.lock().unwrap_or_else(|p| p.into_inner()).insert(spec.clone(), p.clone());
        Ok(p)
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
        let p = self.primitives(spec)?;
        let (a_ptr, b_ptr) = (a.as_ptr() as *mut c_void, b.as_ptr() as *mut c_void);
        let mut scratch = self.scratch.lock().unwrap_or_else(|p| p.into_inner());
        scratch.1.resize(p.packed_b_bytes.div_ceil(2), 0);
        let packed = scratch.1.as_mut_ptr() as *mut c_void;
        self.execute(&p.pack_b, &[(DNNL_ARG_FROM, p.b.raw, b_ptr), (DNNL_ARG_TO, p.packed_b, packed)])?;
        let src = match (&p.a_bf16, &p.round_a) {
            (Some(a16), Some(round)) => {
                scratch.0.resize(la, 0);
                let rounded = scratch.0.as_mut_ptr() as *mut c_void;
                self.execute(round, &[(DNNL_ARG_FROM, p.a.raw, a_ptr), (DNNL_ARG_TO, a16.raw, rounded)])?;
                (a16.raw, rounded)
            }
            _ => (p.a.raw, a_ptr),
        };
        let mut buffers = vec![
            (DNNL_ARG_SRC, src.0, src.1),
            (DNNL_ARG_WEIGHTS, p.packed_b, packed),
            (DNNL_ARG_DST, p.out.raw, out.as_mut_ptr() as *mut c_void),
        ];
        if let (Some(bias), Some(md)) = (bias, &p.bias) {
            buffers.push((DNNL_ARG_BIAS, md.raw, bias.as_ptr() as *mut c_void));
        }
        self.execute(&p.matmul, &buffers)
    }

    /// Runs `primitive` with `(argument, descriptor, buffer)` triples, on this engine's stream.
    fn execute(
        &self,
        primitive: &crate::handle::Primitive,
        buffers: &[(i32, dnnl_memory_desc_t, *mut c_void)],
    ) -> Result<(), DnnlError> {
        let memories = buffers
            .iter()
            // SAFETY: each descriptor describes exactly its buffer (lengths checked by `matmul`,
            // scratch sized from the descriptors); oneDNN writes only the output buffers.
            .map(|&(_, md, buffer)| unsafe { Memory::wrap(&self.engine, md, buffer) })
            .collect::<Result<Vec<_>, _>>()?;
        let args: Vec<dnnl_exec_arg_t> =
            buffers.iter().zip(&memories).map(|(&(arg, _, _), m)| dnnl_exec_arg_t { arg, memory: m.raw }).collect();
        let stream = self.stream.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(set) = self.lib.omp_set_num_threads {
            // SAFETY: plain libgomp call.
            unsafe { set(self.threads.load(Ordering::Relaxed)) };
        }
        // SAFETY: primitive, stream and memories are live; the stream is ours while locked.
        check("dnnl_primitive_execute", unsafe {
            (self.lib.api.primitive_execute)(primitive.raw, stream.raw, args.len() as i32, args.as_ptr())
        })?;
        // SAFETY: as above.
        check("dnnl_stream_wait", unsafe { (self.lib.api.stream_wait)(stream.raw) })
    }
}
