//! Device handlers of the workloads, one module per device language: the index of every
//! source, handler builder and stateless baseline runner (each workload keeps its own in its
//! folder, and names nothing here: the index imports the workloads, never the other way).

pub mod cuda;
pub mod wgsl;
