//! Gradient buckets: the buffer cut into pieces reduced in a fixed order.

use std::ops::Range;

/// Cuts `len` elements into buckets: a small first one (`first` elements) so communication
/// starts early, then buckets of `size` elements; cuts fall on `align` boundaries.
pub fn plan_buckets(len: usize, first: usize, size: usize, align: usize) -> Vec<Range<usize>> {
    let round = |n: usize| n.div_ceil(align.max(1)) * align.max(1);
    let mut out = Vec::new();
    let mut start = 0;
    let mut next = round(first.max(1));
    while start < len {
        let end = (start + next).min(len);
        out.push(start..end);
        start = end;
        next = round(size.max(1));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cover_the_buffer_in_order() {
        let b = plan_buckets(100, 10, 32, 16);
        assert_eq!(b, vec![0..16, 16..48, 48..80, 80..100]);
        assert!(plan_buckets(0, 10, 32, 16).is_empty());
    }
}
