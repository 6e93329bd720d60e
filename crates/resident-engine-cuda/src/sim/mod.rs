//! CudaSim: CUDA C source compiled by the host C++ compiler against our shim header
//! (`kernels/sim_shim.h`) into a shared object, loaded at run time and run on host threads:
//! one OS thread per CUDA thread of a block, blocks of a grid one after another.
//!
//! This runs *the same source* as the GPU (the ring-kernel template with the user's handler, or
//! a one-shot kernel), so a CUDA handler can be run, tested and debugged on a machine without a
//! GPU. It does not say anything about GPU performance or about GPU-only behaviour (warp
//! scheduling, memory coalescing, PCIe); see the shim header for the exact semantics.
//!
//! * [`SimModule::compile`] compiles (or finds in the disk cache, keyed by the hash of source,
//!   options and compiler version) a shared object exporting one launcher per entry;
//! * [`SimModule::instantiate`] loads a private copy of it (its `__shared__` variables and
//!   thread-locals belong to that copy alone), and [`SimInstance::launch`] runs an entry over a
//!   grid and returns after every thread has exited, with [`SimError::Fault`] when a thread
//!   called `__trap()` or took a hardware fault ([`fault`]).
//!
//! Beside it: the driver model that makes CudaSim's driver calls wait as the GPU's do
//! ([`driver`]), the hardware-fault containment ([`fault`]), the bus model ([`bus`]) and, with
//! the `cudasim` feature, the CudaSim engine itself ([`engine`]: ring kernels, memory and
//! one-shot kernels on host threads).

pub mod bus;
pub mod driver;
#[cfg(feature = "cudasim")]
pub mod engine;
pub mod fault;

use std::ffi::c_void;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use resident_cuda::cache::Fnv128;

/// The shim header put in front of every CudaSim translation unit.
pub const SHIM_HEADER: &str = include_str!("../../kernels/sim_shim.h");

/// Environment variable naming the host C++ compiler (default `g++`).
pub const CXX_ENV: &str = "RESIDENT_SIM_CXX";

/// ABI of the exported launchers; part of the cache key.
const ABI: &str = "resident-sim-2";

