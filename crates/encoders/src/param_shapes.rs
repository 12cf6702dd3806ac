//! How a family declares its parameters: each one's name and shape, in layout order, and the
//! shapes of the two kinds every family has (linear layers and LayerNorms).

/// Where a family's parameters are named with their shapes, in layout order.
pub(crate) type AddParam<'a> = &'a mut dyn FnMut(String, Vec<usize>);

/// A linear layer's weight (`[out, in]`, as Hugging Face stores it) and bias.
pub(crate) fn linear(add: AddParam<'_>, prefix: &str, inputs: usize, outputs: usize) {
    add(format!("{prefix}.weight"), vec![outputs, inputs]);
    add(format!("{prefix}.bias"), vec![outputs]);
}

/// A LayerNorm's scale and shift over `width`.
pub(crate) fn norm(add: AddParam<'_>, prefix: &str, width: usize) {
    add(format!("{prefix}.weight"), vec![width]);
    add(format!("{prefix}.bias"), vec![width]);
}
