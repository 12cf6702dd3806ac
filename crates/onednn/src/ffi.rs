//! The C API subset, declared from oneDNN 3.2's headers (`oneapi/dnnl/dnnl.h`,
//! `dnnl_types.h`, `dnnl_common_types.h`), resolved from the library at run time.

#![allow(non_camel_case_types)]

use std::ffi::{c_int, c_void};

pub(crate) type dnnl_status_t = c_int;
pub(crate) type dnnl_dim_t = i64;
pub(crate) const DNNL_MAX_NDIMS: usize = 12;

pub(crate) type dnnl_engine_t = *mut c_void;
pub(crate) type dnnl_stream_t = *mut c_void;
pub(crate) type dnnl_memory_desc_t = *mut c_void;
pub(crate) type dnnl_memory_t = *mut c_void;
pub(crate) type dnnl_primitive_desc_t = *mut c_void;
pub(crate) type dnnl_primitive_t = *mut c_void;
pub(crate) type dnnl_primitive_attr_t = *mut c_void;
pub(crate) type dnnl_post_ops_t = *mut c_void;

pub(crate) const DNNL_SUCCESS: dnnl_status_t = 0;
/// `dnnl_unimplemented`: no implementation for these arguments on this CPU.
pub(crate) const DNNL_UNIMPLEMENTED: dnnl_status_t = 3;
/// `dnnl_cpu` in `dnnl_engine_kind_t`.
pub(crate) const DNNL_CPU: c_int = 1;
/// `dnnl_stream_in_order`.
pub(crate) const DNNL_STREAM_IN_ORDER: u32 = 1;
/// `dnnl_data_type_t` values.
pub(crate) const DNNL_BF16: c_int = 2;
pub(crate) const DNNL_F32: c_int = 3;
/// `dnnl_query_impl_info_str` in `dnnl_query_t`.
pub(crate) const DNNL_QUERY_IMPL_INFO_STR: c_int = 8;
/// `dnnl_format_tag_any`: let the primitive choose the layout.
pub(crate) const DNNL_FORMAT_ANY: c_int = 1;
/// `dnnl_query_weights_md` in `dnnl_query_t`.
pub(crate) const DNNL_QUERY_WEIGHTS_MD: c_int = 131;
/// `dnnl_eltwise_gelu_erf` in `dnnl_alg_kind_t` (`dnnl_eltwise_relu` = 0x20, then in order).
pub(crate) const DNNL_ELTWISE_GELU_ERF: c_int = 0x31;
/// Execution argument indices.
pub(crate) const DNNL_ARG_SRC: c_int = 1;
pub(crate) const DNNL_ARG_DST: c_int = 17;
pub(crate) const DNNL_ARG_WEIGHTS: c_int = 33;
pub(crate) const DNNL_ARG_BIAS: c_int = 41;
/// Reorder arguments (`DNNL_ARG_FROM`, `DNNL_ARG_TO`).
pub(crate) const DNNL_ARG_FROM: c_int = 1;
pub(crate) const DNNL_ARG_TO: c_int = 17;

#[repr(C)]
pub(crate) struct dnnl_exec_arg_t {
    pub(crate) arg: c_int,
    pub(crate) memory: dnnl_memory_t,
}

