//! A frame's payload as a transport hands it over: the byte chunks it received, in order,
//! without joining them (QUIC delivers a stream in chunks of the datagrams it arrived in), or
//! one buffer this crate made. Floats may straddle two chunks; the helpers here take care of it
//! so the state machines add or copy received floats straight into the accumulator.

use bytes::Bytes;

use crate::wire::{from_bf16, Wire};

/// A frame's payload: one or more byte chunks, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Payload(Vec<Bytes>);

impl Payload {
    /// Bytes in all.
    pub fn len(&self) -> usize {
        self.0.iter().map(Bytes::len).sum()
    }

    /// Whether it holds no byte.
    pub fn is_empty(&self) -> bool {
        self.0.iter().all(Bytes::is_empty)
    }

    /// The chunks, in order (to write out without a copy).
    pub fn chunks(&self) -> &[Bytes] {
        &self.0
    }

    /// The bytes in one buffer (a copy unless there is one chunk).
    pub fn to_bytes(&self) -> Bytes {
        match self.0.as_slice() {
            [] => Bytes::new(),
            [one] => one.clone(),
            many => Bytes::from(many.iter().flat_map(|c| c.iter().copied()).collect::<Vec<u8>>()),
        }
    }

    /// Applies `op(local[i], theirs[i])` for every value of the payload (little endian, in
    /// `wire`'s format), chunk by chunk; `local` must have exactly as many values as the payload.
    pub(crate) fn zip_values(&self, wire: Wire, local: &mut [f32], op: impl FnMut(&mut f32, f32)) {
        match wire {
            Wire::F32 => self.zip_units::<4>(local, f32::from_le_bytes, op),
            Wire::Bf16 => self.zip_units::<2>(local, |b| from_bf16(u16::from_le_bytes(b)), op),
        }
    }

    /// [`Payload::zip_values`] for values of `N` bytes, which may straddle two chunks.
    fn zip_units<const N: usize>(
        &self,
        local: &mut [f32],
        decode: impl Fn([u8; N]) -> f32,
        mut op: impl FnMut(&mut f32, f32),
    ) {
        assert_eq!(self.len(), local.len() * N, "the caller checks the length");
        let mut at = 0;
        let mut carry = [0u8; N];
        let mut carried = 0;
        for chunk in &self.0 {
            let mut bytes: &[u8] = chunk;
            if carried > 0 {
                let take = (N - carried).min(bytes.len());
                carry[carried..carried + take].copy_from_slice(&bytes[..take]);
                carried += take;
                bytes = &bytes[take..];
                if carried < N {
                    continue;
                }
                op(&mut local[at], decode(carry));
                at += 1;
            }
            let whole = bytes.len() / N;
            for (l, t) in local[at..at + whole].iter_mut().zip(bytes.chunks_exact(N)) {
                let mut unit = [0u8; N];
                unit.copy_from_slice(t);
                op(l, decode(unit));
            }
            at += whole;
            let rest = &bytes[N * whole..];
            carry[..rest.len()].copy_from_slice(rest);
            carried = rest.len();
        }
    }

    /// Writes the payload's values (in `wire`'s format) over `local` (exactly as many values).
    pub(crate) fn copy_values(&self, wire: Wire, local: &mut [f32]) {
        if wire == Wire::Bf16 {
            return self.zip_values(wire, local, |l, t| *l = t);
        }
        let out: &mut [u8] = bytemuck::cast_slice_mut(local);
        assert_eq!(self.len(), out.len(), "the caller checks the length");
        let mut at = 0;
        for chunk in &self.0 {
            out[at..at + chunk.len()].copy_from_slice(chunk);
            at += chunk.len();
        }
    }
}

impl From<Bytes> for Payload {
    fn from(bytes: Bytes) -> Self {
        Payload(vec![bytes])
    }
}

impl From<Vec<Bytes>> for Payload {
    fn from(chunks: Vec<Bytes>) -> Self {
        Payload(chunks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The floats' bytes cut into chunks at the given byte offsets.
    fn cut(values: &[f32], at: &[usize]) -> Payload {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut chunks = Vec::new();
        let mut start = 0;
        for &end in at.iter().chain(std::iter::once(&bytes.len())) {
            chunks.push(Bytes::copy_from_slice(&bytes[start..end]));
            start = end;
        }
        Payload(chunks)
    }

    #[test]
    fn floats_straddling_chunks_are_read_whole() {
        let values: Vec<f32> = (0..10).map(|i| i as f32 * 1.5 - 3.0).collect();
        for at in [vec![], vec![1], vec![3, 5, 6], vec![4, 8, 9, 10, 11, 12], vec![0, 0, 39]] {
            let payload = cut(&values, &at);
            assert_eq!(payload.len(), 40);
            let mut sum = vec![1.0f32; 10];
            payload.zip_values(Wire::F32, &mut sum, |l, t| *l += t);
            assert_eq!(sum, values.iter().map(|v| 1.0 + v).collect::<Vec<_>>(), "cut at {at:?}");
            let mut copy = vec![0.0f32; 10];
            payload.copy_values(Wire::F32, &mut copy);
            assert_eq!(copy, values);
            assert_eq!(payload.to_bytes().len(), 40);
        }
    }

    #[test]
    fn bf16_values_straddling_chunks_are_read_whole() {
        let values: Vec<f32> = (0..10).map(|i| i as f32 * 1.5 - 3.0).collect();
        let bytes = Wire::Bf16.encode(&values);
        for at in [vec![], vec![1], vec![3, 5, 6], vec![0, 0, 19]] {
            let mut chunks = Vec::new();
            let mut start = 0;
            for &end in at.iter().chain(std::iter::once(&bytes.len())) {
                chunks.push(bytes.slice(start..end));
                start = end;
            }
            let mut copy = vec![0.0f32; 10];
            Payload(chunks).copy_values(Wire::Bf16, &mut copy);
            assert_eq!(copy, values, "cut at {at:?}");
        }
    }
}
