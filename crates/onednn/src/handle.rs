//! oneDNN objects as owned values: each destroys itself when dropped, so no early return
//! leaks one, and each holds the library it came from.

use std::ffi::c_void;
use std::sync::Arc;

use crate::ffi::*;
use crate::library::Library;
use crate::DnnlError;

/// Turns a status into a result naming the call.
pub(crate) fn check(call: &'static str, status: dnnl_status_t) -> Result<(), DnnlError> {
    match status {
        DNNL_SUCCESS => Ok(()),
        DNNL_UNIMPLEMENTED => Err(DnnlError::Unimplemented { call }),
        status => Err(DnnlError::Call { call, status }),
    }
}

/// A CPU engine.
pub(crate) struct EngineHandle {
    pub(crate) raw: dnnl_engine_t,
    lib: Arc<Library>,
}

impl EngineHandle {
    pub(crate) fn cpu(lib: &Arc<Library>) -> Result<Self, DnnlError> {
        let mut raw: dnnl_engine_t = std::ptr::null_mut();
        // SAFETY: out-pointer to a local; index 0 of the CPU engine always exists.
        check("dnnl_engine_create", unsafe { (lib.api.engine_create)(&mut raw, DNNL_CPU, 0) })?;
        Ok(EngineHandle { raw, lib: lib.clone() })
    }
}

impl Drop for EngineHandle {
    fn drop(&mut self) {
        // SAFETY: created by `cpu`; every stream and primitive of it is dropped first (they
        // are fields declared before the engine in `Engine`).
        unsafe { (self.lib.api.engine_destroy)(self.raw) };
    }
}

/// An in-order stream.
pub(crate) struct StreamHandle {
    pub(crate) raw: dnnl_stream_t,
    lib: Arc<Library>,
}

impl StreamHandle {
    pub(crate) fn in_order(engine: &EngineHandle) -> Result<Self, DnnlError> {
        let mut raw: dnnl_stream_t = std::ptr::null_mut();
        // SAFETY: out-pointer to a local; the engine is live.
        check("dnnl_stream_create", unsafe {
            (engine.lib.api.stream_create)(&mut raw, engine.raw, DNNL_STREAM_IN_ORDER)
        })?;
        Ok(StreamHandle { raw, lib: engine.lib.clone() })
    }
}

impl Drop for StreamHandle {
    fn drop(&mut self) {
        // SAFETY: created by `in_order`, used by nothing after this.
        unsafe { (self.lib.api.stream_destroy)(self.raw) };
    }
}

/// A memory descriptor we created (and destroy).
pub(crate) struct MemoryDesc {
    pub(crate) raw: dnnl_memory_desc_t,
    lib: Arc<Library>,
}

impl MemoryDesc {
    /// A descriptor of `dims` laid out with `strides`.
    pub(crate) fn strided(
        lib: &Arc<Library>,
        dims: &[i64],
        strides: &[i64],
        data_type: i32,
    ) -> Result<Self, DnnlError> {
        let (d, s) = (padded(dims), padded(strides));
        let mut raw: dnnl_memory_desc_t = std::ptr::null_mut();
        // SAFETY: `d` and `s` hold `dims.len()` valid entries (at most 12, checked by the spec).
        check("dnnl_memory_desc_create_with_strides", unsafe {
            (lib.api.memory_desc_create_with_strides)(&mut raw, dims.len() as i32, d.as_ptr(), data_type, s.as_ptr())
        })?;
        Ok(MemoryDesc { raw, lib: lib.clone() })
    }

    /// A descriptor of `dims` whose layout the primitive chooses.
    pub(crate) fn any_layout(lib: &Arc<Library>, dims: &[i64], data_type: i32) -> Result<Self, DnnlError> {
        let d = padded(dims);
        let mut raw: dnnl_memory_desc_t = std::ptr::null_mut();
        // SAFETY: `d` holds `dims.len()` valid entries.
        check("dnnl_memory_desc_create_with_tag", unsafe {
            (lib.api.memory_desc_create_with_tag)(&mut raw, dims.len() as i32, d.as_ptr(), data_type, DNNL_FORMAT_ANY)
        })?;
        Ok(MemoryDesc { raw, lib: lib.clone() })
    }
}

fn padded(values: &[i64]) -> [i64; DNNL_MAX_NDIMS] {
    let mut out = [0i64; DNNL_MAX_NDIMS];
    out[..values.len()].copy_from_slice(values);
    out
}

impl Drop for MemoryDesc {
    fn drop(&mut self) {
        // SAFETY: created by this value's constructor, owned by nothing else.
        unsafe { (self.lib.api.memory_desc_destroy)(self.raw) };
    }
}

/// Primitive attributes holding post-ops: what the matmul applies to each output element
/// as it writes it.
pub(crate) struct PostOps {
    pub(crate) attr: dnnl_primitive_attr_t,
    lib: Arc<Library>,
}

