//! Buffers bound to a ring kernel with a WGSL handler, on the wgpu backend (lavapipe in CI),
//! through the public API: the handler writes bound buffers (f32, f64 as `vec2<u32>`, a struct
//! with a u64) and the host reads equal the same definition's CPU closure; host writes are seen
//! by later messages; host reads racing a kernel that increments every element are never torn;
//! messages name buffers by id; bindings WGSL cannot hold are typed errors. Without an adapter
//! each test prints `SKIP:` and returns, unless `RESIDENT_REQUIRE_WGPU=1`, then it fails.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use resident::backend::wgpu::ring::WgslLaunchError;
use resident::backend::{self, DeviceError, DeviceHandle};
use resident::memory::BufferOptions;
use resident::prelude::*;
use resident::UnifiedBuffer;

const T: Duration = Duration::from_secs(30);

fn require() -> bool {
    std::env::var("RESIDENT_REQUIRE_WGPU").as_deref() == Ok("1")
}

fn wgpu(test: &str) -> Option<(Runtime, DeviceHandle)> {
    let r = Runtime::builder()
        .backend(Backend::Wgpu)
        .build()
        .map_err(|e| e.to_string())
        .and_then(|rt| Ok((rt, backend::open(Backend::Wgpu).map_err(|e| e.to_string())?)));
    match r {
        Ok(x) => Some(x),
        Err(e) => {
            if require() {
                panic!("RESIDENT_REQUIRE_WGPU=1 but the wgpu backend is unavailable: {e}");
            }
            println!("SKIP: {test}: {e}");
            None
        }
    }
}

device_message! {
    /// Per-slot tally (a struct element with a 64-bit field).
    #[derive(PartialEq)]
    pub struct Tally { pub hits: u64, pub last: f32, pub _pad: u32 }
}
device_message! {
    /// Scale `a[offset .. offset + len]` into `c` and `wide`, count it in `tally[slot]`.
    pub struct Job { pub offset: u32, pub len: u32, pub scale: f32, pub slot: u32 }
}
device_message! {
    /// The slot's tally after the job (`len == u32::MAX`: refused, nothing written).
    pub struct Done { pub tally: Tally, pub offset: u32, pub len: u32 }
}

const JOB_WGSL: &str = r#"
fn handle(job: ResidentIn, out: ptr<function, ResidentOut>, env: Envelope) -> bool {
    (*out).offset = job.offset;
    let end = job.offset + job.len;
    if (end < job.offset || end > a_len || end > c_len || end > wide_len || job.slot >= tally_len) {
        (*out).len = 0xffffffffu;
        return true;
    }
    for (var i = job.offset; i < end; i += 1u) {
        let x = a[i] * job.scale;
        c[i] = x;
        wide[i] = resident_f32_to_f64(x);
    }
    var t = tally[job.slot];
    t.hits = resident_u64_add(t.hits, resident_u64(job.len));
    t.last = job.scale;
    tally[job.slot] = t;
    (*out).tally = t;
    (*out).len = job.len;
    return true;
}
"#;

/// One definition: a CPU closure and the same logic in WGSL.
fn job_kernel(id: &str, d: &DeviceHandle, a: &[f32], slots: usize) -> RingKernel<Job, Done, ()> {
    let o = BufferOptions::default();
    let n = a.len();
    let mut tally = UnifiedBuffer::<Tally>::new(d, slots, o).unwrap();
    tally.host_mut().unwrap();
    let mut wide = UnifiedBuffer::<f64>::new(d, n, o).unwrap();
    wide.host_mut().unwrap().fill(-1.0);
    RingKernel::<Job, Done>::new(id)
        .bind("a", UnifiedBuffer::from_slice(d, a, o).unwrap())
        .bind(
            "c",
            UnifiedBuffer::from_slice(d, &vec![0.0f32; n], o).unwrap(),
        )
        .bind("wide", wide)
        .bind("tally", tally)
        .handler(|ctx: &mut Context<()>, job: Job| {
            let a = ctx.buffer::<f32>("a").ok()?;
            let mut c = ctx.buffer_mut::<f32>("c").ok()?;
            let mut wide = ctx.buffer_mut::<f64>("wide").ok()?;
            let mut tally = ctx.buffer_mut::<Tally>("tally").ok()?;
            let (lo, n) = (job.offset as usize, job.len as usize);
            let refused = Done {
                tally: Tally {
                    hits: 0,
                    last: 0.0,
                    _pad: 0,
                },
                offset: job.offset,
                len: u32::MAX,
            };
            let end = match lo.checked_add(n) {
                Some(e) if e <= a.len() && (job.slot as usize) < tally.len() => e,
                _ => return Some(refused),
            };
            for i in lo..end {
                c[i] = a[i] * job.scale;
                wide[i] = c[i] as f64;
            }
            let t = &mut tally[job.slot as usize];
            t.hits += job.len as u64;
            t.last = job.scale;
            Some(Done {
                tally: *t,
                offset: job.offset,
                len: job.len,
            })
        })
        .wgsl(WgslHandler::new(JOB_WGSL))
}

