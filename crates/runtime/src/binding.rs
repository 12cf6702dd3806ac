//! Flat buffers bound to a session: parameters read in place, gradients written in place.

use std::ffi::CString;

use ort::memory::{AllocationDevice, AllocatorType, MemoryInfo, MemoryType};
use ort::session::IoBinding;
use ort::value::{Shape, TensorRefMut};
use ort::AsPointer;

use crate::{FlatBuffer, LendableBuffer, OwnedTensor, Result, RuntimeError, Session, TensorView};

/// Where one graph input or output lives inside a flat buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BoundTensor {
    /// The graph input or output name.
    pub name: String,
    /// Offset of the first element, in floats.
    pub offset: usize,
    /// Dimensions (fixed).
    pub shape: Vec<i64>,
}

impl BoundTensor {
    fn range(&self, buffer_len: usize, which: &str) -> Result<std::ops::Range<usize>> {
        let len = self.shape.iter().product::<i64>();
        let end = usize::try_from(len).ok().and_then(|len| self.offset.checked_add(len));
        match end {
            Some(end) if end <= buffer_len && self.shape.iter().all(|&d| d >= 0) => Ok(self.offset..end),
            _ => Err(RuntimeError::Binding(format!(
                "`{}` (offset {}, shape {:?}) does not fit in the {which} buffer of {buffer_len} floats",
                self.name, self.offset, self.shape
            ))),
        }
    }
}

/// A session's inputs and outputs bound once to two flat buffers that this binding owns:
/// ONNX Runtime reads the `inputs` buffer (parameters) and writes the `outputs` buffer
/// (gradients) in place on every run. Between runs the caller may read and change both; the
/// inputs can also be lent to a writer that runs beside the next run (see [`LendableBuffer`]).
pub struct FlatBinding {
    // Declared first so it is dropped before the buffers it points into.
    io: IoBinding,
    input_views: Vec<(String, TensorRefMut<'static, f32>)>,
    fetch: Vec<String>,
    cpu: MemoryInfo<'static>,
    inputs: LendableBuffer,
    outputs: FlatBuffer,
}

impl FlatBinding {
    /// Binds `input_tensors` to views of `inputs` and `output_tensors` to views of `outputs`;
    /// `fetch` names further outputs (loss, logits) that ONNX Runtime allocates and `run` copies out.
    pub fn new(
        session: &Session,
        mut inputs: FlatBuffer,
        input_tensors: &[BoundTensor],
        mut outputs: FlatBuffer,
        output_tensors: &[BoundTensor],
        fetch: &[&str],
    ) -> Result<Self> {
        let mut io = session.inner.create_binding().map_err(RuntimeError::ort("creating an I/O binding"))?;
        let has_input = |n: &str| session.input_names().iter().any(|i| i == n);
        let has_output = |n: &str| session.output_names().iter().any(|o| o == n);
        let mut views = Vec::with_capacity(input_tensors.len());
        for t in input_tensors {
            if !has_input(&t.name) {
                return Err(RuntimeError::Binding(format!("the graph has no input `{}`", t.name)));
            }
            let range = t.range(inputs.len(), "input")?;
            let ptr = inputs[range].as_mut_ptr();
            views.push((t.name.clone(), view_in_place(&t.name, ptr, &t.shape)?));
        }
        for t in output_tensors {
            if !has_output(&t.name) {
                return Err(RuntimeError::Binding(format!("the graph has no output `{}`", t.name)));
            }
            let range = t.range(outputs.len(), "output")?;
            let view = TensorRefMut::from_array_view_mut((t.shape.clone(), &mut outputs[range]))
                .map_err(RuntimeError::ort(format!("viewing output `{}`", t.name)))?;
            io.bind_output(t.name.as_str(), view).map_err(RuntimeError::ort(format!("binding output `{}`", t.name)))?;
        }
        let cpu = MemoryInfo::new(AllocationDevice::CPU, 0, AllocatorType::Device, MemoryType::Default)
            .map_err(RuntimeError::ort("describing CPU memory"))?;
        for name in fetch {
            if !has_output(name) {
                return Err(RuntimeError::Binding(format!("the graph has no output `{name}`")));
            }
        }
        Ok(FlatBinding {
            io,
            input_views: views,
            fetch: fetch.iter().map(|s| s.to_string()).collect(),
            cpu,
            inputs: LendableBuffer::new(inputs),
            outputs,
        })
    }

