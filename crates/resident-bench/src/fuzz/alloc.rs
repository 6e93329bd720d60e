//! A counting global allocator: the peak of the bytes one input's decoding holds at once.
//!
//! A binary that fuzzes installs it (`#[global_allocator] static A: CountingAlloc =
//! CountingAlloc;`); it counts only on a thread that [`begin`]s a measurement, in a
//! thread-local (parallel tests do not disturb each other), and costs one thread-local read
//! per allocation otherwise. Without it installed the harness reports no allocation figures.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// The system allocator, counting the bytes a measuring thread allocates (see the module).
#[derive(Clone, Copy, Debug, Default)]
pub struct CountingAlloc;

thread_local! {
    static ARMED: Cell<bool> = const { Cell::new(false) };
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn count(delta: isize) {
    let _ = ARMED.try_with(|armed| {
        if armed.get() {
            let _ = LIVE.try_with(|live| {
                let now = live.get().saturating_add(delta);
                live.set(now);
                let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
            });
        }
    });
}

// SAFETY: every call goes to `System` unchanged; the counting touches only thread-locals of
// `Cell`s with const initialisers (no allocation, no destructor, no re-entry).
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            count(layout.size() as isize);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            count(layout.size() as isize);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) };
        count(-(layout.size() as isize));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            count(new_size as isize - layout.size() as isize);
        }
        p
    }
}

/// Starts measuring on this thread (the live count and the peak from zero).
pub fn begin() {
    LIVE.with(|l| l.set(0));
    PEAK.with(|p| p.set(0));
    ARMED.with(|a| a.set(true));
}

/// Stops measuring on this thread: the most bytes held at once since [`begin`] (allocated
/// since then and not yet freed; memory freed that was allocated before counts nothing).
pub fn end() -> usize {
    ARMED.with(|a| a.set(false));
    PEAK.with(|p| p.get().max(0) as usize)
}

/// Whether [`CountingAlloc`] is this process's global allocator (it counts a test allocation).
pub fn installed() -> bool {
    begin();
    let b = std::hint::black_box(Box::new([0u8; 64]));
    drop(b);
    end() >= 64
}
