//! The primitives of one product shape: the matmul, the reorder that packs B into the layout
//! the matmul prefers (and rounds it to bf16), and for bf16 the reorder that rounds A.

use std::sync::Arc;

use crate::ffi::*;
use crate::handle::{EngineHandle, MemoryDesc, PostOps, Primitive};
use crate::library::Library;
use crate::spec::dense_strides_like;
use crate::{Activation, DnnlError, Matmul, Precision};

/// Everything one product shape needs, created once and reused.
pub(crate) struct MatmulPrimitives {
    // Primitives first: they are dropped before the descriptors they were made from.
    pub(crate) matmul: Primitive,
    /// The reorder from the caller's B into [`MatmulPrimitives::packed_b`].
    pub(crate) pack_b: Primitive,
    /// The reorder from the caller's A into its bf16 copy (bf16 products only).
    pub(crate) round_a: Option<Primitive>,
    /// B as the matmul wants it: owned by the matmul's descriptor.
    pub(crate) packed_b: dnnl_memory_desc_t,
    /// Bytes of the packed B.
    pub(crate) packed_b_bytes: usize,
    pub(crate) a: MemoryDesc,
    pub(crate) b: MemoryDesc,
    pub(crate) out: MemoryDesc,
    pub(crate) bias: Option<MemoryDesc>,
    pub(crate) a_bf16: Option<MemoryDesc>,
    pub(crate) implementation: String,
}

impl MatmulPrimitives {
    pub(crate) fn create(lib: &Arc<Library>, engine: &EngineHandle, spec: &Matmul) -> Result<Self, DnnlError> {
        spec.check()?;
        let ((a_dims, a_strides), (b_dims, b_strides), (out_dims, out_strides)) =
            (spec.a_layout(), spec.b_layout(), spec.out_layout());
        let a = MemoryDesc::strided(lib, &a_dims, &a_strides, DNNL_F32)?;
        let b = MemoryDesc::strided(lib, &b_dims, &b_strides, DNNL_F32)?;
        let out = MemoryDesc::strided(lib, &out_dims, &out_strides, DNNL_F32)?;
        let bias = match spec.bias_dims() {
            Some(dims) => Some(MemoryDesc::strided(lib, &dims, &crate::spec::dense_strides(&dims), DNNL_F32)?),
            None => None,
        };
        // B goes through a reorder into the layout the matmul prefers (blocked, and bf16 for
        // bf16 products): the packing a fast kernel needs is paid once per call, in parallel.
        // For bf16, A is rounded into a bf16 copy of the same storage order.
        let (data_type, a_bf16) = match spec.precision {
            Precision::F32 => (DNNL_F32, None),
            Precision::Bf16 => {
                let strides = dense_strides_like(&a_dims, &a_strides);
                (DNNL_BF16, Some(MemoryDesc::strided(lib, &a_dims, &strides, DNNL_BF16)?))
            }
        };
        let round_a = match &a_bf16 {
            Some(a16) => Some(reorder(lib, engine, a.raw, a16.raw)?),
            None => None,
        };
        let src = a_bf16.as_ref().map_or(a.raw, |m| m.raw);
        let weights_any = MemoryDesc::any_layout(lib, &b_dims, data_type)?;
        let bias_raw = bias.as_ref().map_or(std::ptr::null_mut(), |m| m.raw);
        let post_ops = match spec.activation {
            Some(Activation::GeluErf) => Some(PostOps::eltwise(lib, DNNL_ELTWISE_GELU_ERF)?),
            None => None,
        };
        let attr = post_ops.as_ref().map_or(std::ptr::null_mut(), |p| p.attr);
        let matmul = Primitive::create(lib, "dnnl_matmul_primitive_desc_create", |desc| {
            // SAFETY: every descriptor is live for the call.
            unsafe {
                (lib.api.matmul_primitive_desc_create)(desc, engine.raw, src, weights_any.raw, bias_raw, out.raw, attr)
            }
        })?;
        let packed_b = matmul.query_md(DNNL_QUERY_WEIGHTS_MD)?;
        // SAFETY: a live descriptor owned by the matmul.
        let packed_b_bytes = unsafe { (lib.api.memory_desc_get_size)(packed_b) };
        let pack_b = reorder(lib, engine, b.raw, packed_b)?;
        let implementation = matmul.implementation();
        Ok(MatmulPrimitives {
            matmul,
            pack_b,
            round_a,
            packed_b,
            packed_b_bytes,
            a,
            b,
            out,
            bias,
            a_bf16,
            implementation,
        })
    }
}

fn reorder(
    lib: &Arc<Library>,
    engine: &EngineHandle,
    from: dnnl_memory_desc_t,
    to: dnnl_memory_desc_t,
) -> Result<Primitive, DnnlError> {
    Primitive::create(lib, "dnnl_reorder_primitive_desc_create", |desc| {
        // SAFETY: both descriptors are live; same engine on both sides.
        unsafe { (lib.api.reorder_primitive_desc_create)(desc, from, engine.raw, to, engine.raw, std::ptr::null_mut()) }
    })
}

// SAFETY: primitives are immutable after creation and oneDNN executes them from any thread;
// the descriptors are only read.
unsafe impl Send for MatmulPrimitives {}
// SAFETY: as above.
unsafe impl Sync for MatmulPrimitives {}