struct JobOutcome {
    answers: Vec<Done>,
    c: Vec<f32>,
    wide: Vec<f64>,
    tally: Vec<Tally>,
}

fn run_jobs(rt: &Runtime, d: &DeviceHandle, jobs: &[Job]) -> JobOutcome {
    let a: Vec<f32> = (0..1000).map(|i| i as f32 * 0.37 - 100.0).collect();
    let k = rt.launch(job_kernel("jobs", d, &a, 64)).unwrap();
    k.activate().unwrap();
    let answers = jobs.iter().map(|j| k.call(*j, T).unwrap()).collect();
    // One guard at a time: a guard holds the kernel's buffer table until it is dropped.
    let c = k.read_buffer::<f32>("c", T).unwrap().to_vec();
    let wide = k.read_buffer::<f64>("wide", T).unwrap().to_vec();
    let tally = k.read_buffer::<Tally>("tally", T).unwrap().to_vec();
    let out = JobOutcome {
        answers,
        c,
        wide,
        tally,
    };
    k.terminate().unwrap();
    out
}

#[test]
fn wgsl_handler_writes_bound_buffers_like_the_cpu_closure() {
    let Some((rt, d)) = wgpu("wgsl_handler_writes_bound_buffers_like_the_cpu_closure") else {
        return;
    };
    let jobs: Vec<Job> = (0..40u32)
        .map(|i| Job {
            offset: i * 23,
            len: 17 + i % 9,
            scale: 1.5 + i as f32 * 0.25,
            slot: i % 7,
        })
        .chain([
            // Past the end, overflowing, and a slot past the tally: refused, nothing written.
            Job {
                offset: 990,
                len: 20,
                scale: 9.0,
                slot: 0,
            },
            Job {
                offset: u32::MAX - 3,
                len: 10,
                scale: 9.0,
                slot: 0,
            },
            Job {
                offset: 0,
                len: 5,
                scale: 9.0,
                slot: 64,
            },
        ])
        .collect();
    let cpu_rt = Runtime::builder().backend(Backend::Cpu).build().unwrap();
    let cpu_d = backend::open(Backend::Cpu).unwrap();
    let want = run_jobs(&cpu_rt, &cpu_d, &jobs);
    let got = run_jobs(&rt, &d, &jobs);
    assert_eq!(got.answers.len(), want.answers.len());
    for (g, w) in got.answers.iter().zip(&want.answers) {
        assert_eq!((g.offset, g.len), (w.offset, w.len));
        if w.len != u32::MAX {
            assert_eq!(g.tally, w.tally);
        }
    }
    assert_eq!(got.c, want.c);
    assert_eq!(got.wide, want.wide);
    assert_eq!(got.tally, want.tally);
    // The kernel really wrote: the untouched initial values are gone where jobs ran.
    assert!(got.wide[..17].iter().all(|&w| w != -1.0));
    assert_eq!(got.wide[20], -1.0, "a gap between jobs stays untouched");
    assert_eq!(got.tally[0].hits, want.tally[0].hits);
    assert!(got.tally[0].hits > 0);
}