/// Errors of the CudaSim layer.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The host C++ compiler cannot be run.
    #[error("host C++ compiler `{compiler}` is not usable for CudaSim: {reason}")]
    CompilerUnavailable {
        /// The compiler command.
        compiler: String,
        /// Why.
        #[source]
        reason: CompilerFault,
    },
    /// The source failed to compile; `log` is the compiler's diagnostics (it names what the
    /// shim lacks, e.g. "'__syncthreads_count' was not declared in this scope").
    #[error("`{name}` failed to compile for CudaSim with {compiler}:\n{log}")]
    Compile {
        /// Program name.
        name: String,
        /// Compiler version line.
        compiler: String,
        /// The compiler's diagnostics.
        log: String,
    },
    /// The compile ran past its wall-time limit ([`resident_limits`]) and was killed, with every
    /// process it had started.
    #[error("`{name}` did not compile for CudaSim within {limit:?} (the compile was stopped; {env} sets the limit)", env = resident_limits::TIMEOUT_ENV)]
    CompileTimeout {
        /// Program name (at most 64 bytes).
        name: String,
        /// The limit.
        limit: std::time::Duration,
    },
    /// The compile ran out of its address-space limit ([`resident_limits`]): its allocations
    /// failed and it stopped, or the system killed it for memory.
    #[error("`{name}` ran out of memory compiling for CudaSim (limit {} MiB; {env} sets it)", limit_bytes >> 20, env = resident_limits::MEMORY_ENV)]
    CompileOutOfMemory {
        /// Program name (at most 64 bytes).
        name: String,
        /// The limit.
        limit_bytes: u64,
    },
    /// The compiler crashed (a signal, or an internal compiler error) on the source.
    #[error("the host C++ compiler crashed on `{name}`: {reason}")]
    CompileCrashed {
        /// Program name (at most 64 bytes).
        name: String,
        /// The signal or the compiler's report (at most 256 bytes).
        reason: String,
    },
    /// The compiled source holds inline assembly or an assembler directive that reads a file
    /// (`.incbin`, `.include`, or a macro that could spell one): refused before the assembler
    /// runs, since the host's assembler would read any file of the host into the kernel. A GPU
    /// handler's `asm` is PTX, which never ran on CudaSim.
    #[error("kernel `{name}` is refused on CudaSim: {what}; CudaSim compiles for the host, whose assembler reads the host's files (`.incbin`), so a handler may hold no inline assembly (a GPU handler's PTX `asm` does not run here)")]
    ForbiddenAssembly {
        /// Program name (at most 64 bytes).
        name: String,
        /// What was found.
        what: String,
    },
    /// A compile limit's setting is not a number ([`resident_limits`]).
    #[error(transparent)]
    CompileLimitSetting(#[from] resident_limits::BadLimit),
    /// The disk cache could not be used.
    #[error("CudaSim cache {path}: {source}")]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The shared object could not be loaded.
    #[error("loading CudaSim object {path}: {source}")]
    Load {
        /// The object.
        path: PathBuf,
        /// The cause.
        #[source]
        source: libloading::Error,
    },
    /// The entry is not exported by the module.
    #[error("CudaSim module `{module}` has no kernel entry `{entry}`")]
    NoEntry {
        /// Module name.
        module: String,
        /// The entry asked for.
        entry: String,
    },
    /// The launch itself was invalid (argument count or sizes, geometry).
    #[error("invalid CudaSim launch of `{entry}`: {reason}")]
    BadLaunch {
        /// The entry.
        entry: String,
        /// Why.
        reason: String,
    },
    /// A driver call on a context that a device fault lost: the driver's
    /// `CUDA_ERROR_LAUNCH_FAILED`, sticky until the context is reset (see
    /// [`crate::sim::driver`]).
    #[error("{call}: CUDA_ERROR_LAUNCH_FAILED (CudaSim's context was lost by a device fault in `{entry}`: {reason})")]
    ContextLost {
        /// The call that failed.
        call: resident_cuda::hazards::DriverCall,
        /// The kernel entry whose fault lost the context.
        entry: String,
        /// The fault.
        reason: String,
    },
    /// A driver call that waits for the whole device was made while kernels ran and did not
    /// finish within the model's wait: on a GPU this call would not return while they are
    /// resident (see [`resident_cuda::hazards`]).
    #[error("{call} waits for every kernel of the context, and {} still ran after {waited:?}: on a GPU this call would hang while they are resident", running_names(running))]
    WouldWaitForDevice {
        /// The call.
        call: resident_cuda::hazards::DriverCall,
        /// The kernels whose blocks were running.
        running: Vec<String>,
        /// How long the model waited.
        waited: std::time::Duration,
    },
    /// A thread of the kernel faulted (`__trap()`, or a hardware fault such as an illegal
    /// address: [`crate::sim::fault`]): the block stopped.
    #[error("device fault in `{entry}` (CudaSim): {reason}")]
    Fault {
        /// The entry.
        entry: String,
        /// What faulted, and where.
        reason: String,
    },
}

