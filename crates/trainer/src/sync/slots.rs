//! The one place where the gradients' buffer is split between threads, and the only `unsafe`
//! of the trainer.
//!
//! **Gradients move by ownership.** The gradient buffer ([`Slab`]) is split once per step into
//! [`Piece`]s, cut at every parameter's and every bucket's bounds. A piece is the sole handle
//! to its floats: ONNX Runtime's thread fills a parameter's pieces and sends them to the sync
//! thread, which joins a bucket's pieces into one, reduces it, and sends it to the loop with its
//! report; once every piece is back and dropped, the loop has the whole buffer again
//! ([`Slab::whole`]). Why this is sound: [`Slab::split`] runs only when no piece is alive, and
//! cuts disjoint ranges; a piece is never copied; [`Piece::join`] consumes two adjacent pieces
//! of one slab. So the live pieces of a slab always cover disjoint floats, and `&mut` to a
//! piece's floats is exclusive. The storage lives as long as its last piece (an `Arc`).
//!
//! The parameters move by ownership too, but live in the session's binding
//! ([`ringtune_runtime::LendableBuffer`]): the gather behind the next forward pass borrows
//! them as a lend that the runtime's types keep exclusive.

#![allow(unsafe_code)]

use std::cell::UnsafeCell;
use std::ops::Range;
use std::sync::Arc;

/// Floats shared by the pieces of one slab.
#[derive(Debug)]
struct Storage {
    cells: Box<[UnsafeCell<f32>]>,
}

// SAFETY: the floats are reached only through a `Piece` (disjoint, by the argument above) or
// through `Slab::whole` (when no piece is alive).
unsafe impl Sync for Storage {}
unsafe impl Send for Storage {}

/// A flat `f32` buffer that can be split into pieces for other threads to own.
pub(crate) struct Slab {
    storage: Arc<Storage>,
}

impl Slab {
    pub(crate) fn zeros(len: usize) -> Self {
        Slab { storage: Arc::new(Storage { cells: (0..len).map(|_| UnsafeCell::new(0.0)).collect() }) }
    }

    pub(crate) fn len(&self) -> usize {
        self.storage.cells.len()
    }

    /// The whole buffer, when no piece of it is alive.
    pub(crate) fn whole(&mut self) -> Option<&mut [f32]> {
        let storage = Arc::get_mut(&mut self.storage)?;
        let cells = &mut storage.cells[..];
        // SAFETY: `get_mut` proves no piece is alive, and `&mut self` that nothing else uses
        // the slab; `UnsafeCell<f32>` has the layout of `f32` and the cells are contiguous.
        Some(unsafe { std::slice::from_raw_parts_mut(UnsafeCell::raw_get(cells.as_mut_ptr()), cells.len()) })
    }

    /// The buffer cut at `bounds` (increasing, inside the buffer; 0 and the length are
    /// implied), when no piece of it is alive.
    pub(crate) fn split(&mut self, bounds: &[usize]) -> Option<Vec<Piece>> {
        Arc::get_mut(&mut self.storage)?;
        let len = self.len();
        let mut cuts: Vec<usize> = std::iter::once(0).chain(bounds.iter().copied()).chain([len]).collect();
        cuts.dedup();
        if cuts.windows(2).any(|w| w[0] > w[1]) || cuts.last() != Some(&len) {
            return None;
        }
        Some(cuts.windows(2).map(|w| Piece { storage: self.storage.clone(), range: w[0]..w[1] }).collect())
    }
}

/// The sole handle to a range of a slab's floats.
#[derive(Debug)]
pub(crate) struct Piece {
    storage: Arc<Storage>,
    range: Range<usize>,
}

impl Piece {
    /// Where the piece lies in its slab.
    pub(crate) fn range(&self) -> Range<usize> {
        self.range.clone()
    }

    pub(crate) fn floats(&mut self) -> &mut [f32] {
        let cells = &self.storage.cells[self.range.clone()];
        // SAFETY: this piece is the only live handle to `range` (see the module's argument),
        // and `&mut self` makes this slice the only use of it; `UnsafeCell<f32>` has the layout
        // of `f32` and the cells are contiguous.
        unsafe { std::slice::from_raw_parts_mut(UnsafeCell::raw_get(cells.as_ptr()), cells.len()) }
    }

    /// This piece and `next`, which must start where it ends, in the same slab, as one piece;
    /// else both back.
    pub(crate) fn join(self, next: Piece) -> Result<Piece, (Piece, Piece)> {
        if Arc::ptr_eq(&self.storage, &next.storage) && self.range.end == next.range.start {
            Ok(Piece { range: self.range.start..next.range.end, storage: self.storage })
        } else {
            Err((self, next))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_own_disjoint_floats_and_the_whole_comes_back_when_all_are_dropped() {
        let mut slab = Slab::zeros(10);
        let mut pieces = slab.split(&[3, 7]).expect("no piece alive");
        assert_eq!(pieces.iter().map(Piece::range).collect::<Vec<_>>(), vec![0..3, 3..7, 7..10]);
        assert!(slab.whole().is_none() && slab.split(&[5]).is_none(), "pieces are out");
        let last = pieces.pop().expect("three");
        let middle = pieces.pop().expect("two");
        let first = pieces.pop().expect("one");
        let (first, last) = first.join(last).expect_err("not adjacent");
        let mut joined = middle.join(last).expect("adjacent");
        joined.floats().copy_from_slice(&[1.0; 7]);
        std::thread::spawn(move || drop(joined)).join().expect("a piece moves between threads");
        assert!(slab.whole().is_none(), "one piece still out");
        drop(first);
        assert_eq!(slab.whole().expect("all back"), &[0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]);
        assert!(slab.split(&[4, 2]).is_none(), "bounds out of order");
        assert!(slab.split(&[11]).is_none(), "bounds past the end");
    }

    #[test]
    fn pieces_of_two_slabs_do_not_join() {
        let (mut a, mut b) = (Slab::zeros(4), Slab::zeros(4));
        let mut a = a.split(&[2]).expect("a");
        let b = b.split(&[2]).expect("b");
        let a0 = a.remove(0);
        assert!(a0.join(b.into_iter().nth(1).expect("b's second")).is_err());
    }
}
