//! What every example shares: the backend named on the command line. (Each example uses
//! what it needs of this module.)
#![allow(dead_code)]

use resident::prelude::*;

/// The backend named by the first argument (`cpu`, `cuda`, `cuda-sim`, `wgpu`, `auto`;
/// default `cpu`). Exits with a message naming the flag on anything else.
pub fn backend() -> Backend {
    let arg = std::env::args().nth(1).unwrap_or_else(|| "cpu".into());
    match arg.as_str() {
        "cpu" => Backend::Cpu,
        "cuda" => Backend::Cuda,
        "cuda-sim" => Backend::CudaSim,
        "wgpu" => Backend::Wgpu,
        "auto" => Backend::Auto,
        other => {
            eprintln!("unknown backend {other:?}: expected cpu, cuda, cuda-sim, wgpu or auto");
            std::process::exit(2)
        }
    }
}

/// A runtime on [`backend`]; a backend that cannot open is an error (exit 1) with its reason.
pub fn runtime() -> Runtime {
    let b = backend();
    match Runtime::builder().backend(b).build() {
        Ok(rt) => {
            println!("backend: {:?}", rt.backend());
            rt
        }
        Err(e) => {
            eprintln!("{b:?} is not available here: {e} (see resident::guide::troubleshooting)");
            std::process::exit(1)
        }
    }
}