#[test]
fn host_writes_are_seen_by_later_messages() {
    let Some((rt, d)) = wgpu("host_writes_are_seen_by_later_messages") else {
        return;
    };
    let a: Vec<f32> = vec![1.0; 100];
    let k = rt.launch(job_kernel("writes", &d, &a, 4)).unwrap();
    k.activate().unwrap();
    let job = Job {
        offset: 0,
        len: 100,
        scale: 2.0,
        slot: 1,
    };
    assert_eq!(k.call(job, T).unwrap().len, 100);
    assert!(k
        .read_buffer::<f32>("c", T)
        .unwrap()
        .iter()
        .all(|&x| x == 2.0));
    {
        let mut w = k.write_buffer::<f32>("a", T).unwrap();
        assert!(
            w.iter().all(|&x| x == 1.0),
            "the guard starts as the device's values"
        );
        for (i, x) in w.iter_mut().enumerate() {
            *x = i as f32;
        }
        w.commit().unwrap();
    }
    // A write of the tally too (a struct with a u64), dropped rather than committed.
    k.write_buffer::<Tally>("tally", T).unwrap()[1].hits = 1 << 40;
    let t = k.call(job, T).unwrap();
    assert_eq!(t.tally.hits, (1 << 40) + 100);
    let c = k.read_buffer::<f32>("c", T).unwrap();
    assert!(c.iter().enumerate().all(|(i, &x)| x == 2.0 * i as f32));
    drop(c);
    let wide = k.read_buffer::<f64>("wide", T).unwrap();
    assert!(wide.iter().enumerate().all(|(i, &x)| x == 2.0 * i as f64));
    drop(wide);
    k.terminate().unwrap();
}

device_message! {
    /// Increment every element of `counts` by `by`.
    pub struct Inc { pub by: u32, pub seq: u32 }
}

const INC_WGSL: &str = r#"
fn handle(m: ResidentIn, out: ptr<function, ResidentOut>, env: Envelope) -> bool {
    for (var j = 0u; j < counts_len; j += 1u) {
        counts[j] = counts[j] + m.by;
    }
    atomicAdd(&state.count, 1u);
    (*out).by = counts[0];
    (*out).seq = m.seq;
    return true;
}
"#;

device_message! {
    /// Messages handled.
    pub struct Counter { pub count: u32 }
}

#[test]
fn host_reads_racing_the_kernel_are_never_torn() {
    let Some((rt, d)) = wgpu("host_reads_racing_the_kernel_are_never_torn") else {
        return;
    };
    // 256 elements x at most 64 messages per batch: one in-order invocation loops 16k times
    // per batch, well inside llvmpipe's cap of 65535 loop iterations per invocation.
    const N: usize = 256;
    const MESSAGES: u32 = 3000;
    let counts = UnifiedBuffer::from_slice(&d, &vec![0u32; N], BufferOptions::default()).unwrap();
    let k = Arc::new(
        rt.launch(
            RingKernel::<Inc, Inc>::new("inc")
                .queue_size(4096)
                .batch_size(64)
                .bind("counts", counts)
                .wgsl(
                    WgslHandler::new(INC_WGSL)
                        .state(Counter { count: 0 })
                        .in_order(),
                ),
        )
        .unwrap(),
    );
    k.activate().unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let sender = {
        let (k, done) = (k.clone(), done.clone());
        std::thread::spawn(move || {
            let msgs: Vec<Inc> = (0..MESSAGES).map(|seq| Inc { by: 1, seq }).collect();
            for chunk in msgs.chunks(50) {
                let mut sent = 0;
                while sent < chunk.len() {
                    sent += k.send_batch(&chunk[sent..]).unwrap();
                }
            }
            let mut last = 0;
            for i in 0..MESSAGES {
                let o = k.receive(T).unwrap();
                // In order: every message saw all earlier ones.
                assert_eq!(o.seq, i);
                assert_eq!(o.by, i + 1);
                last = o.by;
            }
            done.store(true, Ordering::Release);
            last
        })
    };
    let mut reads = 0;
    let mut seen = Vec::new();
    let mut prev = 0;
    while !done.load(Ordering::Acquire) {
        let c = k.read_buffer::<u32>("counts", T).unwrap();
        let v = c[0];
        assert!(
            c.iter().all(|&x| x == v),
            "a torn read: element 0 is {v}, then {:?}",
            c.iter()
                .enumerate()
                .filter(|&(_, &x)| x != v)
                .map(|(i, x)| (i, *x))
                .take(8)
                .collect::<Vec<_>>()
        );
        assert!(v >= prev, "a read went back in time: {v} after {prev}");
        prev = v;
        seen.push(v);
        reads += 1;
    }
    assert_eq!(sender.join().unwrap(), MESSAGES);
    let c = k.read_buffer::<u32>("counts", T).unwrap();
    assert!(c.iter().all(|&x| x == MESSAGES));
    drop(c);
    assert_eq!(k.snapshot_state::<Counter>().unwrap().count, MESSAGES);
    // The reads really raced the kernel: some saw a state strictly between start and end.
    let between = seen.iter().filter(|&&v| v > 0 && v < MESSAGES).count();
    println!("{reads} racing reads, {between} between the first and the last message");
    assert!(between > 0, "no read landed while messages were running");
    k.terminate().unwrap();
}

