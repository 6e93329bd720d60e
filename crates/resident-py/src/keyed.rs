//! Keyed kernels from Python: `keys` per-key states of a numpy structured dtype in one engine
//! keyed kernel (`RingKernel::keyed_from`), every message naming its key in a `uint32` field.
//!
//! The engine does everything keyed: the key-range check at `send` (`KeyOutOfRange`), the
//! per-key order, sharding on the CPU, the device states and `snapshot_keys`. This module only
//! adapts run-time layouts to the engine's compile-time types, as `batch.rs` does:
//!
//! * a message is a record of `N` bytes (`KRec<N>`, N one of [`RECORDS`]) whose last 4 bytes
//!   carry a copy of its key (written by the Python half when it sends), so `Keyed::key`
//!   reads it at a fixed offset; the device handlers read the key from the named field itself;
//! * a key's state is a blob of `M` bytes (`KeyBlob<M>`, M one of [`STATES`]), the state
//!   dtype padded;
//! * the CPU key handler calls the Python function once per message with the GIL (the key,
//!   a writable copy of the key's state, the message) and stores the state back;
//! * a CUDA key handler sees `KeyState` as the state dtype's struct: its source is compiled
//!   after that struct's declaration, with `KeyState` defined as it, behind a small entry
//!   function that casts the blob the engine binds; a WGSL key handler's source is compiled
//!   with the state dtype's struct, which is what the blob's WGSL type names.

use std::sync::Arc;
use std::time::Duration;

use numpy::{PyArray1, PyArrayMethods, PyReadonlyArray1};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use resident::prelude::*;
use resident::ring::message::{CField, DeviceMessage, LayoutError, StructLayout, WgslLayoutError};

use crate::batch::{BatchKernel, BytesReport};
use crate::device::{DeviceSpec, FieldTuple};

/// Record sizes keyed kernels are instantiated for (the last 4 bytes hold the key's copy).
pub(crate) const RECORDS: [usize; 5] = [16, 32, 64, 128, 256];
/// Per-key state sizes keyed kernels are instantiated for.
pub(crate) const STATES: [usize; 6] = [8, 16, 32, 64, 128, 256];

/// The name of the per-key state struct declared for device handlers.
const STATE_NAME: &str = "ResidentKeyState";
/// The CUDA entry function that hands the user's handler its typed state.
const CUDA_ENTRY: &str = "resident_keyed_entry";

/// A keyed kernel's message: `N` bytes, its key copied into the last 4 (little-endian).
#[repr(transparent)]
#[derive(Clone, Copy)]
pub(crate) struct KRec<const N: usize>(pub [u8; N]);

// SAFETY: a transparent wrapper of a byte array: no padding, every bit pattern valid, all zeros
// valid.
unsafe impl<const N: usize> bytemuck::Zeroable for KRec<N> {}
// SAFETY: as above; `Copy` and `'static`.
unsafe impl<const N: usize> bytemuck::Pod for KRec<N> {}

impl<const N: usize> Keyed for KRec<N> {
    #[inline]
    fn key(&self) -> u32 {
        let mut b = [0u8; 4];
        b.copy_from_slice(&self.0[N - 4..]);
        u32::from_le_bytes(b)
    }
}

impl<const N: usize> CField for KRec<N> {
    fn c_field(name: &str) -> String {
        format!("unsigned char {name}[{N}]")
    }
}

/// Needed by `CudaHandler::keyed`'s bounds only: the handler's layouts come from the dtypes
/// (`CudaHandler::with_layouts`), never from these.
impl<const N: usize> DeviceMessage for KRec<N> {
    const C_NAME: &'static str = "ResidentKeyedRecord";
    fn c_declaration() -> String {
        String::new()
    }
    fn wgsl_struct(_name: &str, _atomic: bool) -> Result<String, WgslLayoutError> {
        Err(WgslLayoutError::new(
            "ResidentKeyedRecord",
            "declared from its numpy dtype",
        ))
    }
}

/// A key's state: `M` bytes (the state dtype padded), 8-byte aligned.
#[repr(C, align(8))]
#[derive(Clone, Copy)]
pub(crate) struct KeyBlob<const M: usize>(pub [u8; M]);

