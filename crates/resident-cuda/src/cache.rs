//! The on-disk PTX cache: one file per (source, options, architecture, driver) key, a checksum
//! header so a damaged file is rebuilt instead of loaded, and least-recently-used eviction
//! under a byte limit. Recency is the file's modification time, refreshed on every hit.

use crate::error::{CudaError, Result};
use std::fs;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// Environment variable that overrides the cache folder.
pub const CACHE_DIR_ENV: &str = "RESIDENT_KERNEL_CACHE";
/// Default byte limit of the cache folder.
pub const DEFAULT_MAX_BYTES: u64 = 256 << 20;

const MAGIC: &[u8; 8] = b"RSDPTX01";
const HEADER: usize = 8 + 8 + 16;

/// 128-bit FNV-1a: stable across Rust versions and platforms (unlike `DefaultHasher`), which
/// matters for file names that outlive the binary. Not for adversarial input.
#[derive(Clone, Copy, Debug)]
pub struct Fnv128(u128);

impl Default for Fnv128 {
    fn default() -> Self {
        Fnv128(0x6c62272e07bb014262b821756295c58d)
    }
}

impl Fnv128 {
    /// Mixes in bytes.
    pub fn write(&mut self, bytes: &[u8]) {
        const PRIME: u128 = 0x0000000001000000000000000000013B;
        for &b in bytes {
            self.0 ^= b as u128;
            self.0 = self.0.wrapping_mul(PRIME);
        }
    }
    /// Mixes in a length-prefixed field, so ("ab","c") and ("a","bc") differ.
    pub fn field(&mut self, bytes: &[u8]) {
        self.write(&(bytes.len() as u64).to_le_bytes());
        self.write(bytes);
    }
    /// The hash.
    pub fn finish(self) -> u128 {
        self.0
    }
}

/// Hash of bytes.
pub fn fnv128(bytes: &[u8]) -> u128 {
    let mut h = Fnv128::default();
    h.write(bytes);
    h.finish()
}

/// What identifies a compiled kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheKey(pub u128);

impl CacheKey {
    /// Key of `source` compiled with `options` for `arch` under driver `driver_version`
    /// (`(0, 0)` when there is no driver, e.g. compile-only in CI).
    pub fn new(source: &str, options: &[String], arch: &str, driver_version: (u32, u32)) -> Self {
        let mut h = Fnv128::default();
        h.field(source.as_bytes());
        h.write(&(options.len() as u64).to_le_bytes());
        for o in options {
            h.field(o.as_bytes());
        }
        h.field(arch.as_bytes());
        h.write(&driver_version.0.to_le_bytes());
        h.write(&driver_version.1.to_le_bytes());
        CacheKey(h.finish())
    }

    fn file_name(&self) -> String {
        format!("{:032x}.ptx", self.0)
    }
}

/// How a lookup was served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheOutcome {
    /// Read from disk.
    Hit,
    /// Not on disk; built and stored.
    Miss,
    /// On disk but damaged; rebuilt and replaced.
    Rebuilt,
}

/// A folder of cached PTX files.
#[derive(Clone, Debug)]
pub struct KernelCache {
    dir: PathBuf,
    max_bytes: u64,
}

impl KernelCache {
    /// A cache in `dir` (created when missing) holding at most `max_bytes`.
    pub fn new(dir: impl Into<PathBuf>, max_bytes: u64) -> Result<Self> {
        let dir = dir.into();
        fs::create_dir_all(&dir).map_err(|source| CudaError::Cache {
            path: dir.clone(),
            source,
        })?;
        Ok(KernelCache { dir, max_bytes })
    }

    /// The default folder: `$RESIDENT_KERNEL_CACHE`, else `$XDG_CACHE_HOME/resident/kernels`,
    /// else `~/.cache/resident/kernels`; `None` when none of them is set.
    pub fn default_dir() -> Option<PathBuf> {
        let var = |k| std::env::var_os(k).filter(|v: &std::ffi::OsString| !v.is_empty());
        if let Some(d) = var(CACHE_DIR_ENV) {
            return Some(PathBuf::from(d));
        }
        if let Some(x) = var("XDG_CACHE_HOME") {
            return Some(PathBuf::from(x).join("resident").join("kernels"));
        }
        var("HOME").map(|h| PathBuf::from(h).join(".cache/resident/kernels"))
    }

