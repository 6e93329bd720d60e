//! A launch waiting for its kernel to become resident while the residency rule parks every
//! resident kernel (another thread's module load or allocation: `with_all_quiesced`), on
//! CudaSim. The parked kernel shows `Quiesced` until it is relaunched; the launch must wait
//! that out within its own deadline, not fail with `Exited { state: Quiesced }` (the flake of
//! `bound_buffers::cudasim::mismatches` in the conformance suite under parallel load). The
//! race is made deterministic with the launch's wait hook (`on_resident_wait`): the kernel is
//! parked from another thread before the launch's first look at its state, and resumed only
//! once the launch has looked again.
//!
//! Its own test binary: `with_all_quiesced` parks every CudaSim kernel of the process, and the
//! tests of other files must not see their kernels parked by this one.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use resident_engine_cuda::persistent::sim::{relaunch_count, with_all_quiesced};
use resident_engine_cuda::persistent::{
    compile_sim, on_resident_wait, DeviceState, KernelSource, MessageDecl, PersistentError,
    QueueConfig, SimKernel, SimLaunchOptions,
};
use resident_ring::Envelope;

const DOUBLE: &str = "__device__ bool handle(ResidentState* s, const ResidentIn* in, ResidentOut* out, const Envelope* e) { *out = *in * 2ull; return true; }";

fn source(name: &str) -> KernelSource {
    let u64_decl = MessageDecl::new("U64", "typedef unsigned long long U64;", 8);
    KernelSource::new(
        name,
        u64_decl.clone(),
        u64_decl,
        MessageDecl::new(
            "Count",
            "typedef struct { unsigned long long n; } Count;",
            8,
        ),
        DOUBLE,
        32,
    )
}

fn opts(heartbeat_timeout: Option<Duration>) -> SimLaunchOptions {
    SimLaunchOptions {
        queues: QueueConfig {
            lanes: 1,
            lane_capacity: 64,
            out_capacity: 64,
        },
        heartbeat_timeout,
        start_timeout: Duration::from_secs(60),
        ..SimLaunchOptions::default()
    }
}

/// The thread that parks the kernels for [`a_launch_waits_out_a_quiesce_of_its_starting_kernel`].
type Quiescer = Rc<RefCell<Option<JoinHandle<Result<(), PersistentError>>>>>;

#[test]
fn a_launch_waits_out_a_quiesce_of_its_starting_kernel() {
    let src = source("launch_quiesce");
    let opts = opts(None);
    // Compiled first, so the launch below makes no module load of its own.
    let module = compile_sim(&src).unwrap();

    let rounds = Rc::new(Cell::new(0u32));
    let quiescer: Quiescer = Rc::new(RefCell::new(None));
    let (parked_tx, parked_rx) = mpsc::channel::<()>();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let mut release_rx = Some(release_rx);
    let mut release_tx = Some(release_tx);
    let hook = {
        let rounds = rounds.clone();
        let quiescer = quiescer.clone();
        move || {
            rounds.set(rounds.get() + 1);
            match rounds.get() {
                // Before the first look: another thread parks every resident kernel (this one
                // is registered, started or not) and holds them parked.
                1 => {
                    let release = release_rx.take().expect("round 1 runs once");
                    let parked = parked_tx.clone();
                    *quiescer.borrow_mut() = Some(std::thread::spawn(move || {
                        with_all_quiesced(Duration::from_secs(30), move || {
                            parked.send(()).unwrap();
                            // Held until the launch looked at its parked kernel (round 2), or
                            // the hook is gone (the launch returned).
                            let _ = release.recv_timeout(Duration::from_secs(60));
                        })
                    }));
                    parked_rx
                        .recv_timeout(Duration::from_secs(60))
                        .expect("the starting kernel parked");
                }
                // The launch saw `Quiesced` and waited on: resume the kernels.
                2 => {
                    let _ = release_tx.take().expect("round 2 runs once").send(());
                }
                _ => {}
            }
        }
    };
    let relaunches = relaunch_count();
    let hook = on_resident_wait(hook);
    let launched = SimKernel::<u64, u64>::launch_compiled(&module, &src, &[0u8; 8], &opts);
    drop(hook);
    let mut k = match launched {
        Ok(k) => k,
        Err(e) => panic!("a quiesce during the launch's wait failed the launch: {e}"),
    };
    assert!(
        rounds.get() >= 2,
        "the launch returned before it looked at its parked kernel again ({} rounds)",
        rounds.get()
    );
    let quiescer = quiescer
        .borrow_mut()
        .take()
        .expect("the quiesce was started");
    quiescer
        .join()
        .expect("the quiescing thread")
        .expect("every kernel parked");
    assert!(
        relaunch_count() > relaunches,
        "the parked kernel was relaunched"
    );
    let state = k.device_counters().state;
    assert!(
        matches!(state, Some(DeviceState::Idle | DeviceState::Running)),
        "resident after the launch: {state:?}"
    );
    // And it works where it left off.
    k.activate();
    k.send(Envelope::new(1, 0, 10), 21).unwrap();
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while out.is_empty() {
        k.check().unwrap();
        assert!(Instant::now() < deadline, "no output");
        k.receive_into(&mut out, 1);
        std::thread::sleep(Duration::from_micros(200));
    }
    assert_eq!(out[0].payload, 42);
    k.terminate(Duration::from_secs(30)).unwrap();
}