/// Why the host C++ compiler cannot be used. `Clone` (the I/O error is shared): the first
/// answer is cached for the process.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CompilerFault {
    /// The compiler could not be started (not installed, not executable, ...).
    #[error("cannot run it: {0}")]
    Run(#[source] Arc<std::io::Error>),
    /// `<compiler> --version` ran and failed; `stderr` is what it printed.
    #[error("`--version` failed: {stderr}")]
    Version {
        /// The compiler's standard error.
        stderr: String,
    },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> SimError + '_ {
    move |source| SimError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The host compiler command and its version line.
pub fn compiler() -> Result<(String, String), SimError> {
    static VERSION: OnceLock<Result<(String, String), CompilerFault>> = OnceLock::new();
    let cxx = std::env::var(CXX_ENV)
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "g++".into());
    VERSION
        .get_or_init(|| match Command::new(&cxx).arg("--version").output() {
            Ok(o) if o.status.success() => {
                let v = String::from_utf8_lossy(&o.stdout);
                Ok((
                    cxx.clone(),
                    v.lines().next().unwrap_or_default().to_string(),
                ))
            }
            Ok(o) => Err(CompilerFault::Version {
                stderr: String::from_utf8_lossy(&o.stderr).trim().to_string(),
            }),
            Err(e) => Err(CompilerFault::Run(Arc::new(e))),
        })
        .clone()
        .map_err(|reason| SimError::CompilerUnavailable {
            compiler: cxx,
            reason,
        })
}

/// Whether CudaSim can compile here (a host C++ compiler runs).
pub fn available() -> bool {
    compiler().is_ok()
}

/// How to compile a CudaSim module.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct SimOptions {
    /// Extra compiler arguments (e.g. `-DNAME=1`).
    pub extra: Vec<String>,
    /// The compile's wall-time and memory limits; `None`: [`CompileLimits::from_env`]
    /// (`RESIDENT_COMPILE_TIMEOUT_S`, `RESIDENT_COMPILE_MEMORY_MB`, else 120 s and 4 GiB).
    /// Not part of the cache key: a cached module pays no compile.
    ///
    /// [`CompileLimits::from_env`]: resident_limits::CompileLimits::from_env
    pub limits: Option<resident_limits::CompileLimits>,
}

/// The folder of compiled CudaSim objects: `<kernel cache>/sim`.
pub fn cache_dir() -> PathBuf {
    resident_cuda::cache::KernelCache::default_dir()
        .unwrap_or_else(|| std::env::temp_dir().join("resident-kernels"))
        .join("sim")
}

/// The full translation unit: shim, `source` (with its own line numbers), exports.
pub fn translation_unit(name: &str, source: &str, entries: &[&str]) -> String {
    let mut tu = String::with_capacity(SHIM_HEADER.len() + source.len() + 256);
    tu.push_str(SHIM_HEADER);
    tu.push_str(&format!(
        "\n#line 1 \"{}.cu\"\n",
        name.replace(['"', '\\', '\n'], "_")
    ));
    tu.push_str(source);
    tu.push_str("\n#line 1 \"resident-sim-exports\"\n");
    for e in entries {
        tu.push_str(&format!("RESIDENT_SIM_EXPORT({e})\n"));
    }
    tu
}

/// What in the compiler's assembly output `asm` could make the assembler read a file of the
/// host, if anything: inline assembly (g++ brackets every `asm` statement, at file scope or in
/// a function, with `#APP` and `#NO_APP`), or anywhere in the text (an asm label or a section
/// name can carry a directive too; `;` separates statements) a directive that reads a file or a
/// macro facility that could spell one, in any case. The shim, the template and the C++
/// standard headers they use emit none of these.
pub fn check_assembly(asm: &[u8]) -> Option<String> {
    const DIRECTIVES: [&str; 9] = [
        ".incbin",
        ".include",
        ".macro",
        ".irp",
        ".irpc",
        ".rept",
        ".altmacro",
        ".purgem",
        ".exitm",
    ];
    if asm.windows(4).any(|w| w == b"#APP") {
        return Some("it holds inline assembly (`asm`)".into());
    }
    let lower = asm.to_ascii_lowercase();
    for d in DIRECTIVES {
        if lower.windows(d.len()).any(|w| w == d.as_bytes()) {
            return Some(format!("its assembly holds the directive `{d}`"));
        }
    }
    None
}

fn is_identifier(s: &str) -> bool {
    let mut c = s.chars();
    matches!(c.next(), Some(x) if x.is_ascii_alphabetic() || x == '_')
        && c.all(|x| x.is_ascii_alphanumeric() || x == '_')
}

