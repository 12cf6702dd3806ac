//! Elementwise work split over threads in contiguous parts, so that what each element gets
//! does not depend on how many threads there are.

/// Parts smaller than this are not worth a thread.
const MIN_PART: usize = 1 << 16;

/// How many threads `threads` means (0: one per core).
pub(crate) fn resolve(threads: usize) -> usize {
    match threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    }
}

/// Where `len` elements split into parts for `threads` threads, each part at least `min_part`
/// long: part `i` is `bounds[i]..bounds[i + 1]`.
pub(crate) fn bounds(len: usize, threads: usize, min_part: usize) -> Vec<usize> {
    let parts = resolve(threads).min(len.div_ceil(min_part.max(1))).max(1);
    (0..=parts).map(|i| i * len / parts).collect()
}

/// [`bounds`] for elementwise work over floats.
pub(crate) fn element_bounds(len: usize, threads: usize) -> Vec<usize> {
    bounds(len, threads, MIN_PART)
}

/// Runs `work` on every part, each on its own thread; a single part runs on the caller's
/// thread (no thread started per step when there is one).
pub(crate) fn each<T: Send>(parts: Vec<T>, work: impl Fn(T) + Sync) {
    if parts.len() <= 1 {
        parts.into_iter().for_each(work);
        return;
    }
    let work = &work;
    std::thread::scope(|s| {
        for part in parts {
            s.spawn(move || work(part));
        }
    });
}

/// `slice` cut at `bounds` (as [`bounds`] makes them).
pub(crate) fn cut<'a, T>(mut slice: &'a mut [T], bounds: &[usize]) -> Vec<&'a mut [T]> {
    let mut parts = Vec::with_capacity(bounds.len().saturating_sub(1));
    for w in bounds.windows(2) {
        let (part, rest) = slice.split_at_mut(w[1] - w[0]);
        parts.push(part);
        slice = rest;
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_cover_the_buffer_in_order() {
        for (len, threads) in [(0, 4), (10, 4), (1 << 20, 3), ((1 << 17) + 1, 8)] {
            let b = element_bounds(len, threads);
            assert_eq!((b[0], *b.last().expect("end")), (0, len));
            assert!(b.windows(2).all(|w| w[0] <= w[1]));
            assert!(b.len() - 1 <= threads.max(1));
            let mut v = vec![0u8; len];
            assert_eq!(cut(&mut v, &b).iter().map(|p| p.len()).sum::<usize>(), len);
        }
    }
}
