//! A handler that faults (a trap, a wild or far write, a stack overflow, an integer division by
//! zero) fails its kernel alone, each in a process of its own; a handler that would assemble a
//! host file is refused, and one using what the shim lacks is a compile error naming it.

use super::*;

#[test]
fn a_trapping_handler_faults_the_block_and_check_reports_it() {
    a_device_fault_on_13_fails_the_kernel_alone(
        "faults::a_trapping_handler_faults_the_block_and_check_reports_it",
        COUNT_OR_TRAP,
        "__trap()",
    );
}

/// Handlers that take a hardware fault on the message 13, each the way a CUDA handler's bug
/// does; a GPU reports each as a device fault (an illegal address, a stack overflow, an
/// illegal instruction) and the host keeps running. Integer division by zero is not a fault on
/// a GPU (it gives an unspecified value); on the host it is SIGFPE, which CudaSim turns into a
/// device fault rather than end the process.
const WILD_WRITE: &str = r#"
__device__ bool handle(ResidentState* s, const ResidentIn* in, ResidentOut* out, const Envelope* e) {
    if (*in == 13ull) *(volatile unsigned long long*)(unsigned long long)(16 + (*in & 1ull)) = 1ull;
    *out = atomicAdd(&s->n, 1ull) + 1ull;
    return true;
}
"#;
const FAR_OUT_OF_BOUNDS: &str = r#"
__device__ bool handle(ResidentState* s, const ResidentIn* in, ResidentOut* out, const Envelope* e) {
    unsigned long long far = *in == 13ull ? (1ull << 40) : 0ull;
    ((volatile ResidentOut*)out)[far] = *in;
    *out = atomicAdd(&s->n, 1ull) + 1ull;
    return true;
}
"#;
const STACK_OVERFLOW: &str = r#"
__device__ __noinline__ unsigned long long deep(unsigned long long n) {
    volatile unsigned char pad[4096];
    pad[n & 4095ull] = (unsigned char)n;
    return n == 0ull ? 0ull : deep(n + 1ull) + pad[(n * 7ull) & 4095ull];
}
__device__ bool handle(ResidentState* s, const ResidentIn* in, ResidentOut* out, const Envelope* e) {
    if (*in == 13ull) *out = deep(1ull);
    *out = atomicAdd(&s->n, 1ull) + 1ull;
    return true;
}
"#;
const DIVIDE_BY_ZERO: &str = r#"
__device__ bool handle(ResidentState* s, const ResidentIn* in, ResidentOut* out, const Envelope* e) {
    volatile unsigned long long d = *in - 13ull;
    *out = 1000ull / d;
    *out = atomicAdd(&s->n, 1ull) + 1ull;
    return true;
}
"#;

/// Runs a kernel whose handler faults on 13 (`__trap()` or a hardware fault) in a batch of 39,
/// and checks what a GPU's fault gives: the kernel is `DeviceFault` with CudaSim's fault (naming `expect`) as its cause, the
/// batch's inputs come back, the context stays lost until it is reset, the process and its
/// other threads keep running, and after the reset a kernel runs again.
fn a_device_fault_on_13_fails_the_kernel_alone(test: &str, handler: &str, expect: &str) {
    let _serial = serial();
    // A fault loses the context for the whole process (as on a GPU): alone, in its own.
    if !resident_engine_cuda::sim::driver::fault_test_in_own_process(test) {
        return;
    }
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    // Another thread of the process works through the fault.
    let ticks = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let worker = {
        let (ticks, stop) = (ticks.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut x = 1u64;
            while !stop.load(Ordering::Relaxed) {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                ticks.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(1));
            }
            x
        })
    };
    let mut q = launch("hwfault", handler, 64, cfg(1, 256, 256));
    q.activate();
    q.send(env(1, 0), 1).unwrap();
    assert_eq!(receive_n(&mut q, 1)[0].payload, 1);
    // Parked while the rest queues up, so the 39 arrive as one batch (batch size 64).
    q.deactivate();
    wait_until("parked", || {
        q.device_counters().state == Some(DeviceState::Idle)
    });
    for i in 2..=40u64 {
        q.send(env(i, 0), if i == 20 { 13 } else { i }).unwrap();
    }
    q.activate();
    let start = Instant::now();
    wait_until("the fault", || q.has_exited());
    assert!(start.elapsed() < Duration::from_secs(10));
    match q.check() {
        Err(e @ PersistentError::DeviceFault { .. }) => {
            let PersistentError::DeviceFault {
                cause: resident_engine_cuda::persistent::FaultCause::Sim(sim),
                ..
            } = &e
            else {
                panic!("expected a CudaSim fault as the cause, got {e:?}")
            };
            assert!(
                matches!(**sim, resident_engine_cuda::sim::SimError::Fault { .. }),
                "{sim:?}"
            );
            // Typed: the cause is CudaSim's own fault of the block, with what faulted in its text.
            let reason = e.to_string();
            assert!(reason.contains(expect), "{reason}");
            assert!(reason.contains("in block (0,0,0) thread ("), "{reason}");
        }
        other => panic!("expected a device fault, got {other:?}"),
    }
    // The batch's inputs come back (the block publishes lane heads only after a whole batch).
    let back = q.reclaim_input().unwrap();
    assert_eq!(back.len(), 39);
    // Sticky until the context is reset: a launch on the lost context is refused.
    let ctx = resident_engine_cuda::sim::driver::SimContext::get();
    assert!(ctx.fault().is_some(), "the context is lost");
    match launch_with("refused", DOUBLE, 32, cfg(1, 64, 64), None) {
        Err(e) => assert!(e.to_string().contains("CUDA_ERROR_LAUNCH_FAILED"), "{e}"),
        Ok(_) => panic!("a launch on a lost context ran"),
    }
    drop(q);
    assert!(
        ctx.recover(T),
        "the context resets once its kernels are gone"
    );
    // The process lived through it: its other thread kept working, and a kernel runs again.
    let before = ticks.load(Ordering::Relaxed);
    let mut again = launch("after-reset", DOUBLE, 32, cfg(1, 64, 64));
    again.activate();
    again.send(env(1, 0), 21).unwrap();
    assert_eq!(receive_n(&mut again, 1)[0].payload, 42);
    again.terminate(T).unwrap();
    wait_until("the other thread", || {
        ticks.load(Ordering::Relaxed) > before
    });
    stop.store(true, Ordering::Relaxed);
    worker.join().unwrap();
}

