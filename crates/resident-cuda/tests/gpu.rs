//! Tests that need a CUDA device. Each skips with a visible `SKIP:` line when none works
//! (run with `--nocapture` to see it), and fails instead when `RESIDENT_REQUIRE_GPU=1`.

use resident_cuda::builtin::{ELEMENTWISE, SPIN};
use resident_cuda::{
    devices, driver_present, CudaError, Device, DeviceBuffer, DoubleBuffer, KernelParams,
    LaunchConfig, PinnedBuffer, PinnedMemory, Stream,
};
use std::sync::Arc;

fn gpu(test: &str) -> Option<Arc<Device>> {
    match Device::open(0) {
        Ok(d) => Some(d),
        Err(e) => {
            if std::env::var("RESIDENT_REQUIRE_GPU").as_deref() == Ok("1") {
                panic!("{test}: RESIDENT_REQUIRE_GPU=1 but no CUDA device: {e}");
            }
            eprintln!("SKIP: no CUDA device: {test}: {e}");
            None
        }
    }
}

#[test]
fn discovery_without_driver_is_a_typed_error() {
    let r = devices();
    if driver_present() {
        let list = r.expect("a driver is present, so discovery must succeed");
        assert!(!list.is_empty());
        assert!(list[0].sm_count > 0 && list[0].total_memory > 0);
    } else {
        assert!(matches!(r, Err(CudaError::DriverNotFound)), "{r:?}");
        assert!(matches!(Device::open(0), Err(CudaError::DriverNotFound)));
    }
}

#[test]
fn pinned_memory_is_mapped_and_hosts_a_ring() {
    let Some(dev) = gpu("pinned_memory_is_mapped_and_hosts_a_ring") else {
        return;
    };
    let mem = PinnedMemory::new(&dev, 1 << 16).unwrap();
    assert_eq!(mem.as_ptr() as usize % 128, 0);
    assert_ne!(mem.device_ptr(), 0);
    assert!(mem.as_bytes().iter().all(|&b| b == 0));
    // SAFETY: fresh pinned memory, used by this ring only.
    let (mut tx, mut rx) =
        unsafe { resident_ring::spsc::Ring::<u64>::with_memory(64, Box::new(mem)) }.unwrap();
    tx.push(42).unwrap();
    assert_eq!(rx.pop(), Some(42));
}

#[test]
fn kernel_roundtrip_with_occupancy_launch() {
    let Some(dev) = gpu("kernel_roundtrip_with_occupancy_launch") else {
        return;
    };
    let n = 100_003usize;
    let f = dev
        .kernel(ELEMENTWISE.code, "resident_iota_u32", &[], None)
        .unwrap();
    assert_eq!(dev.loaded_modules(), 1);
    let again = dev.kernel(ELEMENTWISE.code, "resident_fill_u32", &[], None);
    assert!(again.is_ok());
    assert_eq!(dev.loaded_modules(), 1, "same source reuses the module");
    let buf = DeviceBuffer::zeroed(&dev, n * 4).unwrap();
    let stream = Stream::new(&dev).unwrap();
    let mut p = KernelParams::new();
    p.push_ptr(buf.device_ptr()).push(n as u64).unwrap();
    let cfg = LaunchConfig::for_elements(n as u64);
    let resolved = f.resolve(cfg).unwrap();
    assert!(resolved.threads() >= n as u64);
    // SAFETY: params match `resident_iota_u32(unsigned*, unsigned long long)`; `buf` outlives
    // the synchronize below.
    unsafe { f.launch(cfg, &stream, &mut p).unwrap() };
    stream.synchronize().unwrap();
    let mut host = vec![0u8; n * 4];
    buf.copy_to_host(&mut host).unwrap();
    let v: &[u32] = bytemuck::cast_slice(&host);
    assert!(v.iter().enumerate().all(|(i, &x)| x == i as u32));
}

#[test]
fn events_time_work() {
    let Some(dev) = gpu("events_time_work") else {
        return;
    };
    let s = Stream::new(&dev).unwrap();
    let a = s.record().unwrap();
    let f = dev.kernel(SPIN.code, "resident_spin", &[], None).unwrap();
    let buf = DeviceBuffer::zeroed(&dev, 4).unwrap();
    let mut p = KernelParams::new();
    p.push_ptr(buf.device_ptr())
        .push(1u64)
        .unwrap()
        .push(10_000_000i64)
        .unwrap();
    // SAFETY: params match `resident_spin`; `buf` outlives the synchronize in `elapsed_ms`.
    unsafe { f.launch(LaunchConfig::new(1, 1), &s, &mut p).unwrap() };
    let b = s.record().unwrap();
    let ms = a.elapsed_ms(&b).unwrap();
    assert!(ms > 0.5, "10M cycles took {ms} ms");
}

#[test]
fn double_buffer_overlaps_copy_and_compute() {
    let Some(dev) = gpu("double_buffer_overlaps_copy_and_compute") else {
        return;
    };
    let bytes = 32 << 20;
    let batches: Vec<PinnedBuffer<u8>> = (0..8)
        .map(|_| PinnedBuffer::zeroed(&dev, bytes).unwrap())
        .collect();
    let refs: Vec<&PinnedMemory> = batches.iter().map(|b| b.memory()).collect();
    let spin = dev.kernel(SPIN.code, "resident_spin", &[], None).unwrap();
    let mut db = DoubleBuffer::new(&dev, bytes).unwrap();
    // Calibrate the spin so one compute takes about as long as one copy.
    let probe = db
        .run(&refs[..1], |s, buf, _| {
            let mut p = KernelParams::new();
            p.push_ptr(buf.device_ptr())
                .push(1u64)?
                .push(1_000_000i64)?;
            // SAFETY: params match `resident_spin`; the buffer outlives `run`.
            unsafe { spin.launch(LaunchConfig::new(1, 32), s, &mut p) }
        })
        .unwrap();
    let cycles = (1_000_000.0 * probe.copy_ms / probe.compute_ms.max(1e-3)) as i64;
    let t = db
        .run(&refs, |s, buf, _| {
            let mut p = KernelParams::new();
            p.push_ptr(buf.device_ptr()).push(1u64)?.push(cycles)?;
            // SAFETY: as above.
            unsafe { spin.launch(LaunchConfig::new(1, 32), s, &mut p) }
        })
        .unwrap();
    eprintln!("overlap: {t:?}, ratio {:.2}", t.overlap_ratio());
    assert!(
        t.overlap_ratio() < 0.8,
        "total {} ms is not well under copy {} + compute {} ms",
        t.total_ms,
        t.copy_ms,
        t.compute_ms
    );
}

#[test]
fn telemetry_reads_or_errors_cleanly() {
    match resident_cuda::telemetry::read_all() {
        Ok(list) => {
            if driver_present() {
                assert!(!list.is_empty());
            }
        }
        Err(e) => {
            assert!(matches!(e, CudaError::Nvml { .. }), "{e:?}");
            eprintln!("SKIP: telemetry: {e}");
        }
    }
}