#[test]
fn a_real_exit_while_starting_is_still_a_typed_error_at_once() {
    // A heartbeat timeout of 1 ns: the block exits on its first control check, before it ever
    // shows a resident state. The launch must report that exit, not wait out its deadline.
    let src = source("launch_exit");
    let opts = opts(Some(Duration::from_nanos(1)));
    let module = compile_sim(&src).unwrap();
    let start = Instant::now();
    let r = SimKernel::<u64, u64>::launch_compiled(&module, &src, &[0u8; 8], &opts);
    let took = start.elapsed();
    match r {
        Err(PersistentError::Exited {
            state: Some(DeviceState::HeartbeatTimeout),
            ..
        }) => {}
        Err(e) => panic!("expected Exited(HeartbeatTimeout), got {e}"),
        Ok(_) => panic!("expected Exited(HeartbeatTimeout), the launch succeeded"),
    }
    assert!(
        took < Duration::from_secs(20),
        "a real exit took {took:?} to report (deadline 60 s)"
    );
}

/// Ring kernels beyond CudaSim's spare streams, launched as the engine launches them: a launch
/// that finds no spare stream parks the resident kernels around `prepare`, which makes more,
/// so no stream is made beside a running block (on the H200 the 35th launch hung in
/// `cuStreamCreate` with 34 kernels resident; CudaSim's strict driver model refuses that call
/// beside running blocks and records the hazard). Every kernel answers afterwards.
#[test]
fn launches_beyond_the_spare_streams_make_no_stream_beside_resident_kernels() {
    use resident_cuda::hazards::DriverCall;
    use resident_engine_cuda::sim::driver::SimContext;

    let src = source("many_streams");
    let opts = opts(None);
    let module = compile_sim(&src).unwrap();
    let ctx = SimContext::get();
    let stream_hazards = || {
        ctx.hazards()
            .iter()
            .filter(|h| h.call == DriverCall::StreamCreate)
            .count()
    };
    let before = stream_hazards();
    let mut kernels = Vec::new();
    // More than one refill's worth (16), all resident at once.
    for _ in 0..20 {
        if SimKernel::<u64, u64>::launch_needs_idle_device(&module, &opts) {
            with_all_quiesced(Duration::from_secs(60), || {
                SimKernel::<u64, u64>::prepare(&module, &opts)
            })
            .expect("the resident kernels parked")
            .expect("streams made while they were parked");
        }
        let k = SimKernel::<u64, u64>::launch_compiled(&module, &src, &[0u8; 8], &opts)
            .expect("a launch with a spare stream");
        k.activate();
        kernels.push(k);
    }
    assert_eq!(
        stream_hazards(),
        before,
        "a stream was made beside resident kernels"
    );
    for (i, k) in kernels.iter_mut().enumerate() {
        let v = i as u64 + 1;
        k.send(Envelope::new(v, 0, 0), v).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    for (i, k) in kernels.iter_mut().enumerate() {
        let mut out = Vec::new();
        while out.is_empty() {
            k.check().unwrap();
            assert!(Instant::now() < deadline, "kernel {i} gave no output");
            k.receive_into(&mut out, 1);
            std::thread::sleep(Duration::from_micros(200));
        }
        assert_eq!(out[0].payload, 2 * (i as u64 + 1));
    }
    for mut k in kernels {
        k.terminate(Duration::from_secs(30)).unwrap();
    }
}

/// What a [`Quiesces`] saw: how many quiesces ran, and the blocks that ran beside the
/// operation of any of them.
type Seen = (u64, Vec<Vec<String>>);

/// Another thread that parks every resident kernel again and again until `stop`, each time
/// for an operation that takes a while (as a module load does), and records any block running
/// meanwhile.
struct Quiesces {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: JoinHandle<Seen>,
}

impl Quiesces {
    fn start() -> Self {
        use resident_engine_cuda::sim::driver::SimContext;
        use std::sync::atomic::{AtomicBool, Ordering};
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let (mut rounds, mut beside) = (0u64, Vec::new());
            while !flag.load(Ordering::Relaxed) {
                let running = with_all_quiesced(Duration::from_secs(60), || {
                    std::thread::sleep(Duration::from_millis(1));
                    SimContext::get().running()
                })
                .expect("every resident kernel parked");
                if !running.is_empty() {
                    beside.push(running);
                }
                rounds += 1;
                // Room between two quiesces for a starting block to report resident (back to
                // back, every relaunch would be parked again before its first look).
                std::thread::sleep(Duration::from_millis(2));
            }
            (rounds, beside)
        });
        Quiesces { stop, thread }
    }

    fn finish(self) -> Seen {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().unwrap()
    }
}

