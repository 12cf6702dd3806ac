//! A flat buffer that a session reads in place and that can be lent, by ownership, to another
//! thread that writes it while the session goes on reading it.
//!
//! The trainer's parameters live here: after the optimizer step, the sync thread all-gathers
//! them bucket by bucket behind the next forward pass, which reads each bucket once it is in.
//! The lend is a value ([`LentBuffer`]) that shares the storage (an `Arc`), so the storage
//! outlives it whatever is dropped first, and while it is alive the owner's safe access
//! ([`LendableBuffer::floats`], [`LendableBuffer::floats_mut`]) answers `None`: no Rust
//! reference to the floats can alias the lent one. What the types cannot see is ONNX Runtime's
//! reads through the binding's pointer during a run: the lender orders its write of a range
//! before any run reads that range (the trainer's `ParamReady` nodes wait for it).

#![allow(unsafe_code)]

use std::cell::UnsafeCell;
use std::ops::Range;
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;

use crate::FlatBuffer;

struct Cells {
    buffer: UnsafeCell<FlatBuffer>,
    /// The buffer's first float: its heap storage never moves.
    first: *mut f32,
    len: usize,
}

// SAFETY: the floats are reached through `&mut` of the sole owner (`Arc::get_mut`), through
// `&` of the owner while no lend is alive (then nothing writes them), or through the one lend
// (then the owner reaches nothing); ONNX Runtime's reads are ordered by the lender (module doc).
unsafe impl Send for Cells {}
unsafe impl Sync for Cells {}

/// A flat `f32` buffer that can be lent to one writer at a time (see the module doc).
pub struct LendableBuffer {
    cells: Arc<Cells>,
}

impl LendableBuffer {
    /// Takes `buffer` in.
    pub fn new(mut buffer: FlatBuffer) -> Self {
        let (first, len) = (buffer.as_mut_ptr(), buffer.len());
        LendableBuffer { cells: Arc::new(Cells { buffer: UnsafeCell::new(buffer), first, len }) }
    }

    /// Number of floats.
    pub fn len(&self) -> usize {
        self.cells.len
    }

    /// Whether the buffer holds no float.
    pub fn is_empty(&self) -> bool {
        self.cells.len == 0
    }

    /// Whether a lend of it is alive.
    pub fn is_lent(&self) -> bool {
        Arc::strong_count(&self.cells) > 1
    }

    /// The floats, unless they are lent.
    pub fn floats(&self) -> Option<&[f32]> {
        if self.is_lent() {
            return None;
        }
        // The lend's last writes happen before its drop (a release decrement of the count
        // that the load above read): this fence makes them visible here.
        fence(Ordering::Acquire);
        // SAFETY: no lend is alive and none can start while `&self` is held (lending takes
        // `&mut self`), so nothing writes the floats while this borrow lasts.
        Some(unsafe { &**self.cells.buffer.get() })
    }

    /// The floats to change, unless they are lent.
    pub fn floats_mut(&mut self) -> Option<&mut [f32]> {
        Arc::get_mut(&mut self.cells).map(|cells| &mut **cells.buffer.get_mut())
    }

    /// The buffer lent to one writer, unless it is lent already.
    pub fn lend(&mut self) -> Option<LentBuffer> {
        (!self.is_lent()).then(|| LentBuffer { cells: self.cells.clone() })
    }

    /// The buffer back, unless it is lent.
    pub fn into_inner(self) -> Option<FlatBuffer> {
        Arc::into_inner(self.cells).map(|cells| cells.buffer.into_inner())
    }
}

impl std::fmt::Debug for LendableBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LendableBuffer({} floats{})", self.len(), if self.is_lent() { ", lent" } else { "" })
    }
}

/// A [`LendableBuffer`] lent: the one writer of its floats while it lives.
pub struct LentBuffer {
    cells: Arc<Cells>,
}

impl LentBuffer {
    /// Number of floats.
    pub fn len(&self) -> usize {
        self.cells.len
    }

    /// Whether the buffer holds no float.
    pub fn is_empty(&self) -> bool {
        self.cells.len == 0
    }

    /// The floats of `range`, to write; `None` if `range` is not inside the buffer.
    pub fn range_mut(&mut self, range: Range<usize>) -> Option<&mut [f32]> {
        if range.start > range.end || range.end > self.cells.len {
            return None;
        }
        // SAFETY: inside the buffer (checked above), whose storage this lend keeps alive; the
        // owner reaches no float while the lend lives and there is one lend at a time, and
        // `&mut self` makes this the lend's only slice.
        Some(unsafe { std::slice::from_raw_parts_mut(self.cells.first.add(range.start), range.len()) })
    }
}

impl std::fmt::Debug for LentBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LentBuffer({} floats)", self.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_owner_reaches_nothing_while_the_buffer_is_lent() {
        let mut buffer = LendableBuffer::new(FlatBuffer::from_slice(&[1.0, 2.0, 3.0, 4.0]));
        let mut lent = buffer.lend().expect("not lent yet");
        assert!(buffer.floats().is_none() && buffer.floats_mut().is_none() && buffer.lend().is_none());
        assert!(lent.range_mut(2..5).is_none(), "past the end");
        let writer = std::thread::spawn(move || {
            lent.range_mut(1..3).expect("inside").copy_from_slice(&[20.0, 30.0]);
            lent
        });
        let lent = writer.join().expect("the lend moves between threads");
        assert!(buffer.is_lent());
        drop(lent);
        assert_eq!(buffer.floats().expect("back"), &[1.0, 20.0, 30.0, 4.0]);
        buffer.floats_mut().expect("back")[0] = 10.0;
        assert_eq!(&buffer.into_inner().expect("not lent")[..], &[10.0, 20.0, 30.0, 4.0]);
    }

    #[test]
    fn a_lend_outlives_its_owner() {
        let mut buffer = LendableBuffer::new(FlatBuffer::zeros(3));
        let first = buffer.cells.first;
        let mut lent = buffer.lend().expect("not lent");
        drop(buffer);
        lent.range_mut(0..3).expect("inside").fill(7.0);
        assert_eq!(lent.cells.first, first, "the storage did not move");
        assert_eq!(Arc::into_inner(lent.cells).map(|c| c.buffer.into_inner().to_vec()), Some(vec![7.0; 3]));
    }
}