// SAFETY: `M` is a multiple of 8 (one of `STATES`), so the 8-byte alignment adds no padding;
// every bit pattern of the bytes is valid, all zeros included.
unsafe impl<const M: usize> bytemuck::Zeroable for KeyBlob<M> {}
// SAFETY: as above; `Copy` and `'static`.
unsafe impl<const M: usize> bytemuck::Pod for KeyBlob<M> {}

impl<const M: usize> CField for KeyBlob<M> {
    fn c_field(name: &str) -> String {
        format!("ResidentKeyBlob{M} {name}")
    }
    fn c_dependencies(out: &mut Vec<String>) {
        let d = format!(
            "typedef struct {{ unsigned long long w[{}]; }} ResidentKeyBlob{M};\n",
            M / 8
        );
        if !out.contains(&d) {
            out.push(d);
        }
    }
    fn wgsl_type(_atomic: bool) -> Result<String, WgslLayoutError> {
        // Declared in the handler's source (see `wgsl_source`), `M` bytes.
        Ok(STATE_NAME.to_string())
    }
}

/// The CUDA source: the state struct, the user's source with `KeyState` as that struct, and
/// the entry function the engine calls with the blob it binds.
fn cuda_source(state: &StructLayout, user: &str, function: &str) -> String {
    format!(
        "{decl}static_assert(sizeof({name}) == sizeof(KeyState), \"key state size\");\n\
         #define KeyState {name}\n#line 1 \"handler.cu\"\n{user}\n#undef KeyState\n\
         __device__ bool {CUDA_ENTRY}(KeyState* ks, const ResidentIn* in, ResidentOut* out, \
         const Envelope* env) {{\n    return {function}(reinterpret_cast<{name}*>(ks), in, out, env);\n}}\n",
        decl = state.c_declaration(),
        name = STATE_NAME,
    )
}

/// The WGSL source: the state struct (what `KeyState` aliases) and the user's source.
fn wgsl_source(state: &StructLayout, user: &str) -> Result<String, LayoutError> {
    let decl = state
        .wgsl_struct(STATE_NAME, false)
        .map_err(|e| LayoutError {
            layout: "state_dtype".into(),
            field: None,
            reason: e.to_string(),
        })?;
    Ok(format!("{decl}\n{user}"))
}

/// What keyed kernels of any sizes do for the Python half.
pub(crate) trait KeyedOps: Send + Sync {
    /// How many keys.
    fn keys(&self) -> u32;
    /// Sends whole records (keys already copied in); how many were taken.
    fn send_bytes(&self, bytes: &[u8]) -> resident::Result<usize>;
    /// The states of keys `start..end`, `M` bytes each.
    fn snapshot(&self, start: u32, end: u32) -> resident::Result<Vec<u8>>;
}

/// A launched keyed kernel of records of `N` bytes and states of `M`.
struct KeyedKern<const N: usize, const M: usize> {
    h: KernelHandle<KRec<N>, KRec<N>>,
    keys: u32,
}

fn flat<const N: usize>(v: impl IntoIterator<Item = KRec<N>>) -> Vec<u8> {
    v.into_iter().flat_map(|r| r.0).collect()
}

fn bytes_report<const N: usize>(r: TerminateReport<KRec<N>, KRec<N>>) -> BytesReport {
    let mut undelivered = Vec::new();
    if let Some((_, Some((_, m)))) = &r.failure {
        undelivered.extend_from_slice(&m.0);
    }
    undelivered.extend(flat(r.undelivered.iter().map(|(_, m)| *m)));
    BytesReport {
        processed: r.processed,
        dropped: r.dropped,
        unreceived: flat(r.unreceived.iter().map(|(_, m)| *m)),
        undelivered,
        failure: r.failure.map(|(reason, _)| reason.to_string()),
    }
}

fn recs<const N: usize>(bytes: &[u8]) -> Vec<KRec<N>> {
    bytes
        .chunks_exact(N)
        .map(|c| KRec(c.try_into().expect("chunks of N bytes")))
        .collect()
}

