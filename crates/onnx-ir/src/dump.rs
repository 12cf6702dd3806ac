//! A readable text form of a graph, for debugging: one line per input, node and output.

use std::fmt;

use crate::{Attribute, Graph};

impl fmt::Display for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ty = |name: &str| self.type_of(name).map(ToString::to_string).unwrap_or_else(|_| "?".into());
        writeln!(f, "graph {} ({} nodes)", self.name, self.nodes().len())?;
        for name in &self.inputs {
            writeln!(f, "  input  %{name}: {}", ty(name))?;
        }
        for (name, t) in &self.initializers {
            writeln!(f, "  init   %{name}: {}{:?}", t.dtype, t.dims)?;
        }
        for node in self.nodes() {
            let outs: Vec<String> = node
                .outputs
                .iter()
                .map(|o| if o.is_empty() { "_".into() } else { format!("%{o}: {}", ty(o)) })
                .collect();
            let ins: Vec<String> =
                node.inputs.iter().map(|i| if i.is_empty() { "_".into() } else { format!("%{i}") }).collect();
            let op =
                if node.domain.is_empty() { node.op_type.clone() } else { format!("{}.{}", node.domain, node.op_type) };
            write!(f, "  {} = {op}({})", outs.join(", "), ins.join(", "))?;
            if !node.attributes.is_empty() {
                let attrs: Vec<String> = node.attributes.iter().map(|(k, v)| format!("{k}={}", show(v))).collect();
                write!(f, " {{{}}}", attrs.join(", "))?;
            }
            writeln!(f)?;
        }
        for name in &self.outputs {
            writeln!(f, "  output %{name}: {}", ty(name))?;
        }
        Ok(())
    }
}

fn show(a: &Attribute) -> String {
    match a {
        Attribute::Int(v) => v.to_string(),
        Attribute::Float(v) => v.to_string(),
        Attribute::Ints(v) => format!("{v:?}"),
        Attribute::Floats(v) => format!("{v:?}"),
        Attribute::Str(s) => format!("{s:?}"),
        Attribute::Tensor(t) if t.len() <= 8 => match (t.as_i64s(), t.as_f64s()) {
            (Some(v), _) => format!("{}{v:?}", t.dtype),
            (_, Some(v)) => format!("{}{v:?}", t.dtype),
            _ => format!("{}{:?}", t.dtype, t.dims),
        },
        Attribute::Tensor(t) => format!("{}{:?}", t.dtype, t.dims),
    }
}