fn assert_none_beside((rounds, beside): Seen) {
    assert!(rounds > 0, "no quiesce ran");
    assert!(
        beside.is_empty(),
        "{} of {rounds} quiesces ran their operation beside running blocks (first: {:?})",
        beside.len(),
        beside.first()
    );
}

/// A launch beside the quiescer, with its module loaded first when it must be.
fn launch_beside(
    module: &resident_engine_cuda::sim::SimModule,
    src: &KernelSource,
    opts: &SimLaunchOptions,
    i: usize,
) -> SimKernel<u64, u64> {
    if SimKernel::<u64, u64>::launch_needs_idle_device(module, opts) {
        with_all_quiesced(Duration::from_secs(60), || {
            SimKernel::<u64, u64>::prepare(module, opts)
        })
        .expect("the resident kernels parked")
        .expect("the module loaded while they were parked");
    }
    SimKernel::<u64, u64>::launch_compiled(module, src, &[0u8; 8], opts)
        .unwrap_or_else(|e| panic!("launch {i}: {e}"))
}

/// Launches on one thread, quiesces on another (as a keyed kernel's first launch beside a
/// forwarding test in the conformance suite): every quiesce's operation must run with no
/// block running. A kernel whose block had started but that was not yet in the registry was
/// not parked, and the quiesce's module load waited for it until the driver model's bound
/// (on a GPU: a hang). The launch now starts the block and registers it in one turn of the
/// quiesce serialization.
#[test]
fn a_quiesce_racing_launches_parks_every_started_block() {
    let src = source("launch_race");
    let opts = opts(None);
    let module = compile_sim(&src).unwrap();
    let quiescer = Quiesces::start();
    for i in 0..24 {
        let mut k = launch_beside(&module, &src, &opts, i);
        k.activate();
        k.terminate(Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("terminate {i}: {e}"));
    }
    assert_none_beside(quiescer.finish());
}

/// Terminates racing quiesces: each kernel ends within its bound, and none is relaunched
/// beside a quiesce's operation. A terminate that came after a quiesce asked the block to
/// park, and before it had, bumped the resume count the launcher then took as already seen:
/// the block stayed parked for good and the terminate timed out (1 in about 30 runs of this
/// file). A parked kernel told to terminate was also relaunched at once, beside the
/// operation of the quiesce that had parked it; now it ends parked, as on a GPU.
#[test]
fn a_terminate_racing_quiesces_ends_every_kernel() {
    let src = source("terminate_race");
    let opts = opts(None);
    let module = compile_sim(&src).unwrap();
    let quiescer = Quiesces::start();
    for round in 0..6 {
        let kernels: Vec<_> = (0..4)
            .map(|i| {
                let k = launch_beside(&module, &src, &opts, round * 4 + i);
                k.activate();
                k
            })
            .collect();
        for (i, mut k) in kernels.into_iter().enumerate() {
            // Staggered so the terminates fall at different points of a quiesce.
            std::thread::sleep(Duration::from_micros(300 * i as u64));
            k.terminate(Duration::from_secs(10))
                .unwrap_or_else(|e| panic!("round {round}, kernel {i}: {e}"));
        }
    }
    assert_none_beside(quiescer.finish());
}
