//! # resident-workloads
//!
//! The reference workloads of `resident`, each one ring-kernel definition over buffers bound to
//! the kernel (`RingKernel::bind`), each with a straightforward sequential f64 reference on the
//! host and a stated tolerance:
//!
//! | workload | kernel | reference check |
//! |---|---|---|
//! | [`vector_add`] | actor over bound `a`, `b`, `c`; messages carry offset/length | `|c - (a + b)| <= f32::EPSILON * |a + b|` per element (f32 add is correctly rounded) |
//! | [`pagerank`] | graph in CSR bound to the kernel; full power iteration per message, or streaming edge updates with resident ranks refreshed by residual push | full: same iteration count and per-node relative error `<= 1e-9`; streaming vs recompute: L1 `<= 2 d/(1-d) N tol` |
//! | [`pipeline`] | normalizer -> scorer, kernel to kernel (`ctx.send_to`) | exact (same f64 operations), compared with `1e-12` |
//! | [`anomaly`] | per-sensor EWMA statistics in a bound buffer resident for the kernel's life | same alerts (index, sensor), `z` and final statistics within relative `1e-9` |
//!
//! Every workload also has the stateless baseline the issue compares against ([`anomaly::run_stateless`],
//! [`pagerank::recompute`]).

pub mod anomaly;
pub mod device;
pub mod error;
pub mod input;
pub mod pagerank;
pub mod pipeline;
pub mod rng;
pub mod vector_add;

pub use error::{InputError, WorkloadError};