    /// A cache in [`default_dir`](Self::default_dir) with [`DEFAULT_MAX_BYTES`].
    pub fn from_env() -> Result<Self> {
        let dir = Self::default_dir().ok_or_else(|| CudaError::Cache {
            path: PathBuf::new(),
            source: std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "no RESIDENT_KERNEL_CACHE, XDG_CACHE_HOME or HOME set",
            ),
        })?;
        Self::new(dir, DEFAULT_MAX_BYTES)
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Path of a key's file.
    pub fn path_of(&self, key: &CacheKey) -> PathBuf {
        self.dir.join(key.file_name())
    }

    /// The PTX for `key`, read from disk or built with `build` and stored. A damaged file is
    /// rebuilt; failing to write the cache is not an error (the PTX is still returned).
    pub fn get_or_build(
        &self,
        key: &CacheKey,
        build: impl FnOnce() -> Result<String>,
    ) -> Result<(String, CacheOutcome)> {
        let path = self.path_of(key);
        let outcome = match fs::read(&path) {
            Ok(bytes) => match decode(&bytes) {
                Some(ptx) => {
                    touch(&path);
                    return Ok((ptx, CacheOutcome::Hit));
                }
                None => CacheOutcome::Rebuilt,
            },
            Err(_) => CacheOutcome::Miss,
        };
        let ptx = build()?;
        if self.store(&path, &ptx).is_ok() {
            let _ = self.evict(Some(&path));
        }
        Ok((ptx, outcome))
    }

    fn store(&self, path: &Path, ptx: &str) -> std::io::Result<()> {
        // Write then rename, so a reader never sees half a file from us.
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        fs::write(&tmp, encode(ptx))?;
        fs::rename(&tmp, path)
    }

    /// Total bytes of cached files.
    pub fn size(&self) -> u64 {
        self.entries().iter().map(|e| e.1).sum()
    }

    fn entries(&self) -> Vec<(PathBuf, u64, SystemTime)> {
        let Ok(rd) = fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        rd.filter_map(|e| e.ok())
            .filter(|e| e.path().extension().is_some_and(|x| x == "ptx"))
            .filter_map(|e| {
                let m = e.metadata().ok()?;
                Some((
                    e.path(),
                    m.len(),
                    m.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                ))
            })
            .collect()
    }

    /// Removes least recently used files until the folder fits the limit; `keep` is never
    /// removed. Returns how many files were removed.
    pub fn evict(&self, keep: Option<&Path>) -> Result<usize> {
        let mut entries = self.entries();
        let mut total: u64 = entries.iter().map(|e| e.1).sum();
        entries.sort_by_key(|e| e.2);
        let mut removed = 0;
        for (path, len, _) in entries {
            if total <= self.max_bytes {
                break;
            }
            if Some(path.as_path()) == keep {
                continue;
            }
            fs::remove_file(&path).map_err(|source| CudaError::Cache {
                path: path.clone(),
                source,
            })?;
            total -= len;
            removed += 1;
        }
        Ok(removed)
    }
}

fn touch(path: &Path) {
    if let Ok(f) = fs::File::options().append(true).open(path) {
        let _ = f.set_modified(SystemTime::now());
    }
}

fn encode(ptx: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + ptx.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(ptx.len() as u64).to_le_bytes());
    out.extend_from_slice(&fnv128(ptx.as_bytes()).to_le_bytes());
    out.extend_from_slice(ptx.as_bytes());
    out
}

