//! Where default outputs go: paths the user gives are taken as given (relative to the current
//! folder); the defaults name folders of the repository (`bench/results`) and are resolved
//! against the repository root, so `resident all` works from any folder.

use std::path::{Path, PathBuf};

/// Whether `dir` is this workspace's root.
fn is_root(dir: &Path) -> bool {
    dir.join("Cargo.toml").is_file() && dir.join("crates/resident-cli/Cargo.toml").is_file()
}

/// The repository root: the nearest folder at or above the current one that holds this
/// workspace, else the one this binary was built from if it is still there.
pub fn repo_root() -> Option<PathBuf> {
    let cwd = std::env::current_dir().ok()?;
    if let Some(d) = cwd.ancestors().find(|d| is_root(d)) {
        return Some(d.to_path_buf());
    }
    let built = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    is_root(&built).then(|| built.canonicalize().unwrap_or(built))
}

/// `given` as it is, or the default `rel` (a path inside the repository) resolved against the
/// repository root; an error naming `flag` when there is no repository to resolve it in.
pub fn output(given: Option<PathBuf>, rel: &str, flag: &str) -> Result<PathBuf, String> {
    match given {
        Some(p) => Ok(p),
        None => repo_root().map(|r| r.join(rel)).ok_or_else(|| {
            format!(
                "the default output {rel} is inside the resident repository, which is not \
                 above the current folder: run from the repository or pass {flag} PATH"
            )
        }),
    }
}

/// Fails unless the folder `path` goes into exists (no folder is created on the user's
/// behalf), naming `flag`.
pub fn check_parent(path: &Path, flag: &str) -> Result<(), String> {
    match path.parent().filter(|d| !d.as_os_str().is_empty()) {
        Some(dir) if !dir.is_dir() => Err(format!(
            "cannot write {}: folder {} does not exist (create it, or pass {flag} elsewhere)",
            path.display(),
            dir.display()
        )),
        _ => Ok(()),
    }
}
