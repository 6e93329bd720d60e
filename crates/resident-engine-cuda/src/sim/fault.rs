//! CudaSim's device faults: a hardware fault in a CudaSim kernel's thread (an illegal address,
//! a stack overflow, an integer division by zero, an illegal instruction) faults that kernel's
//! block, as a GPU reports `CUDA_ERROR_ILLEGAL_ADDRESS` and leaves the host running, instead of
//! ending the process.
//!
//! Why in the process, by signals, rather than by running a context's blocks in a child
//! process: the persistent protocol's host half ([`crate::persistent::PersistentQueues`]) and
//! the CudaSim kernels share their queues, control block and state as ordinary host memory
//! (what the strict driver model, the bus model and ThreadSanitizer check), and the external
//! functions of `numba=` handlers are native code of this process called through a pointer. A
//! child process would need every allocation moved into shared mappings at the same addresses
//! and every pointer handed across; a signal handler keeps all of that unchanged and costs
//! nothing while nothing faults. What it does not model is the GPU's separate address space: an
//! out-of-bounds write that lands in mapped host memory is not a fault here (nor, within an
//! allocation's granularity, on a GPU) and corrupts that memory; only an access that the host's
//! MMU refuses is caught.
//!
//! How: the shim (`kernels/sim_shim.h`) gives each thread of a block an alternate signal stack
//! whose first bytes are a [`AltHeader`]: a magic number and, while the thread runs the kernel
//! (and only then), the module's `jump` function. [`install`] sets one process-wide handler
//! for `SIGSEGV`, `SIGBUS`, `SIGFPE`, `SIGILL` and `SIGTRAP` (on the alternate stack, so a
//! stack overflow is caught too). On a signal it asks the kernel which alternate stack the
//! thread runs on (`sigaltstack`, a system call: nothing here allocates, locks or touches
//! thread-local storage), and when that stack's header is armed it calls `jump`, which records
//! the signal and `siglongjmp`s back to the thread's launcher in the shim; the launcher faults
//! the block ([`crate::sim::SimError::Fault`]) and the persistent kernel's launcher poisons the
//! context ([`crate::sim::driver::SimContext::poison`]), sticky until it is reset, as on a GPU.
//! Any other thread's signal goes to the handler that was installed before (Rust's stack
//! overflow report, Python's `faulthandler`, or the default action), exactly as if this one
//! were not there.
//!
//! Not contained: `abort()` and `exit()` (C library calls, not CUDA device functions: a GPU
//! kernel cannot make them, so a handler that does was never valid CUDA) and a fault outside a
//! kernel's code.

use std::ffi::{c_int, c_void};
use std::sync::OnceLock;

/// The magic number at the bottom of a CudaSim thread's alternate signal stack ("resident").
pub const ALT_MAGIC: u64 = 0x7265_7369_6465_6e74;

/// The first bytes of a CudaSim thread's alternate signal stack (the shim's `AltHeader`).
#[repr(C)]
pub struct AltHeader {
    /// [`ALT_MAGIC`].
    pub magic: u64,
    /// While the thread runs kernel code: the module's function that records the signal and
    /// jumps back to the thread's launcher (never returns). Null otherwise.
    pub jump: Option<unsafe extern "C" fn(sig: c_int, addr: *mut c_void, code: c_int) -> !>,
}

/// The signals a CudaSim thread's fault raises.
pub const SIGNALS: [c_int; 5] = [
    libc::SIGSEGV,
    libc::SIGBUS,
    libc::SIGFPE,
    libc::SIGILL,
    libc::SIGTRAP,
];

/// The handlers in place before [`install`], one per [`SIGNALS`] entry.
static PREVIOUS: OnceLock<Result<[libc::sigaction; SIGNALS.len()], i32>> = OnceLock::new();