impl<const N: usize, const M: usize> KeyedOps for KeyedKern<N, M> {
    fn keys(&self) -> u32 {
        self.keys
    }
    fn send_bytes(&self, bytes: &[u8]) -> resident::Result<usize> {
        self.h.send_batch(&recs::<N>(bytes))
    }
    fn snapshot(&self, start: u32, end: u32) -> resident::Result<Vec<u8>> {
        let v = self.h.snapshot_keys::<KeyBlob<M>>(start..end)?;
        Ok(v.into_iter().flat_map(|b| b.0).collect())
    }
}

impl<const N: usize, const M: usize> BatchKernel for KeyedKern<N, M> {
    fn record(&self) -> usize {
        N
    }
    fn ops(&self) -> &dyn crate::KernelOps {
        &self.h
    }
    fn input_room(&self) -> usize {
        self.h.input_room()
    }
    fn send_bytes(&self, bytes: &[u8]) -> resident::Result<usize> {
        KeyedOps::send_bytes(self, bytes)
    }
    fn recv_bytes(&self, max: usize, wait: Duration) -> resident::Result<Vec<u8>> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let mut out: Vec<KRec<N>> = Vec::with_capacity(max.min(65536));
        self.h.receive_batch(&mut out, max)?;
        if out.is_empty() && !wait.is_zero() {
            match self.h.receive(wait) {
                Ok(first) => {
                    out.push(first);
                    self.h.receive_batch(&mut out, max - 1)?;
                }
                Err(Error::Timeout { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(flat(out))
    }
    fn terminate(&self, timeout: Option<Duration>) -> resident::Result<BytesReport> {
        let r = match timeout {
            Some(t) => self.h.terminate_within(t)?,
            None => self.h.terminate()?,
        };
        Ok(bytes_report(r))
    }
    fn report_of(&self, r: KernelReport) -> Option<BytesReport> {
        r.into_typed::<KRec<N>, KRec<N>>().ok().map(bytes_report)
    }
    fn placement(&self) -> String {
        match self.h.placement() {
            Placement::Host => "host".into(),
            Placement::Device(kind) => format!("{kind:?}").to_ascii_lowercase(),
        }
    }
    fn snapshot_state(&self, _size: usize) -> resident::Result<Vec<u8>> {
        Err(Error::InvalidConfig {
            id: self.h.id().to_string(),
            reason: "a keyed kernel's states are read with snapshot_keys".into(),
        })
    }
    fn read_buffer(&self, name: &str, _code: &str, _t: Duration) -> Result<Vec<u8>, BindError> {
        Err(BindError::UnknownBuffer {
            kernel: self.h.id().to_string(),
            name: name.to_string(),
        })
    }
    fn write_buffer(
        &self,
        name: &str,
        _code: &str,
        _bytes: &[u8],
        _t: Duration,
    ) -> Result<(), BindError> {
        Err(BindError::UnknownBuffer {
            kernel: self.h.id().to_string(),
            name: name.to_string(),
        })
    }
}

/// Why a keyed kernel did not launch.
enum LaunchError {
    Engine(Error),
    Layout(LayoutError),
}

/// Everything a launch needs, whatever the sizes.
struct Args<'a> {
    rt: &'a resident::runtime::Runtime,
    id: String,
    queue_size: usize,
    policy: Backpressure,
    lanes: usize,
    max_batch: Option<usize>,
    workers: usize,
    /// `keys * M` bytes.
    states: Vec<u8>,
    /// Bytes of one state record as the dtype has them (the rest of `M` is padding).
    state_itemsize: usize,
    key_field: String,
    runner: Py<PyAny>,
    func: Py<PyAny>,
    device: Option<(&'a DeviceSpec, StructLayout)>,
    /// The kernel's bell, rung by the engine once a batch's outputs are published.
    bell: Arc<crate::waker::Bell>,
    /// A `numba=` handler's native form (its address, and the Python object that owns it):
    /// the CPU engine calls it for each message in place of the Python key handler.
    native: Option<(usize, Py<PyAny>)>,
}

/// The C signature of a `numba=` handler's native form (`template::EXTERNAL_FN_SIGNATURE`).
type NativeFn = unsafe extern "C" fn(*mut u8, *const u8, *mut u8, *const u8) -> i32;

type Launched = (Arc<dyn BatchKernel>, Arc<dyn KeyedOps>);

fn launch_nm<const N: usize, const M: usize>(a: Args<'_>) -> Result<Launched, LaunchError> {
    let bell = a.bell.clone();
    let take_bell = a.bell.clone();
    let states: Vec<KeyBlob<M>> = a
        .states
        .chunks_exact(M)
        .map(|c| KeyBlob(c.try_into().expect("chunks of M bytes")))
        .collect();
    let keys = states.len() as u32;
    let mut k = RingKernel::<KRec<N>, KRec<N>>::new(a.id)
        .queue_size(a.queue_size)
        .priority_lanes(a.lanes)
        .backpressure(a.policy)
        .keyed_from(states)
        .workers(a.workers)
        // The outputs are published after the whole batch (not by the key handler): the
        // engine's hook rings the bell then, waking the event loops awaiting them.
        .on_publish(move || bell.ring())
        // Inputs taken: room for a sender awaiting it under `block` (rings only while one
        // waits).
        .on_take(move || take_bell.ring_room());
    if let Some(b) = a.max_batch {
        k = k.batch_size(b);
    }
    if let Some((d, state)) = &a.device {
        if let Some(src) = &d.cuda {
            let h = CudaHandler::<KRec<N>, KRec<N>>::with_layouts(
                cuda_source(state, &src.text, &src.function),
                &d.input,
                &d.output,
            )
            .map_err(LaunchError::Layout)?
            .function(CUDA_ENTRY)
            .keyed::<KeyBlob<M>>(a.key_field.clone());
            let h = match &src.external {
                Some(f) => h.external(f.clone()),
                None => h,
            };
            k = k.key_cuda(h);
        }
        if let Some(src) = &d.wgsl {
            let h = WgslHandler::<KRec<N>, KRec<N>>::with_layouts(
                wgsl_source(state, &src.text).map_err(LaunchError::Layout)?,
                &d.input,
                &d.output,
            )
            .map_err(LaunchError::Layout)?
            .function(src.function.clone())
            .workgroup_size(d.workgroup_size)
            .keyed(a.key_field.clone());
            k = k.key_wgsl(h);
        }
    }
    if let Some((addr, owner)) = a.native {
        // SAFETY: `addr` is a Numba `cfunc` of exactly `NativeFn`'s signature (the Python
        // package compiles it so), kept alive by `owner`, which the closure holds.
        let f: NativeFn = unsafe { std::mem::transmute::<usize, NativeFn>(addr) };
        let k = k.key_handler(move |ks: &mut KeyContext<'_, KeyBlob<M>>, m: KRec<N>| {
            let _owner = &owner;
            let env = *ks.envelope();
            // The records 8-byte aligned, as the dtypes' fields expect (C offsets).
            let input = KeyBlob::<N>(m.0);
            let mut out = KeyBlob::<N>([0u8; N]);
            // SAFETY: the function reads the message's record (`N` bytes, its fields at the
            // front), the envelope (32 bytes) and reads and writes the key's state (`M`
            // bytes, the dtype's at the front) and the output record (`N` bytes), each valid
            // and unaliased for the call; it touches nothing else (no Python objects).
            let sent = unsafe {
                f(
                    ks.state_mut().0.as_mut_ptr(),
                    input.0.as_ptr(),
                    out.0.as_mut_ptr(),
                    (&env as *const resident::ring::Envelope).cast(),
                )
            };
            (sent != 0).then_some(KRec(out.0))
        });
        let h = a.rt.launch(k).map_err(LaunchError::Engine)?;
        let kern = Arc::new(KeyedKern::<N, M> { h, keys });
        return Ok((
            kern.clone() as Arc<dyn BatchKernel>,
            kern as Arc<dyn KeyedOps>,
        ));
    }
    let (runner, func, isz) = (a.runner, a.func, a.state_itemsize);
    let k = k.key_handler(move |ks: &mut KeyContext<'_, KeyBlob<M>>, m: KRec<N>| {
        let key = ks.key();
        let r = Python::attach(|py| -> PyResult<Option<KRec<N>>> {
            let st = PyArray1::from_slice(py, &ks.state().0[..isz]);
            let msg = PyArray1::from_slice(py, &m.0[..]);
            let out = runner.call1(py, (func.clone_ref(py), key, &st, msg))?;
            ks.state_mut().0[..isz].copy_from_slice(st.readonly().as_slice()?);
            if out.is_none(py) {
                return Ok(None);
            }
            let out = out.extract::<PyReadonlyArray1<'_, u8>>(py)?;
            let s = out.as_slice()?;
            if s.len() > N {
                return Err(PyValueError::new_err(format!(
                    "key handler output of {} bytes exceeds the record's {N}",
                    s.len()
                )));
            }
            let mut rec = [0u8; N];
            rec[..s.len()].copy_from_slice(s);
            Ok(Some(KRec(rec)))
        });
        match r {
            Ok(o) => o,
            Err(e) => {
                // Fails the kernel with the text and traceback (the engine catches the unwind).
                let reason = Python::attach(|py| crate::py_failure(py, e));
                std::panic::resume_unwind(Box::new(format!("Python key handler raised: {reason}")))
            }
        }
    });
    let h = a.rt.launch(k).map_err(LaunchError::Engine)?;
    let kern = Arc::new(KeyedKern::<N, M> { h, keys });
    Ok((
        kern.clone() as Arc<dyn BatchKernel>,
        kern as Arc<dyn KeyedOps>,
    ))
}

fn launch_n<const N: usize>(state_size: usize, a: Args<'_>) -> Result<Launched, LaunchError> {
    macro_rules! by_state {
        ($($m:literal),*) => {
            match state_size {
                $($m => launch_nm::<N, $m>(a),)*
                other => Err(LaunchError::Engine(Error::InvalidConfig {
                    id: a.id,
                    reason: format!("a key state of {other} bytes: expected one of {STATES:?}"),
                })),
            }
        };
    }
    by_state!(8, 16, 32, 64, 128, 256)
}

fn launch_any(record: usize, state_size: usize, a: Args<'_>) -> Result<Launched, LaunchError> {
    macro_rules! by_record {
        ($($n:literal),*) => {
            match record {
                $($n => launch_n::<$n>(state_size, a),)*
                other => Err(LaunchError::Engine(Error::InvalidConfig {
                    id: a.id,
                    reason: format!("a keyed record of {other} bytes: expected one of {RECORDS:?}"),
                })),
            }
        };
    }
    by_record!(16, 32, 64, 128, 256)
}

/// The Python exception of an engine error on a keyed kernel: `KeyOutOfRange` (its `detail`
/// the key) for a key the kernel does not have, else as for every kernel.
fn keyed_error(py: Python<'_>, e: &Error) -> PyErr {
    match e {
        Error::KeyOutOfRange { key, .. } => crate::build(
            py,
            crate::Described {
                class: "KeyOutOfRange",
                text: e.to_string(),
                id: e.kernel_id().map(str::to_string),
                detail: Some(key.to_string()),
            },
            None,
        ),
        other => crate::engine_error(py, other),
    }
}

/// A launched keyed kernel as the Python half holds it (sends and snapshots; every other
/// operation goes through the runtime by id, as for batch kernels).
#[pyclass(frozen, module = "resident._resident")]
pub(crate) struct KeyedHandle(Arc<dyn KeyedOps>);

#[pymethods]
impl KeyedHandle {
    /// How many keys.
    #[getter]
    fn keys(&self) -> u32 {
        self.0.keys()
    }

