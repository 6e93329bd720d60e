//! Buffers bound to a ring kernel, through the public API: handler slices, typed errors, ids in
//! messages, and host reads synchronized with the kernel's batches (race test with checks).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use resident::backend;
use resident::memory::BufferOptions;
use resident::prelude::*;
use resident::{BufferState, UnifiedBuffer};

const T: Duration = Duration::from_secs(10);

fn cpu() -> (Runtime, resident::backend::DeviceHandle) {
    let rt = Runtime::builder().backend(Backend::Cpu).build().unwrap();
    let d = backend::open(Backend::Cpu).unwrap();
    (rt, d)
}

#[test]
fn handler_sees_bound_buffers_and_host_reads_them_through_the_state_machine() {
    let (rt, d) = cpu();
    let a =
        UnifiedBuffer::from_slice(&d, &[1.0f32, 2.0, 3.0, 4.0], BufferOptions::default()).unwrap();
    let c = UnifiedBuffer::<f32>::new(&d, 4, BufferOptions::default()).unwrap();
    let k = rt
        .launch(
            RingKernel::<u32, u32>::new("double-into")
                .bind("a", a)
                .bind("c", c)
                .handler(|ctx: &mut Context<()>, i: u32| {
                    let a = ctx.buffer::<f32>("a").ok()?;
                    let mut c = ctx.buffer_mut::<f32>("c").ok()?;
                    c[i as usize] = 2.0 * a[i as usize];
                    Some(i)
                }),
        )
        .unwrap();
    k.activate().unwrap();
    for i in 0..4 {
        assert_eq!(k.call(i, T).unwrap(), i);
    }
    let c = k.read_buffer::<f32>("c", T).unwrap();
    assert_eq!(&*c, &[2.0, 4.0, 6.0, 8.0]);
    drop(c);
    // A host write is seen by the kernel's next batch.
    k.write_buffer::<f32>("a", T).unwrap()[0] = 10.0;
    assert_eq!(k.call(0, T).unwrap(), 0);
    assert_eq!(k.read_buffer::<f32>("c", T).unwrap()[0], 20.0);
    k.terminate().unwrap();
}

resident::ring::device_message! {
    /// Which buffer (by registry id) and what to add.
    pub struct AddTo { pub buffer: u64, pub value: u32, pub _pad: u32 }
}

#[test]
fn messages_name_buffers_by_id_and_errors_are_typed() {
    let (rt, d) = cpu();
    let x = UnifiedBuffer::from_slice(&d, &[0u32; 2], BufferOptions::default()).unwrap();
    let y = UnifiedBuffer::from_slice(&d, &[0u32; 2], BufferOptions::default()).unwrap();
    let k = rt
        .launch(
            RingKernel::<AddTo, u32>::new("by-id")
                .bind("x", x)
                .bind("y", y)
                .handler(|ctx: &mut Context<()>, m: AddTo| {
                    let mut b = ctx.buffer_mut_by_id::<u32>(BufferId(m.buffer)).ok()?;
                    b[0] += m.value;
                    let code = {
                        // A second mutable borrow of the same buffer is refused, typed.
                        let again = ctx
                            .buffer::<u32>("x")
                            .err()
                            .or(ctx.buffer::<u32>("y").err());
                        match again {
                            Some(BindError::AlreadyBorrowed { .. }) => 1,
                            _ => 0,
                        }
                    };
                    drop(b);
                    let unknown = matches!(
                        ctx.buffer::<u32>("nope"),
                        Err(BindError::UnknownBuffer { .. })
                    );
                    let wrong =
                        matches!(ctx.buffer::<f64>("x"), Err(BindError::TypeMismatch { .. }));
                    let bad_id = matches!(
                        ctx.buffer::<u32>("x")
                            .and(ctx.buffer_by_id::<u32>(BufferId(u64::MAX))),
                        Err(BindError::UnknownBufferId { .. })
                    );
                    Some(code | (unknown as u32) << 1 | (wrong as u32) << 2 | (bad_id as u32) << 3)
                }),
        )
        .unwrap();
    k.activate().unwrap();
    let (xid, yid) = (k.buffer_id("x").unwrap(), k.buffer_id("y").unwrap());
    assert_ne!(xid, yid);
    assert_eq!(
        k.call(
            AddTo {
                buffer: yid.0,
                value: 5,
                _pad: 0
            },
            T
        )
        .unwrap(),
        0b1111
    );
    assert_eq!(
        k.call(
            AddTo {
                buffer: xid.0,
                value: 2,
                _pad: 0
            },
            T
        )
        .unwrap(),
        0b1111
    );
    assert_eq!(k.read_buffer::<u32>("x", T).unwrap()[0], 2);
    assert_eq!(k.read_buffer::<u32>("y", T).unwrap()[0], 5);
    assert!(matches!(
        k.read_buffer::<u32>("z", T),
        Err(BindError::UnknownBuffer { .. })
    ));
    assert!(matches!(
        k.read_buffer::<i64>("x", T),
        Err(BindError::TypeMismatch { .. })
    ));
    assert!(matches!(
        k.buffer_id("z"),
        Err(BindError::UnknownBuffer { .. })
    ));
    k.terminate().unwrap();
}

