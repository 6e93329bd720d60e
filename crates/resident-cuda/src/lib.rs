//! # resident-cuda
//!
//! resident's CUDA layer, shaped like cudarc: raw calls loaded at run time at the bottom,
//! owners with `Drop` above them. Nothing here panics when the driver or NVRTC is missing:
//! every entry point first checks that the library is present and returns a typed error.
#![deny(missing_docs)]

pub mod persistent;
