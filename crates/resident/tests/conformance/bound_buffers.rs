//! Bound buffers on every backend: one kernel whose handler reads one bound buffer and writes
//! another, given once as a Rust closure, CUDA C and WGSL (as the suite's standard kernel is),
//! with buffers made on the runtime's own device (`Runtime::device`). Checked on each backend:
//! where the handler runs (a device runtime that ran it on a host thread fails), the handler's
//! writes are what host reads see once its replies are in (`read_buffer` is synchronized with
//! the kernel's batches), host writes reach the handler's next batch, a bound buffer's length
//! bounds the handler, bindings that do not match (element type, name) are typed errors, and
//! nothing of the kernel holds the buffers once it is terminated and its handle dropped.
//!
//! A module of the suite (`main.rs`); one `backends!` line per engine at the bottom, like the
//! suite's own.

use std::sync::Arc;

use resident::memory::BufferOptions;
use resident::UnifiedBuffer;

use super::*;

device_message! {
    /// Add `add` and `src[index]` to `acc[index]`.
    pub struct Op { pub index: u32, pub add: u32 }
}

device_message! {
    /// `acc[index]` after the message (`ok == 0`: the index is past a buffer, nothing written).
    #[derive(PartialEq, Eq)]
    pub struct Got { pub index: u32, pub ok: u32, pub value: u32, pub pad: u32 }
}

/// Elements of each buffer.
const N: u32 = 64;

const CUDA_SRC: &str = r#"
__device__ bool handle(ResidentState* s, const ResidentIn* in, ResidentOut* out, const Envelope* env,
                       ResidentBuffers* b) {
    unsigned int i = in->index;
    out->index = i;
    out->pad = 0u;
    if (i >= b->src_len || i >= b->acc_len) { out->ok = 0u; out->value = 0u; return true; }
    unsigned int v = b->acc[i] + b->src[i] + in->add;
    b->acc[i] = v;
    out->ok = 1u;
    out->value = v;
    return true;
}
"#;

const WGSL_SRC: &str = r#"
fn handle(m: ResidentIn, out: ptr<function, ResidentOut>, env: Envelope) -> bool {
    (*out).index = m.index;
    (*out).pad = 0u;
    if (m.index >= src_len || m.index >= acc_len) {
        (*out).ok = 0u;
        (*out).value = 0u;
        return true;
    }
    let v = acc[m.index] + src[m.index] + m.add;
    acc[m.index] = v;
    (*out).ok = 1u;
    (*out).value = v;
    return true;
}
"#;

fn host_handler(ctx: &mut Context<()>, m: Op) -> Option<Got> {
    let src = ctx.buffer::<u32>("src").ok()?;
    let mut acc = ctx.buffer_mut::<u32>("acc").ok()?;
    let i = m.index as usize;
    if i >= src.len() || i >= acc.len() {
        return Some(Got {
            index: m.index,
            ok: 0,
            value: 0,
            pad: 0,
        });
    }
    let v = acc[i].wrapping_add(src[i]).wrapping_add(m.add);
    acc[i] = v;
    Some(Got {
        index: m.index,
        ok: 1,
        value: v,
        pad: 0,
    })
}

fn buf(d: &resident::backend::DeviceHandle, v: &[u32]) -> UnifiedBuffer<u32> {
    UnifiedBuffer::from_slice(d, v, BufferOptions::default()).unwrap()
}

/// The kernel, defined once for every backend: `src` (read) and `acc` (read and written).
fn accumulate(id: &str, src: UnifiedBuffer<u32>, acc: UnifiedBuffer<u32>) -> RingKernel<Op, Got> {
    RingKernel::<Op, Got>::new(id)
        .queue_size(256)
        .bind("src", src)
        .bind("acc", acc)
        .handler(host_handler)
        .cuda(
            CudaHandler::new(CUDA_SRC)
                .buffer::<u32>("src")
                .buffer::<u32>("acc"),
        )
        .wgsl(WgslHandler::new(WGSL_SRC))
}