impl PostOps {
    /// Attributes whose post-ops apply the elementwise `algorithm` (a `dnnl_alg_kind_t`).
    pub(crate) fn eltwise(lib: &Arc<Library>, algorithm: i32) -> Result<Self, DnnlError> {
        let mut attr: dnnl_primitive_attr_t = std::ptr::null_mut();
        // SAFETY: out-pointer to a local.
        check("dnnl_primitive_attr_create", unsafe { (lib.api.primitive_attr_create)(&mut attr) })?;
        let attrs = PostOps { attr, lib: lib.clone() };
        let mut ops: dnnl_post_ops_t = std::ptr::null_mut();
        // SAFETY: out-pointer to a local.
        check("dnnl_post_ops_create", unsafe { (lib.api.post_ops_create)(&mut ops) })?;
        // SAFETY: `ops` is live; the attributes copy it, so it is destroyed here whatever happens.
        let status = unsafe {
            let appended = (lib.api.post_ops_append_eltwise)(ops, algorithm, 0.0, 0.0);
            let set =
                if appended == DNNL_SUCCESS { (lib.api.primitive_attr_set_post_ops)(attr, ops) } else { appended };
            (lib.api.post_ops_destroy)(ops);
            set
        };
        check("dnnl_post_ops_append_eltwise", status)?;
        Ok(attrs)
    }
}

impl Drop for PostOps {
    fn drop(&mut self) {
        // SAFETY: created by `eltwise`; primitive descriptors keep their own copy.
        unsafe { (self.lib.api.primitive_attr_destroy)(self.attr) };
    }
}

/// A primitive with the descriptor it was made from (which owns descriptors queried from it).
pub(crate) struct Primitive {
    pub(crate) raw: dnnl_primitive_t,
    pub(crate) desc: dnnl_primitive_desc_t,
    lib: Arc<Library>,
}

impl Primitive {
    /// Makes the primitive of a descriptor that `create` fills; the descriptor is destroyed
    /// with the primitive, or at once when the primitive cannot be made.
    pub(crate) fn create(
        lib: &Arc<Library>,
        call: &'static str,
        create: impl FnOnce(*mut dnnl_primitive_desc_t) -> dnnl_status_t,
    ) -> Result<Self, DnnlError> {
        let mut desc: dnnl_primitive_desc_t = std::ptr::null_mut();
        check(call, create(&mut desc))?;
        let mut raw: dnnl_primitive_t = std::ptr::null_mut();
        // SAFETY: `desc` was just created.
        let status = unsafe { (lib.api.primitive_create)(&mut raw, desc) };
        if let Err(e) = check("dnnl_primitive_create", status) {
            // SAFETY: the descriptor is referenced by nothing else.
            unsafe { (lib.api.primitive_desc_destroy)(desc) };
            return Err(e);
        }
        Ok(Primitive { raw, desc, lib: lib.clone() })
    }

    /// A memory descriptor the primitive's descriptor owns (valid as long as `self`).
    pub(crate) fn query_md(&self, what: i32) -> Result<dnnl_memory_desc_t, DnnlError> {
        // SAFETY: a live descriptor; the result belongs to it.
        let md = unsafe { (self.lib.api.primitive_desc_query_md)(self.desc, what, 0) };
        if md.is_null() {
            return Err(DnnlError::Call { call: "dnnl_primitive_desc_query_md", status: -1 });
        }
        Ok(md)
    }

    /// oneDNN's name for the implementation it chose (`brg:avx512_core_bf16`, ...).
    pub(crate) fn implementation(&self) -> String {
        let mut name: *const std::ffi::c_char = std::ptr::null();
        // SAFETY: the query writes a pointer to a string owned by the descriptor, copied at once.
        unsafe {
            let status = (self.lib.api.primitive_desc_query)(
                self.desc,
                DNNL_QUERY_IMPL_INFO_STR,
                0,
                (&mut name as *mut *const std::ffi::c_char).cast(),
            );
            if status == DNNL_SUCCESS && !name.is_null() {
                std::ffi::CStr::from_ptr(name).to_string_lossy().into_owned()
            } else {
                String::from("unknown")
            }
        }
    }
}

impl Drop for Primitive {
    fn drop(&mut self) {
        // SAFETY: both were created together in `create` and are used by nothing else.
        unsafe {
            (self.lib.api.primitive_destroy)(self.raw);
            (self.lib.api.primitive_desc_destroy)(self.desc);
        }
    }
}

/// A memory object over a caller's buffer, for one execution.
pub(crate) struct Memory {
    pub(crate) raw: dnnl_memory_t,
    lib: Arc<Library>,
}

impl Memory {
    /// # Safety
    /// `buffer` must hold the bytes `md` describes and outlive the returned value's use.
    pub(crate) unsafe fn wrap(
        engine: &EngineHandle,
        md: dnnl_memory_desc_t,
        buffer: *mut c_void,
    ) -> Result<Self, DnnlError> {
        let mut raw: dnnl_memory_t = std::ptr::null_mut();
        // SAFETY: the caller vouches for the buffer; the descriptor and engine are live.
        check("dnnl_memory_create", unsafe { (engine.lib.api.memory_create)(&mut raw, md, engine.raw, buffer) })?;
        Ok(Memory { raw, lib: engine.lib.clone() })
    }
}

impl Drop for Memory {
    fn drop(&mut self) {
        // SAFETY: created by `wrap`, used by nothing else.
        unsafe { (self.lib.api.memory_destroy)(self.raw) };
    }
}
