//! Starting a read from memory early, so that several cache misses overlap.
//!
//! The cache's time goes to cache misses on data far larger than the caches:
//! filter lines and the keys of sealed blocks. Where the next addresses are
//! known ahead (the lines of the hashes further on in a flush, the next key
//! of every pending search), fetching them all before using any lets the
//! memory system serve them together instead of one after another.

/// Starts bringing `place` into the cache.
///
/// On x86_64 that is a prefetch, which retires at once and never stalls.
/// WebAssembly has no prefetch, so elsewhere it is a plain load whose value
/// is thrown away: it holds its place in the core until the data arrives,
/// but loads issued back to back are overlapped by out-of-order execution,
/// where code that needs each value before computing the next address would
/// wait for them in turn.
#[inline(always)]
pub fn fetch<T: Copy>(place: &T) {
    #[cfg(target_arch = "x86_64")]
    {
        use core::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        let pointer: *const T = place;
        // SAFETY: `_mm_prefetch` needs SSE, which every x86_64 CPU has (it is
        // in the target's baseline). A prefetch is a hint that never faults
        // and reads nothing into the program, and the pointer comes from a
        // live reference anyway.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(pointer.cast::<i8>()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let pointer: *const T = place;
        // SAFETY: the pointer comes from a live shared reference, so it is
        // aligned and valid for a read. The read is volatile only so that
        // the compiler keeps a load whose value nobody uses.
        let _ = unsafe { core::ptr::read_volatile(pointer) };
    }
}
