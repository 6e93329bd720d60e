//! Device handlers of the workloads, per backend (sources and the stateless baselines' runners).

pub mod cuda;