/// Function pointers resolved from the library.
pub(crate) struct Api {
    pub(crate) engine_create: unsafe extern "C" fn(*mut dnnl_engine_t, c_int, usize) -> dnnl_status_t,
    pub(crate) engine_destroy: unsafe extern "C" fn(dnnl_engine_t) -> dnnl_status_t,
    pub(crate) stream_create: unsafe extern "C" fn(*mut dnnl_stream_t, dnnl_engine_t, u32) -> dnnl_status_t,
    pub(crate) stream_wait: unsafe extern "C" fn(dnnl_stream_t) -> dnnl_status_t,
    pub(crate) stream_destroy: unsafe extern "C" fn(dnnl_stream_t) -> dnnl_status_t,
    pub(crate) memory_desc_create_with_strides: unsafe extern "C" fn(
        *mut dnnl_memory_desc_t,
        c_int,
        *const dnnl_dim_t,
        c_int,
        *const dnnl_dim_t,
    ) -> dnnl_status_t,
    pub(crate) memory_desc_create_with_tag:
        unsafe extern "C" fn(*mut dnnl_memory_desc_t, c_int, *const dnnl_dim_t, c_int, c_int) -> dnnl_status_t,
    pub(crate) memory_desc_get_size: unsafe extern "C" fn(dnnl_memory_desc_t) -> usize,
    pub(crate) memory_desc_destroy: unsafe extern "C" fn(dnnl_memory_desc_t) -> dnnl_status_t,
    pub(crate) memory_create:
        unsafe extern "C" fn(*mut dnnl_memory_t, dnnl_memory_desc_t, dnnl_engine_t, *mut c_void) -> dnnl_status_t,
    pub(crate) memory_destroy: unsafe extern "C" fn(dnnl_memory_t) -> dnnl_status_t,
    pub(crate) matmul_primitive_desc_create: unsafe extern "C" fn(
        *mut dnnl_primitive_desc_t,
        dnnl_engine_t,
        dnnl_memory_desc_t,
        dnnl_memory_desc_t,
        dnnl_memory_desc_t,
        dnnl_memory_desc_t,
        dnnl_primitive_attr_t,
    ) -> dnnl_status_t,
    pub(crate) reorder_primitive_desc_create: unsafe extern "C" fn(
        *mut dnnl_primitive_desc_t,
        dnnl_memory_desc_t,
        dnnl_engine_t,
        dnnl_memory_desc_t,
        dnnl_engine_t,
        dnnl_primitive_attr_t,
    ) -> dnnl_status_t,
    pub(crate) primitive_desc_query:
        unsafe extern "C" fn(dnnl_primitive_desc_t, c_int, c_int, *mut c_void) -> dnnl_status_t,
    pub(crate) primitive_desc_query_md: unsafe extern "C" fn(dnnl_primitive_desc_t, c_int, c_int) -> dnnl_memory_desc_t,
    pub(crate) primitive_desc_destroy: unsafe extern "C" fn(dnnl_primitive_desc_t) -> dnnl_status_t,
    pub(crate) primitive_create: unsafe extern "C" fn(*mut dnnl_primitive_t, dnnl_primitive_desc_t) -> dnnl_status_t,
    pub(crate) primitive_execute:
        unsafe extern "C" fn(dnnl_primitive_t, dnnl_stream_t, c_int, *const dnnl_exec_arg_t) -> dnnl_status_t,
    pub(crate) primitive_destroy: unsafe extern "C" fn(dnnl_primitive_t) -> dnnl_status_t,
    pub(crate) primitive_attr_create: unsafe extern "C" fn(*mut dnnl_primitive_attr_t) -> dnnl_status_t,
    pub(crate) primitive_attr_destroy: unsafe extern "C" fn(dnnl_primitive_attr_t) -> dnnl_status_t,
    pub(crate) primitive_attr_set_post_ops:
        unsafe extern "C" fn(dnnl_primitive_attr_t, dnnl_post_ops_t) -> dnnl_status_t,
    pub(crate) post_ops_create: unsafe extern "C" fn(*mut dnnl_post_ops_t) -> dnnl_status_t,
    pub(crate) post_ops_destroy: unsafe extern "C" fn(dnnl_post_ops_t) -> dnnl_status_t,
    pub(crate) post_ops_append_eltwise: unsafe extern "C" fn(dnnl_post_ops_t, c_int, f32, f32) -> dnnl_status_t,
}

/// Resolves every function of [`Api`] from `lib`.
///
/// # Safety
/// `lib` must be oneDNN 3.x, whose symbols have the signatures above.
pub(crate) unsafe fn resolve(lib: &libloading::Library) -> Result<Api, String> {
    macro_rules! get {
        ($name:literal) => {
            // SAFETY: the caller vouches that the library is oneDNN 3.x.
            *unsafe { lib.get(concat!($name, "\0").as_bytes()) }.map_err(|e| format!("{}: {e}", $name))?
        };
    }
    Ok(Api {
        engine_create: get!("dnnl_engine_create"),
        engine_destroy: get!("dnnl_engine_destroy"),
        stream_create: get!("dnnl_stream_create"),
        stream_wait: get!("dnnl_stream_wait"),
        stream_destroy: get!("dnnl_stream_destroy"),
        memory_desc_create_with_strides: get!("dnnl_memory_desc_create_with_strides"),
        memory_desc_create_with_tag: get!("dnnl_memory_desc_create_with_tag"),
        memory_desc_get_size: get!("dnnl_memory_desc_get_size"),
        memory_desc_destroy: get!("dnnl_memory_desc_destroy"),
        memory_create: get!("dnnl_memory_create"),
        memory_destroy: get!("dnnl_memory_destroy"),
        matmul_primitive_desc_create: get!("dnnl_matmul_primitive_desc_create"),
        reorder_primitive_desc_create: get!("dnnl_reorder_primitive_desc_create"),
        primitive_desc_query: get!("dnnl_primitive_desc_query"),
        primitive_desc_query_md: get!("dnnl_primitive_desc_query_md"),
        primitive_desc_destroy: get!("dnnl_primitive_desc_destroy"),
        primitive_create: get!("dnnl_primitive_create"),
        primitive_execute: get!("dnnl_primitive_execute"),
        primitive_destroy: get!("dnnl_primitive_destroy"),
        primitive_attr_create: get!("dnnl_primitive_attr_create"),
        primitive_attr_destroy: get!("dnnl_primitive_attr_destroy"),
        primitive_attr_set_post_ops: get!("dnnl_primitive_attr_set_post_ops"),
        post_ops_create: get!("dnnl_post_ops_create"),
        post_ops_destroy: get!("dnnl_post_ops_destroy"),
        post_ops_append_eltwise: get!("dnnl_post_ops_append_eltwise"),
    })
}
