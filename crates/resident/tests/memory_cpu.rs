//! Memory and kernels on the CPU backend (always available).

use resident::backend::{self, launch_cpu, Backend, Kernel, KernelArg, LaunchConfig};
use resident::memory::{
    BufferOptions, BufferState, MemoryError, MemoryPool, PoolKind, UnifiedBuffer,
};
use std::sync::atomic::{AtomicU64, Ordering};

fn cpu() -> backend::DeviceHandle {
    backend::open(Backend::Cpu).unwrap()
}

#[test]
fn cpu_device_view_is_host_memory_and_nothing_is_copied() {
    let d = cpu();
    let mut b = UnifiedBuffer::from_slice(&d, &[1u32, 2, 3, 4], BufferOptions::default()).unwrap();
    assert_eq!(b.state(), BufferState::HostOnly);
    let host_addr = b.host().unwrap().as_ptr() as u64;
    let dev_addr = b.device().unwrap().address();
    assert_eq!(host_addr, dev_addr, "the device view is the host memory");
    assert_eq!(b.state(), BufferState::Synchronized);
    b.device_mut().unwrap();
    assert_eq!(b.state(), BufferState::DeviceDirty);
    assert_eq!(b.host().unwrap(), &[1, 2, 3, 4]);
    assert_eq!(b.state(), BufferState::Synchronized);
    b.host_mut().unwrap()[0] = 9;
    assert_eq!(b.state(), BufferState::HostDirty);
    b.sync_to_device().unwrap();
    b.sync_to_host().unwrap();
    let s = backend::open(Backend::Cpu)
        .unwrap()
        .create_stream()
        .unwrap();
    b.sync_to_device_async(&s).unwrap();
    let t = b.transfers();
    assert_eq!(
        (t.to_device, t.to_host, t.to_device_bytes, t.to_host_bytes),
        (0, 0, 0, 0)
    );
}

#[test]
fn state_machine_and_typed_errors() {
    let d = cpu();
    let mut b = UnifiedBuffer::<f32>::new(&d, 8, BufferOptions::default()).unwrap();
    assert_eq!(b.state(), BufferState::Uninitialized);
    assert!(matches!(
        b.host(),
        Err(MemoryError::Uninitialized { len: 8 })
    ));
    assert!(matches!(b.device(), Err(MemoryError::Uninitialized { .. })));
    assert!(matches!(
        b.sync_to_device(),
        Err(MemoryError::NothingToSync { .. })
    ));
    assert!(matches!(
        b.sync_to_host(),
        Err(MemoryError::NothingToSync { .. })
    ));
    b.device_mut().unwrap();
    assert_eq!(b.state(), BufferState::DeviceOnly);
    assert_eq!(b.host().unwrap(), &[0.0; 8]);
    assert_eq!(b.state(), BufferState::Synchronized);

    let mut c = UnifiedBuffer::<u8>::new(&d, 4, BufferOptions::pinned()).unwrap();
    c.host_mut().unwrap().copy_from_slice(b"abcd");
    assert_eq!(c.state(), BufferState::HostOnly);
    assert_eq!(c.host().unwrap(), b"abcd");
    c.sync_to_device().unwrap();
    assert_eq!(c.state(), BufferState::Synchronized);
    assert!(matches!(
        UnifiedBuffer::<u64>::new(&d, usize::MAX, BufferOptions::default()),
        Err(MemoryError::TooLarge { .. })
    ));
}

fn saxpy() -> Kernel {
    Kernel::new("saxpy")
        .cuda(resident_cuda::builtin::ELEMENTWISE.code, "resident_saxpy")
        .cpu(|t| {
            let a: f32 = t.scalar(0)?;
            let x = t.input::<f32>(1)?;
            let y = t.output::<f32>(2)?;
            y.set(a * x[t.index()] + y.get()?)
        })
}

#[test]
fn one_kernel_description_runs_on_cpu() {
    let d = cpu();
    let n = 10_000usize;
    let x: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let mut xb = UnifiedBuffer::from_slice(&d, &x, BufferOptions::default()).unwrap();
    let mut yb = UnifiedBuffer::from_slice(&d, &vec![1.0f32; n], BufferOptions::default()).unwrap();
    {
        let xv = xb.device().unwrap();
        let mut yv = yb.device_mut().unwrap();
        let args = [
            KernelArg::scalar(2.0f32),
            xv.arg(),
            yv.arg(),
            KernelArg::scalar(n as u64),
        ];
        d.launch(&saxpy(), LaunchConfig::for_elements(n as u64), &args, None)
            .unwrap();
    }
    assert_eq!(yb.state(), BufferState::DeviceDirty);
    let y = yb.host().unwrap();
    assert!(y
        .iter()
        .enumerate()
        .all(|(i, &v)| v == 2.0 * i as f32 + 1.0));
    assert_eq!(yb.transfers().to_host, 0);
}