static UNIQUE: AtomicU64 = AtomicU64::new(0);

fn unique_suffix() -> String {
    format!(
        "{}.{}",
        std::process::id(),
        UNIQUE.fetch_add(1, Ordering::Relaxed)
    )
}

/// A compiled CudaSim shared object on disk.
#[derive(Clone, Debug)]
pub struct SimModule {
    name: String,
    path: PathBuf,
    entries: Vec<String>,
    cached: bool,
}

impl SimModule {
    /// Compiles `source` exporting `entries` (each an `extern "C" __global__` function), or
    /// takes it from the disk cache. Errors: [`SimError::CompilerUnavailable`],
    /// [`SimError::Compile`] with the compiler's diagnostics, [`SimError::Io`].
    pub fn compile(
        name: &str,
        source: &str,
        entries: &[&str],
        options: &SimOptions,
    ) -> Result<SimModule, SimError> {
        Self::compile_in(&cache_dir(), name, source, entries, options)
    }

    /// [`compile`](Self::compile) with an explicit cache folder.
    pub fn compile_in(
        dir: &Path,
        name: &str,
        source: &str,
        entries: &[&str],
        options: &SimOptions,
    ) -> Result<SimModule, SimError> {
        let (cxx, version) = compiler()?;
        let limits = match options.limits {
            Some(l) => l,
            None => resident_limits::CompileLimits::from_env()?,
        };
        if let Some(bad) = entries.iter().find(|e| !is_identifier(e)) {
            return Err(SimError::BadLaunch {
                entry: bad.to_string(),
                reason: "an entry name must be a C identifier".into(),
            });
        }
        let tu = translation_unit(name, source, entries);
        let mut args: Vec<String> = [
            "-std=c++20",
            "-O2",
            "-fPIC",
            "-shared",
            "-pthread",
            "-fvisibility=hidden",
            // A handler's frame larger than a page probes each page, so a stack overflow
            // meets the thread's guard page (a device fault: `sim_fault`) instead of jumping
            // over it into another thread's stack.
            "-fstack-clash-protection",
            "-x",
            "c++",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(options.extra.iter().cloned());
        let mut h = Fnv128::default();
        h.field(ABI.as_bytes());
        h.field(tu.as_bytes());
        for a in &args {
            h.field(a.as_bytes());
        }
        h.field(cxx.as_bytes());
        h.field(version.as_bytes());
        let key = format!("{:032x}", h.finish());
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
        let path = dir.join(format!("{key}.so"));
        let module = |cached| SimModule {
            name: name.to_string(),
            path: path.clone(),
            entries: entries.iter().map(|s| s.to_string()).collect(),
            cached,
        };
        if path.is_file() {
            return Ok(module(true));
        }
        let suffix = unique_suffix();
        let src = dir.join(format!("{key}.{suffix}.cpp"));
        let asm = dir.join(format!("{key}.{suffix}.s"));
        let tmp = dir.join(format!("{key}.{suffix}.so.tmp"));
        let cleanup = || {
            for f in [&src, &asm, &tmp] {
                let _ = std::fs::remove_file(f);
            }
        };
        std::fs::write(&src, &tu).map_err(io_err(&src))?;
        let qname = resident_ring::message::quoted_name(name);
        // Two child processes under limits (resident_limits), as the source comes from users:
        // C++ to assembly, then, once the assembly is known to read no file of the host
        // (`check_assembly`), assembly to the shared object.
        let step = |cmd: &mut Command| -> Result<(), SimError> {
            let ended =
                resident_limits::run(cmd, &limits).map_err(|e| SimError::CompilerUnavailable {
                    compiler: cxx.clone(),
                    reason: CompilerFault::Run(Arc::new(e)),
                })?;
            match ended {
                resident_limits::Ended::Exited { success: true, .. } => Ok(()),
                resident_limits::Ended::Exited { stderr, .. } => {
                    let log = String::from_utf8_lossy(&stderr)
                        .replace(&*src.to_string_lossy(), "sim_shim.h");
                    Err(SimError::Compile {
                        name: qname.clone(),
                        compiler: version.clone(),
                        // The diagnostics quote each offending source line: kept bounded.
                        log: resident_cuda::error::bounded_log(log.as_bytes()),
                    })
                }
                resident_limits::Ended::Timeout => Err(SimError::CompileTimeout {
                    name: qname.clone(),
                    limit: limits.wall,
                }),
                resident_limits::Ended::OutOfMemory => Err(SimError::CompileOutOfMemory {
                    name: qname.clone(),
                    limit_bytes: limits.memory_bytes,
                }),
                resident_limits::Ended::Crashed { reason } => Err(SimError::CompileCrashed {
                    name: qname.clone(),
                    reason,
                }),
            }
        };
        let built = step(
            Command::new(&cxx)
                .args(&args)
                .arg("-S")
                .arg("-o")
                .arg(&asm)
                .arg(&src),
        )
        .and_then(|()| {
            let text = std::fs::read(&asm).map_err(io_err(&asm))?;
            match check_assembly(&text) {
                Some(what) => Err(SimError::ForbiddenAssembly {
                    name: qname.clone(),
                    what,
                }),
                None => Ok(()),
            }
        })
        .and_then(|()| {
            // The same options but the language: the checked assembly is what is assembled.
            let link: Vec<&String> = args
                .iter()
                .filter(|a| !matches!(a.as_str(), "-x" | "c++"))
                .collect();
            step(
                Command::new(&cxx)
                    .args(link)
                    .arg("-o")
                    .arg(&tmp)
                    .args(["-x", "assembler"])
                    .arg(&asm)
                    // g++ adds its C++ libraries only after compiling C++ itself.
                    .args(["-lstdc++", "-lm"]),
            )
        });
        if let Err(e) = built {
            cleanup();
            return Err(e);
        }
        let _ = std::fs::remove_file(&src);
        let _ = std::fs::remove_file(&asm);
        // Atomic publication: concurrent compilers of the same key each rename a whole file.
        std::fs::rename(&tmp, &path).map_err(io_err(&path))?;
        Ok(module(false))
    }

    /// The shared object's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether it came from the disk cache.
    pub fn was_cached(&self) -> bool {
        self.cached
    }

    /// Loads a private copy: its `__shared__` variables, globals and thread-locals are its own,
    /// so two instances of one module can run at once.
    pub fn instantiate(&self) -> Result<SimInstance, SimError> {
        let copy = self.path.with_extension(format!("{}.so", unique_suffix()));
        std::fs::copy(&self.path, &copy).map_err(io_err(&copy))?;
        // SAFETY: the object was built by `compile` from the shim, whose static initializers
        // only construct standard-library objects; loading runs nothing else.
        let lib = unsafe { libloading::Library::new(&copy) };
        // The mapping stays after the unlink; the copy only had to exist for dlopen.
        let _ = std::fs::remove_file(&copy);
        let lib = lib.map_err(|source| SimError::Load {
            path: self.path.clone(),
            source,
        })?;
        Ok(SimInstance {
            lib: Some(lib),
            module: self.name.clone(),
            entries: self.entries.clone(),
            lock: Mutex::new(()),
        })
    }
}

type EntryFn =
    unsafe extern "C" fn(*const Dims, *mut *mut c_void, *const u64, u32, *mut u8, u32) -> i32;

#[repr(C)]
struct Dims {
    grid: [u32; 3],
    block: [u32; 3],
}

/// A loaded copy of a [`SimModule`]. Launches on one instance run one at a time.
pub struct SimInstance {
    lib: Option<libloading::Library>,
    module: String,
    entries: Vec<String>,
    lock: Mutex<()>,
}

impl std::fmt::Debug for SimInstance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimInstance")
            .field("module", &self.module)
            .field("entries", &self.entries)
            .finish()
    }
}

