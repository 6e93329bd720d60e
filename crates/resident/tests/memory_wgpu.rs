//! Memory and one-shot WGSL kernels on the wgpu backend (lavapipe in CI). Without an adapter
//! each test prints `SKIP:` and returns, unless `RESIDENT_REQUIRE_WGPU=1`, then it fails.

use resident::backend::{
    self, Backend, BackendError, DeviceHandle, Kernel, KernelArg, LaunchConfig,
};
use resident::memory::{
    BufferOptions, BufferState, MemoryError, MemoryPool, PoolKind, UnifiedBuffer,
};

mod common;
use common::wgpu_device;

const SAXPY: &str = r#"
@group(0) @binding(0) var<uniform> a: f32;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> n: vec2<u32>;   // the u64 count: low word, high word

@compute @workgroup_size(64)
fn saxpy(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i < n.x) {
        y[i] = a * x[i] + y[i];
    }
}
"#;

fn saxpy() -> Kernel {
    Kernel::new("saxpy")
        .cuda(resident::cuda::builtin::ELEMENTWISE.code, "resident_saxpy")
        .wgsl(SAXPY, "saxpy")
        .cpu(|t| {
            let a: f32 = t.scalar(0)?;
            let x = t.input::<f32>(1)?;
            let y = t.output::<f32>(2)?;
            y.set(a * x[t.index()] + y.get()?)
        })
}

fn run_saxpy(d: &DeviceHandle, x: &[f32], y: &[f32], cfg: LaunchConfig) -> Vec<f32> {
    let mut xb = UnifiedBuffer::from_slice(d, x, BufferOptions::default()).unwrap();
    let mut yb = UnifiedBuffer::from_slice(d, y, BufferOptions::default()).unwrap();
    {
        let xv = xb.device().unwrap();
        let mut yv = yb.device_mut().unwrap();
        let args = [
            KernelArg::scalar(2.5f32),
            xv.arg(),
            yv.arg(),
            KernelArg::scalar(x.len() as u64),
        ];
        d.launch(&saxpy(), cfg, &args, None).unwrap();
    }
    assert_eq!(yb.state(), BufferState::DeviceDirty);
    yb.host().unwrap().to_vec()
}

#[test]
fn saxpy_through_unified_buffer_matches_the_cpu() {
    let Some(d) = wgpu_device("saxpy_through_unified_buffer_matches_the_cpu") else {
        return;
    };
    let cpu = backend::open(Backend::Cpu).unwrap();
    // Not a multiple of the workgroup size, so the bound check in the shader matters.
    let n = 1000usize;
    let x: Vec<f32> = (0..n).map(|i| (i as f32) * 0.5 - 7.0).collect();
    let y: Vec<f32> = (0..n).map(|i| (i % 13) as f32).collect();
    let want = run_saxpy(&cpu, &x, &y, LaunchConfig::for_elements(n as u64));
    let got = run_saxpy(&d, &x, &y, LaunchConfig::for_elements(n as u64));
    assert_eq!(got, want, "wgpu and CPU saxpy differ");
    // An explicit grid: 16 workgroups of the source's 64 cover 1024 >= 1000.
    let got = run_saxpy(&d, &x, &y, LaunchConfig::new(16, 64));
    assert_eq!(got, want);
    // Too small an explicit grid leaves the tail untouched: the grid really comes from the config.
    let short = run_saxpy(&d, &x, &y, LaunchConfig::new(1, 64));
    assert_eq!(&short[..64], &want[..64]);
    assert_eq!(&short[64..], &y[64..]);
}

#[test]
fn state_machine_and_transfer_counts() {
    let Some(d) = wgpu_device("state_machine_and_transfer_counts") else {
        return;
    };
    assert_eq!(d.kind(), backend::BackendKind::Wgpu);
    assert!(!d.shares_host_memory());
    let mut b = UnifiedBuffer::from_slice(&d, &[1u32, 2, 3], BufferOptions::default()).unwrap();
    assert_eq!(b.state(), BufferState::HostOnly);
    b.sync_to_device().unwrap();
    assert_eq!(b.state(), BufferState::Synchronized);
    b.device_mut().unwrap();
    assert_eq!(b.state(), BufferState::DeviceDirty);
    b.host_mut().unwrap()[1] = 20;
    assert_eq!(b.state(), BufferState::HostDirty);
    b.device().unwrap();
    assert_eq!(b.state(), BufferState::Synchronized);
    let s = d.create_stream().unwrap();
    b.host_mut().unwrap()[2] = 30;
    b.sync_to_device_async(&s).unwrap();
    b.device_mut().unwrap();
    assert_eq!(b.host().unwrap(), &[1, 20, 30]);
    let t = b.transfers();
    // to device: sync, device() after host_mut, async sync; to host: host_mut, host().
    assert_eq!((t.to_device, t.to_host), (3, 2));
    assert_eq!(t.to_device_bytes, 36);
    // An odd byte count round-trips (copies are padded to 4 bytes on the device).
    let mut odd = UnifiedBuffer::from_slice(&d, b"hello", BufferOptions::pinned()).unwrap();
    odd.sync_to_device().unwrap();
    odd.device_mut().unwrap();
    assert_eq!(odd.host().unwrap(), b"hello");
    let mut u = UnifiedBuffer::<f32>::new(&d, 4, BufferOptions::default()).unwrap();
    assert!(matches!(
        u.host(),
        Err(MemoryError::Uninitialized { len: 4 })
    ));
    u.device_mut().unwrap();
    assert_eq!(u.host().unwrap(), &[0.0; 4], "device memory starts zeroed");
}