fn src_values() -> Vec<u32> {
    (0..N).map(|i| i * 10).collect()
}

/// The handler reads `src` and writes `acc`; host reads see its writes, host writes reach it,
/// a buffer's length bounds it; the buffers come from the runtime's own device and nothing
/// holds them once the kernel is terminated and its handle dropped.
fn read_write(t: &dyn Target) {
    // Not beside the keyed case on CudaSim (see `cudasim_exclusive`).
    let _apart = cudasim_exclusive(t);
    let rt = rt(t);
    let d = rt.device().unwrap();
    assert!(
        Arc::ptr_eq(&d, &rt.device().unwrap()),
        "one device per runtime"
    );
    let baseline = Arc::strong_count(&d);
    let k = rt
        .launch(accumulate(
            "bound",
            buf(&d, &src_values()),
            buf(&d, &[0; N as usize]),
        ))
        .unwrap();
    assert_eq!(
        k.placement(),
        t.placement(),
        "{}: where the handler runs",
        t.name()
    );
    assert!(
        Arc::strong_count(&d) > baseline,
        "the bound buffers hold the runtime's device"
    );
    k.activate().unwrap();

    // Sends, not calls: the handler's writes are in `acc` once every reply is in.
    for i in 0..N {
        k.send(Op { index: i, add: 1 }).unwrap();
    }
    let mut got: Vec<Got> = (0..N).map(|_| k.receive(T).unwrap()).collect();
    got.sort_by_key(|g| g.index);
    for (i, g) in got.iter().enumerate() {
        let want = i as u32 * 10 + 1;
        assert_eq!(
            (g.index, g.ok, g.value),
            (i as u32, 1, want),
            "{}",
            t.name()
        );
    }
    let acc = k.read_buffer::<u32>("acc", T).unwrap().to_vec();
    let want: Vec<u32> = (0..N).map(|i| i * 10 + 1).collect();
    assert_eq!(
        acc,
        want,
        "{}: the host reads the handler's writes",
        t.name()
    );
    assert_eq!(
        k.read_buffer::<u32>("src", T).unwrap().to_vec(),
        src_values(),
        "{}: the handler only read `src`",
        t.name()
    );

    // A host write reaches the handler's next batch.
    {
        let mut w = k.write_buffer::<u32>("src", T).unwrap();
        w[3] = 1000;
        w[60] = 7;
        w.commit().unwrap();
    }
    let r = k.call(Op { index: 3, add: 0 }, T).unwrap();
    assert_eq!((r.ok, r.value), (1, 31 + 1000), "{}", t.name());
    let r = k.call(Op { index: 60, add: 5 }, T).unwrap();
    assert_eq!((r.ok, r.value), (1, 601 + 7 + 5), "{}", t.name());
    // And a host write to the buffer the handler writes: it continues from the host's values.
    k.write_buffer::<u32>("acc", T).unwrap()[0] = 500;
    let r = k.call(Op { index: 0, add: 2 }, T).unwrap();
    assert_eq!((r.ok, r.value), (1, 502), "{}", t.name());

    // The buffers' length bounds the handler: past it, nothing is written.
    let r = k.call(Op { index: N, add: 9 }, T).unwrap();
    assert_eq!((r.index, r.ok), (N, 0), "{}", t.name());
    let acc = k.read_buffer::<u32>("acc", T).unwrap().to_vec();
    assert_eq!(acc.len(), N as usize);
    assert_eq!((acc[0], acc[3], acc[60]), (502, 1031, 613), "{}", t.name());
    assert_eq!(
        acc.iter()
            .enumerate()
            .filter(|&(i, _)| ![0, 3, 60].contains(&i))
            .map(|(_, v)| *v)
            .collect::<Vec<_>>(),
        (0..N)
            .filter(|i| ![0, 3, 60].contains(i))
            .map(|i| i * 10 + 1)
            .collect::<Vec<_>>(),
        "{}: only the three elements written since",
        t.name()
    );

    let report = k.terminate().unwrap();
    assert!(
        report.failure.is_none(),
        "{}: {:?}",
        t.name(),
        report.failure
    );
    assert_eq!(report.processed, N as u64 + 4);
    // Nothing of the kernel holds its buffers once its handle is gone (the runtime keeps only
    // a record of it).
    drop(k);
    assert_eq!(
        Arc::strong_count(&d),
        baseline,
        "{}: a terminated kernel's bound buffers are released",
        t.name()
    );
}

