//! Device handlers of the workloads, one module per device language: the sources, their
//! handler builders and the stateless baselines' runners.

pub mod cuda;
pub mod wgsl;