impl SimInstance {
    /// Runs `entry` over `grid` blocks of `block` threads and returns when every thread has
    /// exited. `args[i]` points at the value of parameter `i` (for a pointer parameter: at the
    /// 8-byte address), `sizes[i]` is its size, checked against the kernel's signature.
    ///
    /// # Safety
    /// Every pointer the kernel dereferences (the arguments' values and whatever addresses
    /// they hold) must be valid host memory for the kernel's accesses until this returns, and
    /// not accessed by others in ways that race with the kernel, except through atomics.
    pub unsafe fn launch(
        &self,
        entry: &str,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        args: &[*mut c_void],
        sizes: &[u64],
    ) -> Result<(), SimError> {
        if args.len() != sizes.len() {
            return Err(SimError::BadLaunch {
                entry: entry.into(),
                reason: format!("{} arguments but {} sizes", args.len(), sizes.len()),
            });
        }
        if !self.entries.iter().any(|e| e == entry) {
            return Err(SimError::NoEntry {
                module: self.module.clone(),
                entry: entry.into(),
            });
        }
        let lib = self.lib.as_ref().ok_or_else(|| SimError::NoEntry {
            module: self.module.clone(),
            entry: entry.into(),
        })?;
        let symbol = format!("resident_sim_entry_{entry}\0");
        // SAFETY: every exported launcher has exactly the `EntryFn` signature (the
        // RESIDENT_SIM_EXPORT macro of the shim defines them all).
        let f: libloading::Symbol<EntryFn> =
            lib.get(symbol.as_bytes()).map_err(|_| SimError::NoEntry {
                module: self.module.clone(),
                entry: entry.into(),
            })?;
        let dims = Dims {
            grid: [grid.0, grid.1, grid.2],
            block: [block.0, block.1, block.2],
        };
        let mut argv: Vec<*mut c_void> = args.to_vec();
        let mut err = vec![0u8; 1024];
        // A hardware fault in the kernel's threads faults the block, not the process (when
        // the handler cannot be installed, it ends the process as it would without it).
        let _ = crate::sim::fault::install();
        let _one_at_a_time = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: the launcher reads `dims`, `argv[..n]`, `sizes[..n]` and writes at most
        // `err.len()` bytes of `err`; the caller vouches for what the kernel dereferences.
        let rc = f(
            &dims,
            argv.as_mut_ptr(),
            sizes.as_ptr(),
            argv.len() as u32,
            err.as_mut_ptr(),
            err.len() as u32,
        );
        let text = || {
            let n = err.iter().position(|&b| b == 0).unwrap_or(err.len());
            String::from_utf8_lossy(&err[..n]).into_owned()
        };
        match rc {
            0 => Ok(()),
            1 => Err(SimError::Fault {
                entry: entry.into(),
                reason: text(),
            }),
            _ => Err(SimError::BadLaunch {
                entry: entry.into(),
                reason: text(),
            }),
        }
    }

