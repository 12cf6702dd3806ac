//! The allocator of ringtune's programs (`ringtune`, `ring-bench`): mimalloc, told to keep the
//! memory it frees instead of handing it back to the system.
//!
//! Why: quinn copies every received datagram into a fresh buffer, and the collective makes a
//! buffer per segment; at 64 KiB datagrams, memory handed back and faulted in again cost a
//! quarter of the ring's time (400,000 page faults per four 110M-float all-reduces on four
//! ranks, against 4,000 once freed memory is kept; bus bandwidth 0.24 to 0.30 GB/s).
//!
//! Owns: the choice of allocator and its settings. Libraries never set a global allocator;
//! a program opts in by naming [`Allocator`] its `#[global_allocator]` and calling
//! [`keep_freed_memory`] before it allocates much.
//!
//! ```
//! #[global_allocator]
//! static ALLOCATOR: ringtune_alloc::Allocator = ringtune_alloc::Allocator;
//!
//! ringtune_alloc::keep_freed_memory();
//! let big = vec![0u8; 1 << 20];
//! drop(big);
//! ```

#![allow(unsafe_code)]

/// The global allocator type (mimalloc).
pub use mimalloc::MiMalloc as Allocator;

/// mimalloc 3's `mi_option_purge_delay`: the 16th entry of `mi_option_e` in the pinned
/// `libmimalloc-sys` (`c_src/mimalloc/v3/include/mimalloc.h`), the one `options.c` defaults to
/// 1000 (ms).
const PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Tells mimalloc never to return freed memory to the system (call it first in `main`); only
/// has an effect when [`Allocator`] is the global allocator. Returns whether it did: an option
/// at that index not holding the purge delay's default means another mimalloc, left alone.
pub fn keep_freed_memory() -> bool {
    // SAFETY: reads and sets one integer option; mimalloc reads it when deciding whether to
    // purge.
    unsafe {
        if libmimalloc_sys::mi_option_get(PURGE_DELAY) != 1000 {
            return false;
        }
        libmimalloc_sys::mi_option_set(PURGE_DELAY, -1);
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_option_is_the_purge_delay() {
        // SAFETY: reads and sets integer options.
        unsafe {
            assert_eq!(libmimalloc_sys::mi_option_get(PURGE_DELAY), 1000, "mimalloc 3's purge delay default");
            assert!(keep_freed_memory());
            assert_eq!(libmimalloc_sys::mi_option_get(PURGE_DELAY), -1);
        }
    }
}
