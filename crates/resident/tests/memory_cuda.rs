//! Memory and kernels on the CUDA backend; skips visibly without a device.

use resident::backend::{self, Backend, Kernel, KernelArg, LaunchConfig};
use resident::memory::{BufferOptions, BufferState, MemoryPool, PoolKind, UnifiedBuffer};

fn cuda(test: &str) -> Option<backend::DeviceHandle> {
    match backend::open(Backend::Cuda) {
        Ok(d) => Some(d),
        Err(e) => {
            if std::env::var("RESIDENT_REQUIRE_GPU").as_deref() == Ok("1") {
                panic!("{test}: RESIDENT_REQUIRE_GPU=1 but: {e}");
            }
            eprintln!("SKIP: no CUDA device: {test}: {e}");
            None
        }
    }
}

#[test]
fn unified_buffer_copies_only_when_dirty() {
    let Some(d) = cuda("unified_buffer_copies_only_when_dirty") else {
        return;
    };
    for opts in [BufferOptions::default(), BufferOptions::pinned()] {
        let n = 4096usize;
        let x: Vec<f32> = (0..n).map(|i| i as f32).collect();
        let mut xb = UnifiedBuffer::from_slice(&d, &x, opts).unwrap();
        let mut yb = UnifiedBuffer::from_slice(&d, &vec![1.0f32; n], opts).unwrap();
        let k =
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
            d.launch(&k, LaunchConfig::for_elements(n as u64), &args, None)
                .unwrap();
        }
        xb.device().unwrap(); // already current: no copy
        assert_eq!(xb.transfers().to_device, 1);
        assert_eq!(yb.state(), BufferState::DeviceDirty);
        let y = yb.host().unwrap().to_vec();
        assert!(y
            .iter()
            .enumerate()
            .all(|(i, &v)| v == 2.0 * i as f32 + 1.0));
        yb.host().unwrap();
        assert_eq!(yb.transfers().to_host, 1);
        assert_eq!(xb.is_pinned(), opts.pinned);
        let s = d.create_stream().unwrap();
        yb.host_mut().unwrap()[0] = 5.0;
        yb.sync_to_device_async(&s).unwrap();
        yb.device_mut().unwrap();
        yb.sync_to_host_async(&s).unwrap();
        assert_eq!(yb.host().unwrap()[0], 5.0);
    }
}

#[test]
fn pools_on_cuda() {
    let Some(d) = cuda("pools_on_cuda") else {
        return;
    };
    for kind in [PoolKind::Device, PoolKind::PinnedHost] {
        let pool = MemoryPool::new(&d, kind, Some(1 << 20));
        drop(pool.acquire(100_000).unwrap());
        let _b = pool.acquire(70_000).unwrap();
        assert_eq!(pool.stats().hits, 1);
    }
}