fn decode(bytes: &[u8]) -> Option<String> {
    if bytes.len() < HEADER || &bytes[..8] != MAGIC {
        return None;
    }
    let len = u64::from_le_bytes(bytes[8..16].try_into().ok()?) as usize;
    let sum = u128::from_le_bytes(bytes[16..32].try_into().ok()?);
    let body = &bytes[HEADER..];
    if body.len() != len || fnv128(body) != sum {
        return None;
    }
    String::from_utf8(body.to_vec()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    fn tmpdir(name: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("resident-cache-test-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn key_depends_on_every_part() {
        let base = CacheKey::new("src", &["-DA".into()], "compute_90", (13, 0));
        assert_eq!(
            base,
            CacheKey::new("src", &["-DA".into()], "compute_90", (13, 0))
        );
        assert_ne!(
            base,
            CacheKey::new("src2", &["-DA".into()], "compute_90", (13, 0))
        );
        assert_ne!(
            base,
            CacheKey::new("src", &["-DB".into()], "compute_90", (13, 0))
        );
        assert_ne!(
            base,
            CacheKey::new("src", &["-DA".into()], "compute_80", (13, 0))
        );
        assert_ne!(
            base,
            CacheKey::new("src", &["-DA".into()], "compute_90", (12, 8))
        );
        assert_ne!(
            CacheKey::new("ab", &["c".into()], "x", (0, 0)),
            CacheKey::new("a", &["bc".into()], "x", (0, 0))
        );
    }

    #[test]
    fn miss_then_hit_then_corrupt_rebuilds() {
        let dir = tmpdir("corrupt");
        let cache = KernelCache::new(&dir, 1 << 20).unwrap();
        let key = CacheKey::new("k", &[], "compute_90", (13, 0));
        let builds = Cell::new(0);
        let build = || {
            builds.set(builds.get() + 1);
            Ok(".version 9.0\n// ptx".to_string())
        };
        let (p, o) = cache.get_or_build(&key, build).unwrap();
        assert_eq!((o, builds.get()), (CacheOutcome::Miss, 1));
        let (p2, o) = cache.get_or_build(&key, build).unwrap();
        assert_eq!((o, builds.get(), &p2), (CacheOutcome::Hit, 1, &p));

        // Truncated file.
        let path = cache.path_of(&key);
        let bytes = fs::read(&path).unwrap();
        fs::write(&path, &bytes[..bytes.len() - 3]).unwrap();
        let (p3, o) = cache.get_or_build(&key, build).unwrap();
        assert_eq!((o, builds.get(), &p3), (CacheOutcome::Rebuilt, 2, &p));

        // Same length, one byte flipped: only the checksum notices.
        let mut bytes = fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0x55;
        fs::write(&path, &bytes).unwrap();
        let (_, o) = cache.get_or_build(&key, build).unwrap();
        assert_eq!((o, builds.get()), (CacheOutcome::Rebuilt, 3));

        // Garbage.
        fs::write(&path, b"garbage").unwrap();
        let (_, o) = cache.get_or_build(&key, build).unwrap();
        assert_eq!(o, CacheOutcome::Rebuilt);
        assert_eq!(
            cache.get_or_build(&key, build).unwrap().1,
            CacheOutcome::Hit
        );
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn build_error_is_returned_and_nothing_stored() {
        let dir = tmpdir("err");
        let cache = KernelCache::new(&dir, 1 << 20).unwrap();
        let key = CacheKey::new("bad", &[], "compute_90", (0, 0));
        let err = cache
            .get_or_build(&key, || {
                Err(CudaError::Compile {
                    name: "bad".into(),
                    arch: "compute_90".into(),
                    log: "error: expected ;".into(),
                })
            })
            .unwrap_err();
        assert!(err.to_string().contains("expected ;"));
        assert!(!cache.path_of(&key).exists());
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn lru_eviction_keeps_recent_under_limit() {
        let dir = tmpdir("lru");
        let body = "x".repeat(1000);
        let entry = (HEADER + body.len()) as u64;
        let unbounded = KernelCache::new(&dir, u64::MAX).unwrap();
        let keys: Vec<CacheKey> = (0..5)
            .map(|i| CacheKey::new(&format!("k{i}"), &[], "compute_90", (0, 0)))
            .collect();
        let old = SystemTime::now() - std::time::Duration::from_secs(1000);
        for (i, k) in keys.iter().enumerate() {
            unbounded.get_or_build(k, || Ok(body.clone())).unwrap();
            // Distinct, increasing ages without sleeping.
            let f = fs::File::options()
                .append(true)
                .open(unbounded.path_of(k))
                .unwrap();
            f.set_modified(old + std::time::Duration::from_secs(i as u64 * 10))
                .unwrap();
        }
        let cache = KernelCache::new(&dir, entry * 3).unwrap();
        // Using key 0 makes it the most recent; a new insert then evicts the oldest others.
        assert_eq!(
            cache.get_or_build(&keys[0], || unreachable!()).unwrap().1,
            CacheOutcome::Hit
        );
        let k5 = CacheKey::new("k5", &[], "compute_90", (0, 0));
        cache.get_or_build(&k5, || Ok(body.clone())).unwrap();
        assert!(cache.size() <= entry * 3);
        assert!(cache.path_of(&keys[0]).exists(), "recently used kept");
        assert!(cache.path_of(&k5).exists(), "newest kept");
        assert!(!cache.path_of(&keys[1]).exists(), "least recent evicted");
        let _ = fs::remove_dir_all(&dir);
    }
}