#[test]
fn kernel_argument_errors_are_typed() {
    let d = cpu();
    let mut m = d.alloc(16).unwrap();
    let no_cpu = Kernel::new("gpu_only").cuda("extern \"C\" __global__ void k() {}", "k");
    assert!(matches!(
        d.launch(&no_cpu, LaunchConfig::new(1, 1), &[], None),
        Err(resident::BackendError::NoCpuImplementation { .. })
    ));
    let k = Kernel::new("reads_wrong").cpu(|t| t.input::<u32>(0).map(|_| ()));
    let args = [KernelArg::buffer_mut(&mut m)];
    assert!(matches!(
        d.launch(&k, LaunchConfig::new(1, 1), &args, None),
        Err(resident::BackendError::BadArgument { index: 0, .. })
    ));
    // Out of bounds: 16 bytes hold 4 u32, the launch covers 5 indices.
    let k = Kernel::new("oob").cpu(|t| t.output::<u32>(0)?.set(1));
    let args = [KernelArg::buffer_mut(&mut m)];
    assert!(d
        .launch(&k, LaunchConfig::for_elements(5), &args, None)
        .is_err());
}

#[test]
fn launch_cpu_covers_the_index_space_once() {
    let n = 123_457u64;
    let hits: Vec<AtomicU64> = (0..n).map(|_| AtomicU64::new(0)).collect();
    launch_cpu(LaunchConfig::for_elements(n), |i| {
        hits[i].fetch_add(1, Ordering::Relaxed);
    });
    assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
    let count = AtomicU64::new(0);
    launch_cpu(LaunchConfig::new(3, 64), |_| {
        count.fetch_add(1, Ordering::Relaxed);
    });
    assert_eq!(count.into_inner(), 192);
}

#[test]
fn pool_recycles_by_size_class() {
    let d = cpu();
    for kind in [PoolKind::Device, PoolKind::PinnedHost] {
        let pool = MemoryPool::new(&d, kind, None);
        let a = pool.acquire(1000).unwrap();
        assert_eq!((a.len(), a.capacity()), (1000, 1024));
        drop(a);
        let s = pool.stats();
        assert_eq!(
            (s.hits, s.misses, s.live_bytes, s.pooled_bytes),
            (0, 1, 0, 1024)
        );
        let b = pool.acquire(600).unwrap(); // same class
        assert_eq!(pool.stats().hits, 1);
        let c = pool.acquire(10).unwrap(); // class 256
        assert_eq!(c.capacity(), 256);
        let s = pool.stats();
        assert_eq!((s.misses, s.live_bytes, s.pooled_bytes), (2, 1280, 0));
        assert_eq!(s.high_water_bytes, 1280);
        match kind {
            PoolKind::Device => assert!(b.device_memory().is_some() && b.host_bytes().is_none()),
            PoolKind::PinnedHost => assert_eq!(b.host_bytes().unwrap().len(), 600),
        }
        drop((b, c));
        assert_eq!(pool.trim(), 1280);
        assert_eq!(pool.stats().pooled_bytes, 0);
    }
}

#[test]
fn pool_limit_frees_idle_then_refuses() {
    let d = cpu();
    let pool = MemoryPool::new(&d, PoolKind::Device, Some(4096));
    let a = pool.acquire(2048).unwrap();
    drop(pool.acquire(1024).unwrap()); // idle 1024
                                       // 2048 live + 1024 idle + 2048 new > 4096: the idle buffer is freed to make room.
    let b = pool.acquire(1500).unwrap();
    assert_eq!(pool.stats().pooled_bytes, 0);
    match pool.acquire(1) {
        Err(MemoryError::PoolLimitExceeded {
            limit: 4096,
            in_use: 4096,
            requested: 256,
        }) => {}
        other => panic!("expected PoolLimitExceeded, got {other:?}"),
    }
    drop((a, b));
    assert!(pool.acquire(4096).is_ok());
}