device_message! {
    /// Add `value` to element 0 of the bound buffer with registry id `buffer`.
    pub struct AddTo { pub buffer: u64, pub value: u32, pub _pad: u32 }
}
device_message! {
    /// One value.
    pub struct Val { pub v: u32 }
}

const ADD_TO_WGSL: &str = r#"
fn handle(m: ResidentIn, out: ptr<function, ResidentOut>, env: Envelope) -> bool {
    if (all(m.buffer == x_id)) {
        x[0] += m.value;
        (*out).v = x[0];
        return true;
    }
    if (all(m.buffer == y_id)) {
        y[0] += m.value;
        (*out).v = y[0];
        return true;
    }
    return false;
}
"#;

#[test]
fn messages_name_buffers_by_id() {
    let Some((rt, d)) = wgpu("messages_name_buffers_by_id") else {
        return;
    };
    let o = BufferOptions::default();
    let k = rt
        .launch(
            RingKernel::<AddTo, Val>::new("by-id")
                .bind("x", UnifiedBuffer::from_slice(&d, &[5u32], o).unwrap())
                .bind("y", UnifiedBuffer::from_slice(&d, &[100u32], o).unwrap())
                .wgsl(WgslHandler::new(ADD_TO_WGSL).in_order()),
        )
        .unwrap();
    k.activate().unwrap();
    let (x, y) = (k.buffer_id("x").unwrap(), k.buffer_id("y").unwrap());
    assert_ne!(x, y);
    let add = |buffer: BufferId, value| AddTo {
        buffer: buffer.0,
        value,
        _pad: 0,
    };
    assert_eq!(k.call(add(x, 2), T).unwrap().v, 7);
    assert_eq!(k.call(add(y, 3), T).unwrap().v, 103);
    assert_eq!(k.call(add(x, 1), T).unwrap().v, 8);
    // An id no buffer has: no answer, so the call fails at once, and nothing is written.
    let unknown = BufferId(x.0.max(y.0) + 1000);
    assert!(matches!(
        k.call(add(unknown, 1), T),
        Err(Error::NoReply { .. })
    ));
    assert_eq!(&*k.read_buffer::<u32>("x", T).unwrap(), &[8]);
    assert_eq!(&*k.read_buffer::<u32>("y", T).unwrap(), &[103]);
    k.terminate().unwrap();
}

const NOOP_WGSL: &str = r#"
fn handle(m: ResidentIn, out: ptr<function, ResidentOut>, env: Envelope) -> bool {
    (*out) = m;
    return true;
}
"#;

fn launch_with<T: bytemuck::Pod + Send + resident::ring::message::CField>(
    rt: &Runtime,
    name: &str,
    buf: UnifiedBuffer<T>,
) -> Result<KernelHandle<Val, Val>, Error> {
    rt.launch(
        RingKernel::<Val, Val>::new(format!("bad-{}", name.len()))
            .bind(name, buf)
            .wgsl(WgslHandler::new(NOOP_WGSL)),
    )
}

