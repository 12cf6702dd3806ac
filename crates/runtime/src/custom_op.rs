//! The kernel trait our own operators plug into, and its adapter to ONNX Runtime's custom
//! operator API (this crate stays the only one that talks to `ort`).
//!
//! A kernel sees plain slices: the inputs ONNX Runtime hands over, and the outputs it asks for,
//! allocated at the shapes the kernel reports first. So kernels are tested without a session.

use std::sync::Arc;

use ort::operator::{
    BoxedKernel, ComputeContext, KernelContext, Operator, OperatorDomain, OperatorInput, OperatorOutput,
};
use ort::value::{TensorElementType, ValueRef};

use crate::parallel::{OrtThreads, Parallel, Serial};
use crate::{Result, RuntimeError};

/// The custom-operator domain of ringtune's operators.
pub const DOMAIN: &str = "ai.ringtune";

/// Element types a custom operator's inputs and outputs may have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ElementType {
    /// `float`.
    F32,
    /// `int64`.
    I64,
    /// `bool`.
    Bool,
}

/// One input or output of a custom operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Port {
    /// Its element type.
    pub element: ElementType,
    /// Whether it may be absent.
    pub optional: bool,
}

impl Port {
    /// A required port.
    pub fn required(element: ElementType) -> Self {
        Port { element, optional: false }
    }

    /// An optional port.
    pub fn optional(element: ElementType) -> Self {
        Port { element, optional: true }
    }
}

/// An input as a kernel reads it.
#[derive(Debug, Clone, Copy)]
pub enum TensorRef<'a> {
    /// `float` data and shape.
    F32(&'a [i64], &'a [f32]),
    /// `int64` data and shape.
    I64(&'a [i64], &'a [i64]),
    /// `bool` data and shape.
    Bool(&'a [i64], &'a [bool]),
}

impl<'a> TensorRef<'a> {
    /// The shape.
    pub fn shape(&self) -> &'a [i64] {
        match *self {
            TensorRef::F32(s, _) | TensorRef::I64(s, _) | TensorRef::Bool(s, _) => s,
        }
    }

    /// The data when `float`.
    pub fn f32(&self) -> Option<&'a [f32]> {
        match *self {
            TensorRef::F32(_, d) => Some(d),
            _ => None,
        }
    }

    /// The data when `int64`.
    pub fn i64(&self) -> Option<&'a [i64]> {
        match *self {
            TensorRef::I64(_, d) => Some(d),
            _ => None,
        }
    }
}