#[test]
fn a_wild_write_is_a_device_fault_and_the_process_lives() {
    a_device_fault_on_13_fails_the_kernel_alone(
        "faults::a_wild_write_is_a_device_fault_and_the_process_lives",
        WILD_WRITE,
        "an illegal memory access (SIGSEGV, address not mapped at 0x1",
    );
}

#[test]
fn a_far_out_of_bounds_write_is_a_device_fault() {
    a_device_fault_on_13_fails_the_kernel_alone(
        "faults::a_far_out_of_bounds_write_is_a_device_fault",
        FAR_OUT_OF_BOUNDS,
        "an illegal memory access (SIGSEGV",
    );
}

#[test]
fn a_stack_overflow_in_a_handler_is_a_device_fault() {
    a_device_fault_on_13_fails_the_kernel_alone(
        "faults::a_stack_overflow_in_a_handler_is_a_device_fault",
        STACK_OVERFLOW,
        "an illegal memory access (SIGSEGV",
    );
}

#[test]
fn an_integer_division_by_zero_is_a_device_fault() {
    a_device_fault_on_13_fails_the_kernel_alone(
        "faults::an_integer_division_by_zero_is_a_device_fault",
        DIVIDE_BY_ZERO,
        "an arithmetic fault (SIGFPE, integer division by zero",
    );
}

/// Handlers that would have the host's assembler read a file of the host into the kernel
/// (`.incbin`): through `asm` spelled by token pasting (which a scan of the source cannot see),
/// and through a section name carrying a directive. Each is refused before the assembler runs,
/// and no byte of the file reaches the kernel or the error. (The first one read /etc/hostname
/// into a kernel's outputs before the check.)
#[test]
fn a_handler_that_would_assemble_a_host_file_is_refused() {
    let _serial = serial();
    let pasted = r#"
#define PASTE(a, b) a##b
PASTE(as, m)(".section .rodata\n.globl resident_leak\nresident_leak:\n.incbin \"/etc/hostname\"\n.byte 0\n.text\n");
extern "C" const char resident_leak[];
__device__ bool handle(ResidentState* s, const ResidentIn* in, ResidentOut* out, const Envelope* e) {
    *out = (unsigned long long)resident_leak[*in];
    return true;
}
"#;
    let section = r#"
__attribute__((section(".data\n.incbin \"/etc/hostname\"\n#"), used)) static unsigned long long resident_leak = 1;
__device__ bool handle(ResidentState* s, const ResidentIn* in, ResidentOut* out, const Envelope* e) {
    *out = resident_leak + *in;
    return true;
}
"#;
    let host = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
    for (what, handler, expect) in [
        ("pasted", pasted, "inline assembly"),
        ("section", section, "`.incbin`"),
    ] {
        match launch_with(what, handler, 32, cfg(1, 64, 64), None) {
            Err(PersistentError::Sim(
                e @ resident_engine_cuda::sim::SimError::ForbiddenAssembly { .. },
            )) => {
                let text = e.to_string();
                assert!(text.contains(expect), "{what}: {text}");
                let host = host.trim();
                assert!(
                    host.is_empty() || !text.contains(host),
                    "{what} quotes the host: {text}"
                );
            }
            Err(other) => panic!("{what}: expected ForbiddenAssembly, got {other:?}"),
            Ok(_) => panic!("{what}: a handler that reads a host file launched"),
        }
    }
    // The template and an ordinary handler hold neither.
    let mut q = launch("plain", DOUBLE, 32, cfg(1, 64, 64));
    q.activate();
    q.send(env(1, 0), 4).unwrap();
    assert_eq!(receive_n(&mut q, 1)[0].payload, 8);
    q.terminate(T).unwrap();
}

#[test]
fn a_handler_using_what_the_shim_lacks_is_a_compile_error_naming_it() {
    let _serial = serial();
    let src = "__device__ bool handle(ResidentState* s, const ResidentIn* in, ResidentOut* out, const Envelope* e) { \
               *out = __syncthreads_count(*in > 3); return true; }";
    match launch_with("lacks", src, 32, cfg(1, 64, 64), None) {
        Err(PersistentError::Compile { log, arch, .. }) => {
            assert!(log.contains("__syncthreads_count"), "{log}");
            assert!(arch.contains("CudaSim"), "{arch}");
            assert!(
                log.contains("handler.cu:1:"),
                "diagnostics point into the handler's own lines: {log}"
            );
        }
        Err(e) => panic!("expected a compile error, got {e}"),
        Ok(_) => panic!("compiled a handler the shim cannot run"),
    }
}