#[test]
fn bindings_wgsl_cannot_hold_are_typed_errors() {
    let Some((rt, d)) = wgpu("bindings_wgsl_cannot_hold_are_typed_errors") else {
        return;
    };
    let o = BufferOptions::default();
    let binding = |e: Error| match e.device_error() {
        Some(DeviceError::Binding { name, reason }) => (name.clone(), reason.clone()),
        other => panic!("expected a binding error, got {other:?}"),
    };
    // An element type with no WGSL form.
    let e = launch_with(
        &rt,
        "shorts",
        UnifiedBuffer::from_slice(&d, &[1u16, 2], o).unwrap(),
    )
    .expect_err("u16 elements are refused");
    let (name, reason) = binding(e);
    assert_eq!(name, "shorts");
    assert!(reason.contains("16-bit"), "{reason}");
    // Names that are not WGSL identifiers, keywords, or names the generated code uses.
    for bad in [
        "not-an-ident",
        "9lives",
        "state",
        "resident_x",
        "loop",
        "__x",
    ] {
        let e = launch_with(&rt, bad, UnifiedBuffer::from_slice(&d, &[1u32], o).unwrap())
            .err()
            .unwrap_or_else(|| panic!("`{bad}` is refused"));
        assert_eq!(binding(e).0, bad);
    }
    // Past the adapter's storage-binding limit: a typed limit error naming it.
    let max = resident::backend::wgpu::adapters()[0].max_storage_buffer_binding_size;
    if max <= 512 << 20 {
        let n = (max / 4 + 1) as usize;
        let mut big = UnifiedBuffer::<u32>::new(&d, n, o).unwrap();
        big.host_mut().unwrap();
        let e = launch_with(&rt, "big", big).expect_err("too large");
        match e.device_error() {
            Some(DeviceError::Wgsl(WgslLaunchError::BoundBuffer { name, source })) => {
                assert_eq!(name, "big");
                assert!(matches!(
                    source,
                    resident::BackendError::WgpuLimit {
                        limit: "max_storage_buffer_binding_size",
                        ..
                    }
                ));
            }
            other => panic!("expected a limit error, got {other:?}"),
        }
    } else {
        println!("storage-binding limit {max} bytes: the oversize case is not exercised here");
    }
    // More bound buffers than the adapter binds per shader stage (the ring itself uses 5).
    let per_stage = resident::backend::wgpu::adapters()[0].max_storage_buffers_per_shader_stage;
    if per_stage <= 64 {
        let many = |count: u32| {
            let mut k = RingKernel::<Val, Val>::new(format!("many-{count}"));
            for i in 0..count {
                k = k.bind(
                    format!("b{i}"),
                    UnifiedBuffer::from_slice(&d, &[i], o).unwrap(),
                );
            }
            // The last binding is the one read: all of group 1 is really bound.
            let src = format!(
                "fn handle(m: ResidentIn, out: ptr<function, ResidentOut>, env: Envelope) -> bool {{\n\
                 \x20   (*out).v = m.v + b{}[0];\n    return true;\n}}\n",
                count - 1
            );
            rt.launch(k.wgsl(WgslHandler::new(src)))
        };
        let e = many(per_stage - 4).expect_err("too many storage buffers");
        let (_, reason) = binding(e);
        assert!(
            reason.contains("max_storage_buffers_per_shader_stage"),
            "{reason}"
        );
        let k = many(per_stage - 5).expect("as many as the adapter binds");
        k.activate().unwrap();
        assert_eq!(k.call(Val { v: 1000 }, T).unwrap().v, 1000 + per_stage - 6);
        k.terminate().unwrap();
    }
    // The runtime still works after the refusals, and an empty buffer binds.
    let k = launch_with(
        &rt,
        "empty",
        UnifiedBuffer::from_slice(&d, &[0u32; 0], o).unwrap(),
    )
    .unwrap();
    k.activate().unwrap();
    assert_eq!(k.call(Val { v: 41 }, T).unwrap().v, 41);
    assert!(k.read_buffer::<u32>("empty", T).unwrap().is_empty());
    k.terminate().unwrap();
}

/// On lavapipe an invocation's loops end after 65535 iterations in all: an in-order batch that
/// needs more (64 messages x 2048 elements) must fail the kernel loudly, never publish wrong or
/// stale outputs. A device without that cap runs it to the end, and the values are right.
#[test]
fn an_in_order_batch_the_device_cuts_short_fails_the_kernel() {
    let Some((rt, d)) = wgpu("an_in_order_batch_the_device_cuts_short_fails_the_kernel") else {
        return;
    };
    const N: usize = 2048;
    let counts = UnifiedBuffer::from_slice(&d, &vec![0u32; N], BufferOptions::default()).unwrap();
    let k = rt
        .launch(
            RingKernel::<Inc, Inc>::new("cut")
                .batch_size(64)
                .bind("counts", counts)
                .wgsl(
                    WgslHandler::new(INC_WGSL)
                        .state(Counter { count: 0 })
                        .in_order(),
                ),
        )
        .unwrap();
    k.activate().unwrap();
    let msgs: Vec<Inc> = (0..64).map(|seq| Inc { by: 1, seq }).collect();
    // One batch of 64: sent whole while the kernel is inactive, then let go.
    k.deactivate().unwrap();
    let mut sent = 0;
    while sent < msgs.len() {
        sent += k.send_batch(&msgs[sent..]).unwrap();
    }
    k.activate().unwrap();
    let mut outputs = Vec::new();
    let deadline = std::time::Instant::now() + T;
    while outputs.len() < msgs.len() && std::time::Instant::now() < deadline {
        match k.receive(Duration::from_millis(100)) {
            Ok(o) => outputs.push(o),
            Err(_) if matches!(k.state(), KernelState::Failed(_)) => break,
            Err(_) => {}
        }
    }
    match k.state() {
        KernelState::Failed(reason) => {
            println!("cut short, as on llvmpipe: {reason}");
            assert!(reason.to_string().contains("65535"), "{reason}");
            assert!(
                outputs.is_empty(),
                "no output of the cut batch is published"
            );
        }
        s => {
            println!("the device ran the whole batch ({s})");
            assert_eq!(outputs.len(), msgs.len());
            let c = k.read_buffer::<u32>("counts", T).unwrap();
            assert!(c.iter().all(|&x| x == 64));
        }
    }
    let _ = k.terminate();
}