/// Installs the handler once for the process (every later call returns the first answer):
/// `Err(errno)` when `sigaction` refused, in which case a CudaSim fault ends the process as
/// before. CudaSim calls it before each launch.
pub fn install() -> Result<(), i32> {
    PREVIOUS
        .get_or_init(|| {
            // SAFETY: `sigaction` with a zeroed struct whose handler, mask and flags are set
            // below; `on_signal` only makes async-signal-safe calls (see its comment).
            unsafe {
                let mut previous: [libc::sigaction; SIGNALS.len()] = std::mem::zeroed();
                for (i, &sig) in SIGNALS.iter().enumerate() {
                    let mut act: libc::sigaction = std::mem::zeroed();
                    act.sa_sigaction = on_signal as *const () as usize;
                    act.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
                    libc::sigemptyset(&mut act.sa_mask);
                    if libc::sigaction(sig, &act, &mut previous[i]) != 0 {
                        let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
                        // Put back what was changed: all or nothing.
                        for (j, &s) in SIGNALS.iter().enumerate().take(i) {
                            libc::sigaction(s, &previous[j], std::ptr::null_mut());
                        }
                        return Err(errno);
                    }
                }
                Ok(previous)
            }
        })
        .as_ref()
        .map(|_| ())
        .map_err(|&e| e)
}

/// The process-wide handler. Async-signal-safe: one `sigaltstack` query, two reads of the
/// thread's own alternate stack, and either the shim's jump (which only stores to the thread's
/// already-allocated thread-locals and `siglongjmp`s) or the previous handler.
extern "C" fn on_signal(sig: c_int, info: *mut libc::siginfo_t, uctx: *mut c_void) {
    // SAFETY: `sigaltstack` with a null new stack only reads the thread's current one into
    // `ss`. When it is enabled and at least a header long, its first bytes are readable memory
    // of this thread's alternate stack (the one this handler runs on); a shim thread's start
    // with an `AltHeader` (written before the stack was installed, `jump` set only while the
    // kernel runs on this same thread), any other's with whatever it holds, which the magic
    // number tells apart.
    unsafe {
        let mut ss: libc::stack_t = std::mem::zeroed();
        if libc::sigaltstack(std::ptr::null(), &mut ss) == 0
            && ss.ss_flags & libc::SS_DISABLE == 0
            && !ss.ss_sp.is_null()
            && ss.ss_size >= std::mem::size_of::<AltHeader>()
        {
            let h = ss.ss_sp as *const AltHeader;
            if std::ptr::read_volatile(&(*h).magic) == ALT_MAGIC {
                if let Some(jump) = std::ptr::read_volatile(&(*h).jump) {
                    let (addr, code) = if info.is_null() {
                        (std::ptr::null_mut(), 0)
                    } else {
                        ((*info).si_addr(), (*info).si_code)
                    };
                    jump(sig, addr, code);
                }
            }
        }
        chain(sig, info, uctx);
    }
}

/// Hands the signal to the handler installed before ours. A function is called with the same
/// arguments; the default action (or "ignore") is put back and the handler returns, so the
/// faulting instruction runs again and takes it, as it would have without us.
///
/// # Safety
/// Called from [`on_signal`] with its arguments.
unsafe fn chain(sig: c_int, info: *mut libc::siginfo_t, uctx: *mut c_void) {
    let Some(Ok(previous)) = PREVIOUS.get() else {
        libc::signal(sig, libc::SIG_DFL);
        return;
    };
    let Some(i) = SIGNALS.iter().position(|&s| s == sig) else {
        return;
    };
    let prev = &previous[i];
    let handler = prev.sa_sigaction;
    if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
        libc::sigaction(sig, prev, std::ptr::null_mut());
    } else if prev.sa_flags & libc::SA_SIGINFO != 0 {
        let f: extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void) =
            std::mem::transmute(handler);
        f(sig, info, uctx);
    } else {
        let f: extern "C" fn(c_int) = std::mem::transmute(handler);
        f(sig);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_matches_the_shims() {
        // The shim declares `struct AltHeader { unsigned long long magic; void (*jump)(...); }`.
        assert_eq!(std::mem::size_of::<AltHeader>(), 16);
        assert_eq!(std::mem::offset_of!(AltHeader, jump), 8);
        let shim = crate::sim::SHIM_HEADER;
        assert!(shim.contains("0x7265736964656e74ull"), "the shim's magic");
    }

    #[test]
    fn installing_twice_is_one_install() {
        assert_eq!(install(), Ok(()));
        assert_eq!(install(), Ok(()));
        // SAFETY: reads the current action only.
        let cur = unsafe {
            let mut a: libc::sigaction = std::mem::zeroed();
            libc::sigaction(libc::SIGSEGV, std::ptr::null(), &mut a);
            a
        };
        assert_eq!(cur.sa_sigaction, on_signal as *const () as usize);
    }
}