/// Bindings that do not match are typed errors, on the host side and at launch.
fn mismatches(t: &dyn Target) {
    // Not beside the keyed case on CudaSim (see `cudasim_exclusive`).
    let _apart = cudasim_exclusive(t);
    let rt = rt(t);
    let d = rt.device().unwrap();
    let k = rt
        .launch(accumulate(
            "mismatch",
            buf(&d, &src_values()),
            buf(&d, &[0; N as usize]),
        ))
        .unwrap();
    k.activate().unwrap();
    assert_eq!(k.call(Op { index: 1, add: 0 }, T).unwrap().value, 10);
    // Host side: another element type (of the same size, too), another name.
    assert!(matches!(
        k.read_buffer::<f32>("acc", T),
        Err(BindError::TypeMismatch { .. })
    ));
    assert!(matches!(
        k.write_buffer::<u64>("src", T),
        Err(BindError::TypeMismatch { .. })
    ));
    assert!(matches!(
        k.read_buffer::<u32>("nope", T),
        Err(BindError::UnknownBuffer { .. })
    ));
    assert!(matches!(
        k.buffer_id("nope"),
        Err(BindError::UnknownBuffer { .. })
    ));
    // Nothing was touched by the refusals.
    assert_eq!(k.call(Op { index: 1, add: 0 }, T).unwrap().value, 20);
    assert_ne!(k.buffer_id("src").unwrap(), k.buffer_id("acc").unwrap());
    k.terminate().unwrap();

    // A kernel with no bindings.
    let plain = rt.launch(standard("unbound")).unwrap();
    assert!(matches!(
        plain.read_buffer::<u32>("acc", T),
        Err(BindError::NoBindings { .. })
    ));
    plain.terminate().unwrap();

    // At launch: an empty name, a name bound twice.
    let refused = |kernel: RingKernel<Op, Got>, what: &str| match rt.launch(kernel) {
        Err(Error::InvalidConfig { reason, .. }) => reason,
        Err(e) => panic!("{}: {what}: expected InvalidConfig, got {e}", t.name()),
        Ok(_) => panic!("{}: {what}: the launch must be refused", t.name()),
    };
    let twice = RingKernel::<Op, Got>::new("twice")
        .bind("src", buf(&d, &[1]))
        .bind("src", buf(&d, &[2]))
        .bind("acc", buf(&d, &[0]))
        .handler(host_handler)
        .cuda(CudaHandler::new(CUDA_SRC))
        .wgsl(WgslHandler::new(WGSL_SRC));
    assert!(refused(twice, "bound twice").contains("src"));
    let empty = RingKernel::<Op, Got>::new("empty-name")
        .bind("", buf(&d, &[1]))
        .handler(host_handler)
        .cuda(CudaHandler::new(CUDA_SRC))
        .wgsl(WgslHandler::new(WGSL_SRC));
    refused(empty, "empty name");

    // The handler's view of a binding that does not match what is bound, in each language.
    match t.placement() {
        Placement::Host => {
            // The closure asks for another element type and another name: typed, per access.
            let k = rt
                .launch(
                    RingKernel::<Op, Got>::new("host-mismatch")
                        .bind("acc", buf(&d, &[0; 4]))
                        .handler(|ctx: &mut Context<()>, m: Op| {
                            let wrong = matches!(
                                ctx.buffer::<f32>("acc"),
                                Err(BindError::TypeMismatch { .. })
                            );
                            let unknown = matches!(
                                ctx.buffer_mut::<u32>("src"),
                                Err(BindError::UnknownBuffer { .. })
                            );
                            Some(Got {
                                index: m.index,
                                ok: wrong as u32 | (unknown as u32) << 1,
                                value: 0,
                                pad: 0,
                            })
                        }),
                )
                .unwrap();
            k.activate().unwrap();
            assert_eq!(k.call(Op { index: 0, add: 0 }, T).unwrap().ok, 0b11);
            k.terminate().unwrap();
        }
        // CUDA C, on CudaSim and on a GPU alike: the declarations are checked against the
        // bindings before either launcher compiles anything, so both see the same typed error.
        #[cfg(feature = "cudasim")]
        Placement::Device(BackendKind::CudaSim) => cuda_declared_mismatch(t, &rt, &d),
        #[cfg(feature = "cuda")]
        Placement::Device(BackendKind::Cuda) => cuda_declared_mismatch(t, &rt, &d),
        #[cfg(feature = "wgpu")]
        Placement::Device(BackendKind::Wgpu) => {
            // WGSL: the generated declaration is the bound element type, so a handler that
            // stores a float into the `u32` buffer does not compile (a typed error, not a
            // reinterpretation of the bits).
            let misused = RingKernel::<Op, Got>::new("wgsl-misused")
                .bind("src", buf(&d, &[1; 4]))
                .bind("acc", buf(&d, &[0; 4]))
                .wgsl(WgslHandler::new(
                    WGSL_SRC.replace("acc[m.index] = v;", "acc[m.index] = 1.5;"),
                ));
            let e = rt.launch(misused).map(|_| ()).unwrap_err();
            assert!(
                matches!(
                    e.device_error(),
                    Some(resident::backend::DeviceError::Wgsl(
                        resident::backend::wgpu::ring::WgslLaunchError::Compile(_)
                    ))
                ),
                "expected a WGSL compile error, got {e}"
            );
        }
        other => panic!("{}: no mismatch case for {other:?}", t.name()),
    }
}