#[test]
fn pool_recycles_wgpu_buffers() {
    let Some(d) = wgpu_device("pool_recycles_wgpu_buffers") else {
        return;
    };
    let pool = MemoryPool::new(&d, PoolKind::Device, None);
    {
        let _a = pool.acquire(1000).unwrap();
    }
    let _b = pool.acquire(900).unwrap();
    let s = pool.stats();
    assert_eq!((s.hits, s.misses), (1, 1));
    assert_eq!(s.live_bytes, 1024);
    pool.trim();
}

#[test]
fn oversize_buffer_is_a_typed_error() {
    let Some(d) = wgpu_device("oversize_buffer_is_a_typed_error") else {
        return;
    };
    let mut b = UnifiedBuffer::<u8>::new(&d, 1usize << 40, BufferOptions::default()).unwrap();
    match b.device_mut() {
        Err(MemoryError::AllocFailed {
            source:
                BackendError::WgpuLimit {
                    limit,
                    requested,
                    max,
                },
            ..
        }) => {
            assert!(limit == "max_buffer_size" || limit == "max_storage_buffer_binding_size");
            assert!(requested > max);
        }
        other => panic!("expected a WgpuLimit, got {:?}", other.err()),
    }
    assert_eq!(b.state(), BufferState::Uninitialized);
}

#[test]
fn kernel_errors_are_typed() {
    let Some(d) = wgpu_device("kernel_errors_are_typed") else {
        return;
    };
    let mut m = d.alloc(64).unwrap();
    // A compile error names the line.
    let broken = Kernel::new("broken").wgsl(
        "@compute @workgroup_size(1)\nfn main() {\n  let x = ;\n}\n",
        "main",
    );
    match d.launch(&broken, LaunchConfig::new(1, 1), &[], None) {
        Err(BackendError::WgslCompile { kernel, source }) => {
            assert_eq!(kernel, "broken");
            assert_eq!(source.line, Some(3), "{source}");
        }
        other => panic!("expected WgslCompile, got {other:?}"),
    }
    // A workgroup past the adapter's limit.
    let huge =
        Kernel::new("huge").wgsl("@compute @workgroup_size(1024, 1024) fn main() {}", "main");
    assert!(matches!(
        d.launch(&huge, LaunchConfig::new(1, 1), &[], None),
        Err(BackendError::WgpuLimit {
            limit: "max_compute_workgroup_size_y",
            ..
        }) | Err(BackendError::WgpuLimit {
            limit: "max_compute_invocations_per_workgroup",
            ..
        })
    ));
    // Too many workgroups.
    let one = Kernel::new("one").wgsl("@compute @workgroup_size(1) fn main() {}", "main");
    assert!(matches!(
        d.launch(&one, LaunchConfig::new(u32::MAX, 1), &[], None),
        Err(BackendError::WgpuLimit {
            limit: "max_compute_workgroups_per_dimension",
            ..
        })
    ));
    // A missing entry point, a missing WGSL form, and argument mismatches.
    let wrong_entry = Kernel::new("e").wgsl("@compute @workgroup_size(1) fn main() {}", "other");
    assert!(matches!(
        d.launch(&wrong_entry, LaunchConfig::new(1, 1), &[], None),
        Err(BackendError::WgslCompile { .. })
    ));
    let cpu_only = Kernel::new("cpu_only").cpu(|_| Ok(()));
    assert!(matches!(
        d.launch(&cpu_only, LaunchConfig::new(1, 1), &[], None),
        Err(BackendError::NoWgslSource { .. })
    ));
    let args = [KernelArg::buffer_mut(&mut m)];
    match d.launch(&saxpy(), LaunchConfig::new(1, 64), &args, None) {
        Err(BackendError::BadArgument { .. }) => {}
        other => panic!("expected BadArgument, got {other:?}"),
    }
    let ro = Kernel::new("ro").wgsl(
        "@group(0) @binding(0) var<storage, read> x: array<u32>;\n\
         @compute @workgroup_size(1) fn main() { _ = x[0]; }",
        "main",
    );
    match d.launch(
        &ro,
        LaunchConfig::new(1, 1),
        &[KernelArg::scalar(1u32)],
        None,
    ) {
        Err(BackendError::BadArgument { index: 0, reason }) => {
            assert!(reason.contains("var<storage, read>"), "{reason}")
        }
        other => panic!("expected BadArgument, got {other:?}"),
    }
    // Memory of another backend is refused.
    let cpu = backend::open(Backend::Cpu).unwrap();
    let mut host = cpu.alloc(64).unwrap();
    assert!(matches!(
        d.copy_to_device(&mut host, &[0u8; 64]),
        Err(BackendError::WrongBackend { .. })
    ));
    // And the device still works after all of that.
    let n = 100usize;
    let x = vec![1.0f32; n];
    let y = vec![2.0f32; n];
    assert!(run_saxpy(&d, &x, &y, LaunchConfig::for_elements(n as u64))
        .iter()
        .all(|&v| v == 4.5));
}
