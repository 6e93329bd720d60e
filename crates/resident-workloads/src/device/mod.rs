//! Device handlers of the workloads (the sources and their runners), one module per device
//! language.

pub mod wgsl;
