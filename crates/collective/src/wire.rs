//! How gradients travel: as `f32`, or as bf16 (half the bytes) with every sum kept in `f32`.

use bytes::Bytes;

/// The number format of floats on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Wire {
    /// 4 bytes per value, the accumulator's own bits.
    #[default]
    F32,
    /// 2 bytes per value: `f32` rounded to the nearest bf16 (ties to even). Sums are still
    /// formed in `f32` at every hop; only what is sent is rounded.
    Bf16,
}

impl Wire {
    /// Bytes per value.
    pub fn bytes_per_value(self) -> usize {
        match self {
            Wire::F32 => 4,
            Wire::Bf16 => 2,
        }
    }

    /// `values` as they go on the wire (a fresh buffer the transport may keep).
    pub fn encode(self, values: &[f32]) -> Bytes {
        match self {
            Wire::F32 => crate::float_payload(values.to_vec()),
            Wire::Bf16 => Bytes::from_owner(HalfBytes(values.iter().map(|&v| to_bf16(v)).collect())),
        }
    }

    /// Replaces each value by what the wire would carry of it, so that the rank that computes a
    /// value holds the same bits as the ranks that receive it.
    pub fn round_in_place(self, values: &mut [f32]) {
        if self == Wire::Bf16 {
            values.iter_mut().for_each(|v| *v = from_bf16(to_bf16(*v)));
        }
    }
}

/// bf16 values handed to a transport without a copy (their in-memory bytes, little endian).
struct HalfBytes(Vec<u16>);

impl AsRef<[u8]> for HalfBytes {
    fn as_ref(&self) -> &[u8] {
        bytemuck::cast_slice(&self.0)
    }
}

/// `value` rounded to the nearest bf16, ties to even; NaN stays NaN (quiet).
pub fn to_bf16(value: f32) -> u16 {
    let bits = value.to_bits();
    if value.is_nan() {
        return ((bits >> 16) as u16) | 0x0040;
    }
    // Adding just under half an ulp of bf16, plus one when the kept part is odd, rounds to
    // nearest with ties to even; finite values never overflow the u32 (the largest become inf).
    let rounding = 0x7fff + ((bits >> 16) & 1);
    ((bits + rounding) >> 16) as u16
}

/// The `f32` a bf16 stands for (exact).
pub fn from_bf16(half: u16) -> f32 {
    f32::from_bits(u32::from(half) << 16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_to_nearest_with_ties_to_even() {
        // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: the even neighbour (1) wins.
        assert_eq!(from_bf16(to_bf16(1.0 + 1.0 / 256.0)), 1.0);
        // 1 + 3 * 2^-8 lies halfway between 1 + 2^-7 and 1 + 2^-6: the even one is 1 + 2^-6.
        assert_eq!(from_bf16(to_bf16(1.0 + 3.0 / 256.0)), 1.0 + 1.0 / 64.0);
        assert_eq!(from_bf16(to_bf16(1.0 + 1.5 / 256.0)), 1.0 + 1.0 / 128.0);
        assert_eq!(from_bf16(to_bf16(-2.5)), -2.5);
        assert_eq!(from_bf16(to_bf16(f32::MAX)), f32::INFINITY);
        assert_eq!(from_bf16(to_bf16(f32::INFINITY)), f32::INFINITY);
        assert!(from_bf16(to_bf16(f32::NAN)).is_nan());
        assert_eq!(to_bf16(-0.0), 0x8000);
    }

    #[test]
    fn relative_error_is_at_most_half_an_ulp() {
        for i in 0..10_000u32 {
            let v = f32::from_bits(0x3f80_0000 + i * 837) * if i % 2 == 0 { 1.0 } else { -3.0e-5 };
            let r = from_bf16(to_bf16(v));
            assert!(((r - v) / v).abs() <= 1.0 / 256.0, "{v} -> {r}");
        }
    }

    #[test]
    fn encodes_two_bytes_per_value_and_rounds_alike() {
        let values = [1.0f32, -0.3, 1e-20, 65504.0];
        let bytes = Wire::Bf16.encode(&values);
        assert_eq!(bytes.len(), 8);
        let mut rounded = values;
        Wire::Bf16.round_in_place(&mut rounded);
        for (pair, r) in bytes.chunks_exact(2).zip(rounded) {
            assert_eq!(from_bf16(u16::from_le_bytes([pair[0], pair[1]])), r);
        }
        assert_eq!(Wire::F32.encode(&values).len(), 16);
    }
}