    /// Sets this copy's function pointer `name` (an `extern "C"` pointer variable of the
    /// module, such as the one an external handler is called through) to `addr`. Other copies
    /// of the module keep their own.
    ///
    /// # Safety
    /// `addr` must be a function of the pointer's C signature that stays callable for as long
    /// as any kernel of this instance runs.
    pub unsafe fn bind_fn(&self, name: &str, addr: usize) -> Result<(), SimError> {
        let missing = || SimError::NoEntry {
            module: self.module.clone(),
            entry: name.into(),
        };
        let lib = self.lib.as_ref().ok_or_else(missing)?;
        let symbol = format!("{name}\0");
        // SAFETY: the symbol is a pointer-sized global of the module (the template declares it
        // as a function pointer); no kernel of this instance runs yet, so nothing reads it
        // while it is written.
        let var: libloading::Symbol<*mut usize> =
            lib.get(symbol.as_bytes()).map_err(|_| missing())?;
        std::ptr::write_volatile(*var, addr);
        Ok(())
    }

    /// The bus model's counters of this instance's kernel (see [`crate::sim::bus`]); `None` for an
    /// object built without them. Readable while the kernel runs (a snapshot).
    pub fn bus_stats(&self) -> Option<crate::sim::bus::BusStats> {
        type StatsFn = unsafe extern "C" fn(*mut u64, u32) -> u32;
        let lib = self.lib.as_ref()?;
        // SAFETY: the shim exports `resident_sim_bus_stats` with exactly this signature.
        let f: libloading::Symbol<StatsFn> =
            unsafe { lib.get(b"resident_sim_bus_stats\0") }.ok()?;
        let mut v = [0u64; crate::sim::bus::BUS_FIELDS];
        // SAFETY: the function writes at most `v.len()` counters into `v`.
        let n = unsafe { f(v.as_mut_ptr(), v.len() as u32) } as usize;
        Some(crate::sim::bus::BusStats::from_fields(&v[..n.min(v.len())]))
    }