    /// Sends whole records (each with its key copied into its last 4 bytes); returns how many
    /// were taken. A key out of range refuses the whole batch (`KeyOutOfRange`).
    fn send_batch(&self, py: Python<'_>, data: PyReadonlyArray1<'_, u8>) -> PyResult<usize> {
        let bytes = data.as_slice()?;
        if bytes.is_empty() {
            return Ok(0);
        }
        let k = self.0.clone();
        py.detach(|| k.send_bytes(bytes))
            .map_err(|e| keyed_error(py, &e))
    }

    /// The states of keys `start..stop` as bytes (`M` per key), read between two batches.
    fn snapshot_keys<'py>(
        &self,
        py: Python<'py>,
        start: u32,
        stop: u32,
    ) -> PyResult<Bound<'py, PyArray1<u8>>> {
        let k = self.0.clone();
        let v = py
            .detach(|| k.snapshot(start, stop))
            .map_err(|e| keyed_error(py, &e))?;
        Ok(PyArray1::from_vec(py, v))
    }
}

/// Launches a keyed kernel on `rt` and registers it there as a batch kernel of `record`-byte
/// records (lifecycle, receive and terminate by id). `states` holds `state_size` bytes per
/// key (the initial states, padded); `state_fields` (the state dtype's fields) are needed
/// when `device` has a handler.
#[pyfunction]
#[pyo3(signature = (rt, kernel_id, record, state_size, state_itemsize, states, key_field, runner, func, queue_size, backpressure, block_timeout, priority_lanes, max_batch, workers, device=None, state_fields=None, state_origin=String::new(), native=None))]
#[allow(clippy::too_many_arguments)]
fn launch_keyed(
    py: Python<'_>,
    rt: &Bound<'_, crate::runtime::PyRuntime>,
    kernel_id: String,
    record: usize,
    state_size: usize,
    state_itemsize: usize,
    states: PyReadonlyArray1<'_, u8>,
    key_field: String,
    runner: Py<PyAny>,
    func: Py<PyAny>,
    queue_size: usize,
    backpressure: &str,
    block_timeout: f64,
    priority_lanes: usize,
    max_batch: Option<usize>,
    workers: usize,
    device: Option<Py<DeviceSpec>>,
    state_fields: Option<Vec<FieldTuple>>,
    state_origin: String,
    native: Option<(usize, Py<PyAny>)>,
) -> PyResult<KeyedHandle> {
    let policy = crate::parse_policy(backpressure, block_timeout)?;
    if queue_size == 0 || max_batch == Some(0) || workers == 0 {
        return Err(PyValueError::new_err(
            "queue_size, max_batch and workers must be at least 1",
        ));
    }
    if state_itemsize > state_size || state_size == 0 {
        return Err(PyValueError::new_err(format!(
            "a state of {state_itemsize} bytes does not fit {state_size}"
        )));
    }
    let states = states.as_slice()?.to_vec();
    if states.is_empty() || !states.len().is_multiple_of(state_size) {
        return Err(PyValueError::new_err(format!(
            "{} bytes of states are not whole states of {state_size} bytes (at least one key)",
            states.len()
        )));
    }
    let dev = match &device {
        Some(d) => {
            let Some(fields) = state_fields else {
                return Err(PyValueError::new_err(
                    "a keyed device handler needs the state dtype's fields",
                ));
            };
            let l = crate::device::layout(py, STATE_NAME, &state_origin, fields, state_size)?;
            Some((d.get(), l))
        }
        None => None,
    };
    let pyrt = rt.get();
    let bell = Arc::new(crate::waker::Bell::default());
    let guard = pyrt.rt.lock();
    let engine = guard
        .as_ref()
        .ok_or_else(|| PyRuntimeError::new_err("the runtime was shut down"))?;
    let args = Args {
        rt: engine,
        id: kernel_id.clone(),
        queue_size,
        policy,
        lanes: priority_lanes,
        max_batch,
        workers,
        states,
        state_itemsize,
        key_field,
        runner,
        func,
        device: dev,
        bell: bell.clone(),
        native,
    };
    let (batch, ops) = py
        .detach(|| launch_any(record, state_size, args))
        .map_err(|e| match e {
            LaunchError::Engine(e) => crate::engine_error(py, &e),
            LaunchError::Layout(e) => crate::device::layout_error(py, &e),
        })?;
    drop(guard);
    pyrt.bells.lock().insert(kernel_id.clone(), bell);
    pyrt.batch.lock().insert(kernel_id, batch);
    Ok(KeyedHandle(ops))
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<KeyedHandle>()?;
    m.add_function(wrap_pyfunction!(launch_keyed, m)?)?;
    m.add("KEYED_RECORD_SIZES", RECORDS.to_vec())?;
    m.add("KEYED_STATE_SIZES", STATES.to_vec())?;
    Ok(())
}