    /// Runs `session` with the per-run `batch` tensors; the bound outputs are written into the
    /// outputs buffer and the fetched ones are returned, in `fetch` order.
    pub fn run(&mut self, session: &mut Session, batch: &[(&str, TensorView<'_>)]) -> Result<Vec<OwnedTensor>> {
        // Inputs are bound for this run only, so that no binding outlives the caller's batch.
        self.io.clear_inputs();
        for (name, view) in &self.input_views {
            bind_input_raw(&mut self.io, name, view.ptr())?;
        }
        let batch_values =
            batch.iter().map(|(name, view)| Ok((*name, view.to_ort(name)?))).collect::<Result<Vec<_>>>()?;
        for (name, value) in &batch_values {
            bind_input_raw(&mut self.io, name, value.ptr())?;
        }
        // Fetched outputs change shape with the batch: ONNX Runtime allocates them afresh each
        // run only if they are bound to the device again (else it reuses last run's tensor).
        for name in &self.fetch {
            self.io
                .bind_output_to_device(name.as_str(), &self.cpu)
                .map_err(RuntimeError::ort(format!("binding output `{name}`")))?;
        }
        let fetched = (|| {
            let results = session.inner.run_binding(&self.io).map_err(RuntimeError::ort("running the graph"))?;
            self.fetch
                .iter()
                .map(|name| {
                    let value = results
                        .get(name.as_str())
                        .ok_or_else(|| RuntimeError::Binding(format!("ONNX Runtime returned no `{name}`")))?;
                    OwnedTensor::from_ort(name, value)
                })
                .collect()
        })();
        self.io.clear_inputs();
        fetched
    }

    /// The inputs buffer (parameters).
    pub fn inputs(&self) -> &LendableBuffer {
        &self.inputs
    }

    /// The inputs buffer, to update between runs (the optimizer step) or to lend.
    pub fn inputs_mut(&mut self) -> &mut LendableBuffer {
        &mut self.inputs
    }

    /// The outputs buffer (gradients).
    pub fn outputs(&self) -> &[f32] {
        &self.outputs
    }

    /// The outputs buffer, to change between runs (the all-reduce).
    pub fn outputs_mut(&mut self) -> &mut [f32] {
        &mut self.outputs
    }

    /// Both buffers at once: inputs to change, outputs to read (the optimizer step).
    pub fn split_mut(&mut self) -> (&mut LendableBuffer, &mut [f32]) {
        (&mut self.inputs, &mut self.outputs)
    }

    /// Unbinds and hands the buffers back.
    pub fn into_buffers(self) -> (LendableBuffer, FlatBuffer) {
        let FlatBinding { io, input_views, inputs, outputs, .. } = self;
        drop(io);
        drop(input_views);
        (inputs, outputs)
    }
}

/// A tensor view of the floats at `ptr`, with no lifetime: the caller keeps the memory alive.
#[allow(unsafe_code)]
fn view_in_place(name: &str, ptr: *mut f32, shape: &[i64]) -> Result<TensorRefMut<'static, f32>> {
    let cpu = MemoryInfo::new(AllocationDevice::CPU, 0, AllocatorType::Device, MemoryType::Default)
        .map_err(RuntimeError::ort("describing CPU memory"))?;
    // SAFETY: `ptr` points at `shape.product()` floats inside a FlatBuffer owned by the
    // FlatBinding (through its LendableBuffer) that also owns the returned view and the
    // IoBinding; the buffer's heap storage never moves and is dropped only after both (field
    // order of FlatBinding), or later, when a lend outlives the binding.
    unsafe { TensorRefMut::<f32>::from_raw(cpu, ptr.cast(), Shape::new(shape.iter().copied())) }
        .map_err(RuntimeError::ort(format!("viewing input `{name}`")))
}

/// Binds an input by reference. ort's safe `bind_input` copies borrowed tensors (and deadlocks
/// doing so in rc.15); ONNX Runtime itself only keeps a reference, which `run` clears again.
#[allow(unsafe_code)]
fn bind_input_raw(io: &mut IoBinding, name: &str, value: *const ort::sys::OrtValue) -> Result<()> {
    let cname = CString::new(name).map_err(|_| RuntimeError::Binding(format!("input name `{name}` has a NUL byte")))?;
    // SAFETY: both pointers are valid ORT objects for the duration of the call; the value's
    // memory stays alive until the binding's inputs are cleared (see `FlatBinding::run`).
    let status = unsafe { (ort::api().BindInput)(io.ptr_mut(), cname.as_ptr(), value) };
    // SAFETY: the status comes straight from BindInput.
    unsafe { ort::Error::result_from_status(status) }.map_err(RuntimeError::ort(format!("binding input `{name}`")))
}