#[test]
fn launch_refuses_repeated_names_and_unbound_kernels_say_so() {
    let (rt, d) = cpu();
    let b1 = UnifiedBuffer::from_slice(&d, &[0u8; 4], BufferOptions::default()).unwrap();
    let b2 = UnifiedBuffer::from_slice(&d, &[0u8; 4], BufferOptions::default()).unwrap();
    let e = rt
        .launch(
            RingKernel::<u32, u32>::new("dup")
                .bind("b", b1)
                .bind("b", b2)
                .handler(|_: &mut Context<()>, x: u32| Some(x)),
        )
        .unwrap_err();
    assert!(matches!(e, Error::InvalidConfig { .. }), "{e}");
    assert!(e.to_string().contains("bound twice"), "{e}");
    let k = rt
        .launch(RingKernel::<u32, u32>::new("plain").handler(|_: &mut Context<()>, x: u32| Some(x)))
        .unwrap();
    assert!(matches!(
        k.read_buffer::<u8>("b", T),
        Err(BindError::NoBindings { .. })
    ));
    k.terminate().unwrap();
}

/// The race: a writer kernel sets every element of a bound buffer to the message's value; host
/// threads read concurrently. A read must never see a torn batch (all elements equal), values
/// never go back, and the last read sees the last message.
#[test]
fn host_reads_race_a_writer_kernel_and_never_see_a_torn_batch() {
    let (rt, d) = cpu();
    const LEN: usize = 4096;
    const MSGS: u64 = 20_000;
    let buf = UnifiedBuffer::from_slice(&d, &vec![0u64; LEN], BufferOptions::default()).unwrap();
    let k = rt
        .launch(
            RingKernel::<u64, u64>::new("writer")
                .queue_size(1024)
                .batch_size(16)
                .bind("v", buf)
                .handler(|ctx: &mut Context<()>, x: u64| {
                    let mut v = ctx.buffer_mut::<u64>("v").ok()?;
                    // Element by element, so a read in the middle would be torn.
                    for e in v.iter_mut() {
                        *e = x;
                    }
                    None
                }),
        )
        .unwrap();
    k.activate().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (k, stop) = (k.clone(), stop.clone());
            std::thread::spawn(move || {
                let (mut last, mut reads) = (0u64, 0u64);
                while !stop.load(Ordering::Acquire) {
                    let g = k.read_buffer::<u64>("v", T).unwrap();
                    let first = g[0];
                    assert!(
                        g.iter().all(|&e| e == first),
                        "torn read: {first} and {:?}",
                        g.iter().find(|&&e| e != first)
                    );
                    assert!(first >= last, "went back from {last} to {first}");
                    last = first;
                    reads += 1;
                }
                reads
            })
        })
        .collect();
    for x in 1..=MSGS {
        k.send(x).unwrap();
    }
    k.drain(T).unwrap();
    stop.store(true, Ordering::Release);
    let reads: u64 = readers.into_iter().map(|r| r.join().unwrap()).sum();
    assert!(reads > 0);
    let g = k.read_buffer::<u64>("v", T).unwrap();
    assert!(g.iter().all(|&e| e == MSGS));
    drop(g);
    k.terminate().unwrap();
}

#[test]
fn a_host_guard_holds_the_kernel_between_batches_and_busy_is_typed() {
    let (rt, d) = cpu();
    let buf = UnifiedBuffer::from_slice(&d, &[0u32; 1], BufferOptions::default()).unwrap();
    assert_eq!(buf.state(), BufferState::HostOnly);
    let k = rt
        .launch(RingKernel::<u32, u32>::new("slow").bind("v", buf).handler(
            |ctx: &mut Context<()>, x: u32| {
                ctx.buffer_mut::<u32>("v").ok()?[0] = x;
                if x == 1 {
                    std::thread::sleep(Duration::from_millis(300));
                }
                Some(x)
            },
        ))
        .unwrap();
    k.activate().unwrap();
    // While the kernel is inside a slow batch the host read waits; a short timeout is Busy.
    k.send(1).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    match k.read_buffer::<u32>("v", Duration::from_millis(10)) {
        Err(BindError::Busy { .. }) => {}
        Err(e) => panic!("expected Busy, got {e}"),
        Ok(_) => panic!("read inside a batch"),
    }
    // A patient read waits for the batch and sees its write.
    assert_eq!(k.read_buffer::<u32>("v", T).unwrap()[0], 1);
    // While the host holds a guard the kernel does not run.
    let g = k.read_buffer::<u32>("v", T).unwrap();
    k.send(2).unwrap();
    assert!(k
        .receive(Duration::from_millis(100))
        .map(|x| x == 1)
        .unwrap_or(true));
    assert_eq!(g[0], 1);
    drop(g);
    let mut got = vec![];
    while let Ok(x) = k.receive(Duration::from_secs(2)) {
        got.push(x);
        if x == 2 {
            break;
        }
    }
    assert_eq!(got.last(), Some(&2));
    assert_eq!(k.read_buffer::<u32>("v", T).unwrap()[0], 2);
    k.terminate().unwrap();
}