    /// Keeps the object mapped for the rest of the process: for an instance whose kernel may
    /// still be running on a thread that could not be joined.
    pub fn leak(mut self) {
        if let Some(lib) = self.lib.take() {
            std::mem::forget(lib);
        }
    }
}

/// The kernels a [`SimError::WouldWaitForDevice`] names: at most 4, each quoted at most 64
/// bytes long, and how many more (a context may hold thousands of kernels, and their names come
/// from users).
fn running_names(names: &[String]) -> String {
    const SHOWN: usize = 4;
    let mut s: Vec<String> = names
        .iter()
        .take(SHOWN)
        .map(|n| format!("`{}`", resident_ring::message::quoted_name(n)))
        .collect();
    if names.len() > SHOWN {
        s.push(format!("{} more", names.len() - SHOWN));
    }
    format!("[{}]", s.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hazard_names_a_few_running_kernels_short() {
        let e = SimError::WouldWaitForDevice {
            call: resident_cuda::hazards::DriverCall::StreamCreate,
            running: (0..1000)
                .map(|i| format!("{i}{}", "k".repeat(1 << 20)))
                .collect(),
            waited: std::time::Duration::from_millis(5),
        };
        let text = e.to_string();
        assert!(text.len() < 800, "{} bytes", text.len());
        assert!(text.contains("996 more"), "{text}");
        assert!(text.contains("(1048577 bytes)"), "{text}");
        let one = SimError::WouldWaitForDevice {
            call: resident_cuda::hazards::DriverCall::ModuleLoad,
            running: vec!["resident".into()],
            waited: std::time::Duration::ZERO,
        };
        assert!(one.to_string().contains("[`resident`] still ran"), "{one}");
    }

    #[test]
    fn assembly_that_could_read_a_file_is_found() {
        assert_eq!(check_assembly(b"\t.text\n\t.globl f\nf:\n\tret\n"), None);
        let inline = b"\t.text\n#APP\n# 3 \"a.cpp\" 1\n\tnop\n#NO_APP\n";
        assert!(check_assembly(inline).unwrap().contains("inline assembly"));
        for d in [".incbin", ".INCLUDE", ".macro", ".Irpc", ".rept"] {
            let text = format!("\t.section .data\n; {d} \"/etc/passwd\"\n");
            let found = check_assembly(text.as_bytes()).unwrap();
            let named = found.split('`').nth(1).unwrap();
            assert!(d.to_ascii_lowercase().starts_with(named), "{d}: {found}");
        }
    }

    #[test]
    fn translation_unit_keeps_user_line_numbers() {
        let tu = translation_unit("k", "int x;\n", &["a", "b"]);
        assert!(tu.contains("#line 1 \"k.cu\"\nint x;"));
        assert!(tu.contains("RESIDENT_SIM_EXPORT(a)\nRESIDENT_SIM_EXPORT(b)\n"));
    }

    #[test]
    fn entry_names_must_be_identifiers() {
        if !available() {
            eprintln!("SKIP: no host C++ compiler");
            return;
        }
        let e = SimModule::compile("k", "", &["bad name"], &SimOptions::default()).unwrap_err();
        assert!(matches!(e, SimError::BadLaunch { .. }), "{e}");
    }
}

/// What a ThreadSanitizer run of a CudaSim translation unit gave ([`run_under_tsan`]).
#[derive(Clone, Debug)]
pub struct TsanRun {
    /// The program exited 0 (TSan exits 66 on its first report).
    pub success: bool,
    /// Its standard output.
    pub stdout: String,
    /// Its standard error (TSan's reports).
    pub stderr: String,
}

impl TsanRun {
    /// Exited 0 with no TSan report.
    pub fn clean(&self) -> bool {
        self.success && !self.stderr.contains("ThreadSanitizer")
    }
}

/// Why [`run_under_tsan`] gave no run.
#[derive(Debug, thiserror::Error)]
pub enum TsanError {
    /// No host C++ compiler, or no ThreadSanitizer runtime (Debian: `libtsan2`): a test may
    /// skip on this.
    #[error("ThreadSanitizer is unavailable here: {0}")]
    Unavailable(#[source] TsanUnavailable),
    /// The translation unit did not compile; `log` is the compiler's diagnostics.
    #[error("the ThreadSanitizer build failed:\n{log}")]
    Build {
        /// The compiler's standard error.
        log: String,
    },
    /// The program ran past the time limit and was killed.
    #[error("the ThreadSanitizer run did not end within {0:?} (killed)")]
    Timeout(std::time::Duration),
    /// The files or the process could not be made.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Why ThreadSanitizer cannot run here.
#[derive(Debug, thiserror::Error)]
pub enum TsanUnavailable {
    /// No usable host C++ compiler.
    #[error(transparent)]
    Compiler(SimError),
    /// The compiler has no ThreadSanitizer runtime; `log` is its diagnostics.
    #[error("libtsan is missing: {log}")]
    NoRuntime {
        /// The compiler's standard error.
        log: String,
    },
}

/// Compiles `tu` (a complete C++ program: typically [`translation_unit`] followed by a driver
/// with `main`, which plays the host) with the host compiler, `-std=c++20 -O1 -g
/// -fsanitize=thread -pthread`, into `dir/tag`, and runs it with `TSAN_OPTIONS=halt_on_error=1
/// exitcode=66`, killed after `timeout`: CUDA C handlers checked for data races on host threads.
pub fn run_under_tsan(
    dir: &Path,
    tag: &str,
    tu: &str,
    timeout: std::time::Duration,
) -> Result<TsanRun, TsanError> {
    let (cxx, _) = compiler().map_err(|e| TsanError::Unavailable(TsanUnavailable::Compiler(e)))?;
    let src = dir.join(format!("{tag}.cpp"));
    let exe = dir.join(tag);
    std::fs::write(&src, tu)?;
    let out = Command::new(&cxx)
        .args([
            "-std=c++20",
            "-O1",
            "-g",
            "-fsanitize=thread",
            "-pthread",
            "-o",
        ])
        .arg(&exe)
        .arg(&src)
        .output()?;
    if !out.status.success() {
        let log = String::from_utf8_lossy(&out.stderr).into_owned();
        if log.contains("libtsan") || log.contains("-ltsan") {
            return Err(TsanError::Unavailable(TsanUnavailable::NoRuntime { log }));
        }
        return Err(TsanError::Build { log });
    }
    let mut child = Command::new(&exe)
        .env(
            "TSAN_OPTIONS",
            "halt_on_error=1 exitcode=66 second_deadlock_stack=1",
        )
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    let deadline = std::time::Instant::now() + timeout;
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break s;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(TsanError::Timeout(timeout));
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let output = child.wait_with_output()?;
    Ok(TsanRun {
        success: status.success(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    })
}