/// An output as a kernel fills it.
#[derive(Debug)]
pub enum TensorMut<'a> {
    /// `float` data.
    F32(&'a mut [f32]),
    /// `bool` data.
    Bool(&'a mut [bool]),
}

/// The attributes of the node a kernel is made for.
pub trait Attributes {
    /// An integer attribute.
    fn int(&self, name: &str) -> Option<i64>;
    /// A float attribute.
    fn float(&self, name: &str) -> Option<f32>;
}

/// The computation of one node of a custom operator.
pub trait Kernel: Send + Sync {
    /// The shape of every output, from the inputs (`None` marks an absent optional input).
    fn output_shapes(&self, inputs: &[Option<TensorRef<'_>>]) -> std::result::Result<Vec<Vec<i64>>, String>;
    /// Fills the outputs ONNX Runtime asked for (`None`: an optional output nobody reads);
    /// independent parts of the work may run on `threads`.
    fn compute(
        &self,
        inputs: &[Option<TensorRef<'_>>],
        outputs: &mut [Option<TensorMut<'_>>],
        threads: &dyn Parallel,
    ) -> std::result::Result<(), String>;
}

/// A custom operator of the [`DOMAIN`]: its signature and how to make a kernel for a node.
pub trait CustomOp: Send + Sync {
    /// The operator's type in the domain.
    fn name(&self) -> &'static str;
    /// Its inputs, in order.
    fn inputs(&self) -> Vec<Port>;
    /// Its outputs, in order.
    fn outputs(&self) -> Vec<Port>;
    /// The kernel of a node with these attributes.
    fn kernel(&self, attributes: &dyn Attributes) -> std::result::Result<Box<dyn Kernel>, String>;
    /// Whether the operator passes its first input (`float`) through as its first output,
    /// unchanged: ONNX Runtime then gives both one buffer (no copy), and the kernel only decides
    /// when the node ends (a wait): its `compute` is handed neither inputs nor outputs.
    fn passes_through(&self) -> bool {
        false
    }
}

/// The operator domain a session registers, holding `ops`.
pub(crate) fn domain(ops: &[Arc<dyn CustomOp>]) -> Result<OperatorDomain> {
    let fail = |e: ort::Error| RuntimeError::Ort {
        context: format!("registering the {DOMAIN} operators"),
        message: e.message().into(),
    };
    let mut domain = OperatorDomain::new(DOMAIN).map_err(fail)?;
    for op in ops {
        // Kernels fill outputs as `TensorMut`, which has no int64 view.
        if op.outputs().iter().any(|p| p.element == ElementType::I64) {
            return Err(RuntimeError::Ort {
                context: format!("registering {DOMAIN}.{}", op.name()),
                message: "int64 outputs are not supported".into(),
            });
        }
        domain = if op.passes_through() {
            domain.add(PassThrough(Adapter(op.clone()))).map_err(fail)?
        } else {
            domain.add(Adapter(op.clone())).map_err(fail)?
        };
    }
    Ok(domain)
}

struct Adapter(Arc<dyn CustomOp>);

/// An [`Adapter`] whose first output is its first input, in the same buffer.
struct PassThrough(Adapter);

fn element_type(e: ElementType) -> TensorElementType {
    match e {
        ElementType::F32 => TensorElementType::Float32,
        ElementType::I64 => TensorElementType::Int64,
        ElementType::Bool => TensorElementType::Bool,
    }
}

struct NodeAttributes<'a, 'attr>(&'a KernelContext<'attr>);

impl Attributes for NodeAttributes<'_, '_> {
    fn int(&self, name: &str) -> Option<i64> {
        self.0.get::<i64>(name)
    }

    fn float(&self, name: &str) -> Option<f32> {
        self.0.get::<f32>(name)
    }
}

impl Operator for Adapter {
    type Kernel<'attr> = BoxedKernel<'attr>;

    fn name(&self) -> &str {
        self.0.name()
    }

    fn inputs(&self) -> impl IntoIterator<Item = OperatorInput> {
        self.0.inputs().into_iter().map(|p| match p.optional {
            false => OperatorInput::required(element_type(p.element)),
            true => OperatorInput::optional(element_type(p.element)),
        })
    }

    fn outputs(&self) -> impl IntoIterator<Item = OperatorOutput> {
        self.0.outputs().into_iter().map(|p| match p.optional {
            false => OperatorOutput::required(element_type(p.element)),
            true => OperatorOutput::optional(element_type(p.element)),
        })
    }

    fn create_kernel<'attr>(&self, kctx: &KernelContext<'attr>) -> ort::Result<Self::Kernel<'attr>> {
        let name = self.0.name();
        let kernel = self.0.kernel(&NodeAttributes(kctx)).map_err(|e| ort::Error::new(format!("{name}: {e}")))?;
        let (inputs, outputs) = (self.0.inputs(), self.0.outputs());
        Ok(Box::new(move |ctx: &ComputeContext| {
            run(&*kernel, &inputs, &outputs, ctx).map_err(|e| ort::Error::new(format!("{name}: {e}")))
        }))
    }
}

impl Operator for PassThrough {
    type Kernel<'attr> = BoxedKernel<'attr>;

    const ALIASES: &[(u32, u32)] = &[(0, 0)];

    fn name(&self) -> &str {
        self.0.name()
    }

    fn inputs(&self) -> impl IntoIterator<Item = OperatorInput> {
        self.0.inputs()
    }

    fn outputs(&self) -> impl IntoIterator<Item = OperatorOutput> {
        self.0.outputs()
    }

    fn create_kernel<'attr>(&self, kctx: &KernelContext<'attr>) -> ort::Result<Self::Kernel<'attr>> {
        let name = self.0 .0.name();
        let kernel = self.0 .0.kernel(&NodeAttributes(kctx)).map_err(|e| ort::Error::new(format!("{name}: {e}")))?;
        let inputs = self.0 .0.inputs();
        if inputs.first().map(|p| p.element) != Some(ElementType::F32) {
            return Err(ort::Error::new(format!("{name}: a pass-through operator takes a float tensor first")));
        }
        Ok(Box::new(move |ctx: &ComputeContext| {
            pass_through(&*kernel, &inputs, ctx).map_err(|e| ort::Error::new(format!("{name}: {e}")))
        }))
    }
}

/// Runs a pass-through kernel: it is handed neither inputs nor outputs (while it waits, another
/// thread may still be writing the input), then the first output is made over the first
/// input's buffer (ONNX Runtime plans it so, from the operator's alias), or filled with a copy
/// should a build of ONNX Runtime not honour the alias.
fn pass_through(kernel: &dyn Kernel, inputs: &[Port], ctx: &ComputeContext) -> ort::Result<()> {
    kernel.compute(&[], &mut [], &Serial).map_err(ort::Error::new)?;
    let values = input_values(inputs, ctx)?;
    let first = values.first().and_then(Option::as_ref).ok_or_else(|| ort::Error::new("no first input"))?;
    let (shape, source) = {
        let (shape, data) = first.try_extract_tensor::<f32>()?;
        (shape.to_vec(), data.as_ptr())
    };
    let Some(mut output) = ctx.output(0, shape)? else { return Ok(()) };
    // The input's slice is gone: only its address is compared.
    let data = output.try_extract_tensor_mut::<f32>()?.1;
    if data.as_ptr() != source {
        let input = first.try_extract_tensor::<f32>()?.1;
        if input.len() != data.len() {
            return Err(ort::Error::new(format!("{} floats in, {} out", input.len(), data.len())));
        }
        data.copy_from_slice(input);
    }
    Ok(())
}

/// Hands ONNX Runtime's tensors to `kernel` as slices.
fn run(kernel: &dyn Kernel, inputs: &[Port], outputs: &[Port], ctx: &ComputeContext) -> ort::Result<()> {
    let values = input_values(inputs, ctx)?;
    let views = input_views(inputs, &values)?;
    let shapes = kernel.output_shapes(&views).map_err(ort::Error::new)?;
    if shapes.len() != outputs.len() {
        return Err(ort::Error::new(format!("{} output shapes for {} outputs", shapes.len(), outputs.len())));
    }
    let mut values = Vec::with_capacity(outputs.len());
    for (i, shape) in shapes.into_iter().enumerate() {
        values.push(ctx.output(i, shape)?);
    }
    let mut slots = Vec::with_capacity(values.len());
    for (value, port) in values.iter_mut().zip(outputs) {
        slots.push(match value.as_mut() {
            None => None,
            Some(value) => Some(match port.element {
                ElementType::F32 => TensorMut::F32(value.try_extract_tensor_mut::<f32>()?.1),
                ElementType::Bool => TensorMut::Bool(value.try_extract_tensor_mut::<bool>()?.1),
                // `domain` refuses such operators; an error, never a panic, inside ONNX Runtime.
                ElementType::I64 => return Err(ort::Error::new("int64 outputs are not supported")),
            }),
        });
    }
    kernel.compute(&views, &mut slots, &OrtThreads(ctx)).map_err(ort::Error::new)
}

/// The inputs of a node as slices over ONNX Runtime's tensors (`values`: [`ComputeContext::input`]'s).
fn input_views<'v>(inputs: &[Port], values: &'v [Option<ValueRef<'_>>]) -> ort::Result<Vec<Option<TensorRef<'v>>>> {
    let mut views = Vec::with_capacity(inputs.len());
    for (value, port) in values.iter().zip(inputs) {
        let Some(value) = value else {
            views.push(None);
            continue;
        };
        views.push(Some(match port.element {
            ElementType::F32 => {
                let (shape, data) = value.try_extract_tensor::<f32>()?;
                TensorRef::F32(shape, data)
            }
            ElementType::I64 => {
                let (shape, data) = value.try_extract_tensor::<i64>()?;
                TensorRef::I64(shape, data)
            }
            ElementType::Bool => {
                let (shape, data) = value.try_extract_tensor::<bool>()?;
                TensorRef::Bool(shape, data)
            }
        }));
    }
    Ok(views)
}

fn input_values<'c>(inputs: &[Port], ctx: &'c ComputeContext) -> ort::Result<Vec<Option<ValueRef<'c>>>> {
    (0..inputs.len()).map(|i| ctx.input(i)).collect()
}