const ATOMIC_WGSL: &str = r#"
fn handle(m: ResidentIn, out: ptr<function, ResidentOut>, env: Envelope) -> bool {
    atomicAdd(&hist[m.v % hist_len], 1u);
    // A float kept as its bits: add 0.5 with a compare-exchange loop.
    var old = atomicLoad(&sum_bits[0]);
    loop {
        let r = atomicCompareExchangeWeak(&sum_bits[0], old, bitcast<u32>(bitcast<f32>(old) + 0.5));
        if (r.exchanged) { break; }
        old = r.old_value;
    }
    (*out).v = m.v;
    return true;
}
"#;

/// `WgslHandler::atomic`: parallel invocations of every batch update the same elements of
/// bound buffers declared atomic, and no update is lost (a histogram and a float sum kept as
/// bits, both exact); naming a buffer that is not bound, or one of floats, is a typed error.
#[test]
fn atomic_bound_buffers_lose_no_parallel_update() {
    let Some((rt, d)) = wgpu("atomic_bound_buffers_lose_no_parallel_update") else {
        return;
    };
    let o = BufferOptions::default();
    let kernel = |id: &str, h: WgslHandler<Val, Val>| {
        RingKernel::<Val, Val>::new(id)
            .batch_size(256)
            .bind(
                "hist",
                UnifiedBuffer::from_slice(&d, &[0u32; 16], o).unwrap(),
            )
            .bind(
                "sum_bits",
                UnifiedBuffer::from_slice(&d, &[0u32], o).unwrap(),
            )
            .bind("plain", UnifiedBuffer::from_slice(&d, &[0f32], o).unwrap())
            .wgsl(h)
    };
    let h = || {
        WgslHandler::new(ATOMIC_WGSL)
            .atomic("hist")
            .atomic("sum_bits")
    };
    let k = rt.launch(kernel("atomics", h())).unwrap();
    k.activate().unwrap();
    let n = 32_000u32;
    let msgs: Vec<Val> = (0..n).map(|v| Val { v }).collect();
    let mut sent = 0;
    let mut got = Vec::new();
    while got.len() < msgs.len() {
        // At most 512 unanswered, so the kernel always has room for its answers.
        let end = msgs.len().min(got.len() + 512);
        if sent < end {
            sent += k.send_batch(&msgs[sent..end]).unwrap();
        }
        let before = got.len();
        k.receive_batch(&mut got, msgs.len()).unwrap();
        if got.len() == before && sent == end {
            got.push(k.receive(T).unwrap());
        }
    }
    let hist = k.read_buffer::<u32>("hist", T).unwrap();
    assert_eq!(&*hist, &[n / 16; 16]);
    drop(hist);
    let bits = k.read_buffer::<u32>("sum_bits", T).unwrap();
    assert_eq!(f32::from_bits(bits[0]), n as f32 * 0.5);
    k.terminate().unwrap();
    for (bad, why) in [("nope", "no buffer of that name"), ("plain", "`f32`")] {
        let e = rt
            .launch(kernel(&format!("atomic-{bad}"), h().atomic(bad)))
            .expect_err("refused");
        match e.device_error() {
            Some(DeviceError::Wgsl(WgslLaunchError::Atomic { name, reason })) => {
                assert_eq!(name, bad);
                assert!(reason.contains(why), "{reason}");
            }
            other => panic!("expected an atomic-binding error, got {other:?}"),
        }
    }
}