/// CUDA C: declared buffers that differ from the bound ones (another element type) are a
/// typed `DeviceError::Binding` at launch, on every CUDA launcher (CudaSim and the GPU).
#[cfg(any(feature = "cuda", feature = "cudasim"))]
fn cuda_declared_mismatch(t: &dyn Target, rt: &Runtime, d: &resident::backend::DeviceHandle) {
    let declared = RingKernel::<Op, Got>::new("cuda-declared")
        .bind("src", buf(d, &[1; 4]))
        .bind("acc", buf(d, &[0; 4]))
        .cuda(
            CudaHandler::new(CUDA_SRC)
                .buffer::<u32>("src")
                .buffer::<f32>("acc"),
        );
    match rt.launch(declared).map(|_| ()).unwrap_err().device_error() {
        Some(resident::backend::DeviceError::Binding { name, reason }) => {
            assert!(
                reason.contains("declares"),
                "{}: {name}: {reason}",
                t.name()
            )
        }
        other => panic!("{}: expected DeviceError::Binding, got {other:?}", t.name()),
    }
}

macro_rules! backends {
    ($($name:ident => $target:expr);* $(;)?) => {$(
        mod $name {
            use super::*;
            #[test] fn read_write() { run(&$target, "bound_buffers::read_write", super::read_write) }
            #[test] fn mismatches() { run(&$target, "bound_buffers::mismatches", super::mismatches) }
        }
    )*};
}

backends! {
    cpu => Cpu;
}
#[cfg(feature = "cudasim")]
backends! {
    cudasim => CudaSim;
}
#[cfg(feature = "wgpu")]
backends! {
    wgpu => Wgpu;
}
#[cfg(feature = "cuda")]
backends! {
    gpu => Gpu;
}
