//! One-shot kernels with CUDA source on `Backend::CudaSim`: the source compiled by the host C++
//! compiler against the shim and run over its grid on host threads. Nothing here ran on a GPU.

use resident::backend::{self, Backend, Kernel, KernelArg, LaunchConfig};
use resident::memory::{BufferOptions, UnifiedBuffer};
use resident::BackendError;
use resident_engine_cuda::sim::SimError;

fn sim() -> backend::DeviceHandle {
    backend::open(Backend::CudaSim).expect("CudaSim needs a host C++ compiler (g++)")
}

#[test]
fn the_shipped_saxpy_runs_over_a_grid_of_blocks() {
    let d = sim();
    assert_eq!(d.kind(), resident::backend::BackendKind::CudaSim);
    let n = 10_000usize;
    let x: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let mut xb = UnifiedBuffer::from_slice(&d, &x, BufferOptions::default()).unwrap();
    let mut yb = UnifiedBuffer::from_slice(&d, &vec![1.0f32; n], BufferOptions::default()).unwrap();
    let saxpy =
        Kernel::new("saxpy").cuda(resident_cuda::builtin::ELEMENTWISE.code, "resident_saxpy");
    {
        let xv = xb.device().unwrap();
        let mut yv = yb.device_mut().unwrap();
        let args = [
            KernelArg::scalar(2.0f32),
            xv.arg(),
            yv.arg(),
            KernelArg::scalar(n as u64),
        ];
        d.launch(&saxpy, LaunchConfig::for_elements(n as u64), &args, None)
            .unwrap();
    }
    let y = yb.host().unwrap();
    assert!(y
        .iter()
        .enumerate()
        .all(|(i, &v)| v == 2.0 * i as f32 + 1.0));
}

/// Warp shuffles, shared memory, a barrier after most threads exited (they drop out, as PTX
/// specifies), an atomic across blocks.
const BLOCK_SUM: &str = r#"
extern "C" __global__ void block_sum(const unsigned int* in, unsigned int* out, unsigned int n) {
    __shared__ unsigned int warp_sums[32];
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned int v = i < n ? in[i] : 0u;
    for (int d = 16; d > 0; d >>= 1) v += __shfl_down_sync(0xffffffffu, v, d);
    if ((threadIdx.x & 31u) == 0) warp_sums[threadIdx.x >> 5] = v;
    unsigned int odd = __popc(__ballot_sync(0xffffffffu, i < n && (in[i] & 1u)));
    if ((threadIdx.x & 31u) == 0) atomicAdd(out + 1, odd);
    __syncthreads();
    if (threadIdx.x >= 32) return;
    v = threadIdx.x < (blockDim.x >> 5) ? warp_sums[threadIdx.x] : 0u;
    for (int d = 16; d > 0; d >>= 1) v += __shfl_down_sync(0xffffffffu, v, d);
    __syncthreads();
    if (threadIdx.x == 0) atomicAdd(out, v);
}
"#;

#[test]
fn warp_collectives_shared_memory_and_exited_threads() {
    let d = sim();
    let n = 5000u32;
    let input: Vec<u32> = (0..n).map(|i| i * 7 % 1001).collect();
    let mut inb = d.alloc(4 * n as usize).unwrap();
    d.copy_to_device(&mut inb, bytemuck::cast_slice(&input))
        .unwrap();
    let mut outb = d.alloc(8).unwrap();
    let k = Kernel::new("block_sum").cuda(BLOCK_SUM, "block_sum");
    {
        let args = [
            KernelArg::buffer(&inb),
            KernelArg::buffer_mut(&mut outb),
            KernelArg::scalar(n),
        ];
        d.launch(&k, LaunchConfig::new(n.div_ceil(256), 256), &args, None)
            .unwrap();
    }
    let mut got = [0u8; 8];
    d.copy_to_host(&mut got, &outb).unwrap();
    let got: [u32; 2] = bytemuck::cast(got);
    assert_eq!(got[0], input.iter().sum::<u32>());
    assert_eq!(got[1], input.iter().filter(|v| *v & 1 == 1).count() as u32);
}

#[test]
fn launch_errors_are_typed() {
    let d = sim();
    let mut m = d.alloc(16).unwrap();
    // Wrong argument count and sizes: checked against the kernel's C++ signature.
    let k = Kernel::new("fill").cuda(
        resident_cuda::builtin::ELEMENTWISE.code,
        "resident_fill_u32",
    );
    let e = d
        .launch(
            &k,
            LaunchConfig::new(1, 32),
            &[KernelArg::buffer_mut(&mut m)],
            None,
        )
        .unwrap_err();
    assert!(
        matches!(&e, BackendError::Sim(s) if matches!(s.downcast_ref(), Some(SimError::BadLaunch { reason, .. }) if reason.contains("3 arguments"))),
        "{e}"
    );
    let args = [
        KernelArg::buffer_mut(&mut m),
        KernelArg::scalar(1u32),
        KernelArg::scalar(4u32),
    ];
    let e = d
        .launch(&k, LaunchConfig::new(1, 32), &args, None)
        .unwrap_err();
    assert!(
        matches!(&e, BackendError::Sim(s) if matches!(s.downcast_ref(), Some(SimError::BadLaunch { reason, .. }) if reason.contains("argument 2"))),
        "{e}"
    );
    // A trap faults the launch.
    let trap = Kernel::new("trap").cuda(
        "extern \"C\" __global__ void trap(unsigned int* p) { if (blockIdx.x == 1 && threadIdx.x == 5) __trap(); __syncthreads(); p[0] = 1; }",
        "trap",
    );
    let e = d
        .launch(
            &trap,
            LaunchConfig::new(2, 64),
            &[KernelArg::buffer_mut(&mut m)],
            None,
        )
        .unwrap_err();
    assert!(
        matches!(&e, BackendError::Sim(s) if matches!(s.downcast_ref(), Some(SimError::Fault { reason, .. }) if reason.contains("block (1,0,0) thread (5,0,0)"))),
        "{e}"
    );
    // What the shim does not provide is a compile error naming it.
    let lacks = Kernel::new("lacks").cuda(
        "extern \"C\" __global__ void lacks(unsigned int* p) { p[0] = __syncthreads_count(1); }",
        "lacks",
    );
    let e = d
        .launch(
            &lacks,
            LaunchConfig::new(1, 32),
            &[KernelArg::buffer_mut(&mut m)],
            None,
        )
        .unwrap_err();
    assert!(
        matches!(&e, BackendError::Sim(s) if matches!(s.downcast_ref(), Some(SimError::Compile { log, .. }) if log.contains("__syncthreads_count"))),
        "{e}"
    );
    // A source that asks for a file of the host: refused before the compiler runs, quoting
    // nothing of the file.
    let hostile = Kernel::new("hostile").cuda(
        "#include \"/etc/passwd\"\nextern \"C\" __global__ void k(unsigned int* p) { p[0] = 1u; }",
        "k",
    );
    let e = d
        .launch(
            &hostile,
            LaunchConfig::new(1, 32),
            &[KernelArg::buffer_mut(&mut m)],
            None,
        )
        .unwrap_err();
    assert!(
        matches!(&e, BackendError::ForbiddenFile { line: 1, file, .. } if file == "\"/etc/passwd\""),
        "{e}"
    );
    assert!(!e.to_string().contains("root:"), "{e}");
    // No CUDA source at all.
    let cpu_only = Kernel::new("cpu_only").cpu(|_| Ok(()));
    assert!(matches!(
        d.launch(&cpu_only, LaunchConfig::new(1, 1), &[], None),
        Err(BackendError::NoCudaSource { .. })
    ));
}
