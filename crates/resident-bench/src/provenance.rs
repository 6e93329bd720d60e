//! What every result file carries so that a reader can reproduce and judge it: the command, the
//! machine, its load at the time, the UTC date; and the writing of the JSON itself.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

/// `YYYY-MM-DD` of a time, in UTC.
pub fn utc_date(t: std::time::SystemTime) -> String {
    let days = t
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() / 86_400)
        .unwrap_or(0) as i64;
    // Days since 1970-01-01 to a civil date (proleptic Gregorian), by 400-year eras.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

/// Today, `YYYY-MM-DD` in UTC.
pub fn today() -> String {
    utc_date(std::time::SystemTime::now())
}

/// The machine: CPU model, logical cores, OS and architecture.
pub fn machine() -> Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    json!({
        "cpu": cpu,
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "os": std::env::consts::OS,
        "arch": std::env::consts::ARCH,
    })
}

/// The load averages (1, 5, 15 minutes, runnable/total tasks, last pid) as the kernel reports
/// them, or `"unknown"`.
pub fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// The command line of this process, as run.
pub fn command() -> String {
    std::env::args().collect::<Vec<_>>().join(" ")
}

/// The command that reproduces this run from the repository: `cargo run [--release] -p
/// <package> -- <arguments>` (the binary's own path left out, the build profile of this binary).
pub fn cargo_command(package: &str) -> String {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let release = if cfg!(debug_assertions) {
        ""
    } else {
        "--release "
    };
    format!("cargo run {release}-p {package} -- {}", args.join(" "))
}

/// A name made file-safe: lower-case ASCII letters and digits, other runs turned into one `-`;
/// at most `words` words.
pub fn slug(name: &str, words: usize) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect::<String>()
        .split('-')
        .filter(|p| !p.is_empty())
        .take(words)
        .collect::<Vec<_>>()
        .join("-")
}

/// A result file that could not be written.
#[derive(Debug)]
pub struct WriteError {
    /// The file.
    pub path: PathBuf,
    /// Why.
    pub source: std::io::Error,
}

impl std::fmt::Display for WriteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "cannot write the results to {}: {}",
            self.path.display(),
            self.source
        )
    }
}

impl std::error::Error for WriteError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// Writes `doc` as pretty JSON with a final newline. No folder is created: a missing one is
/// the user's to make (or a typo), and the error says which file.
pub fn write_json(path: &Path, doc: &Value) -> Result<(), WriteError> {
    let text = serde_json::to_string_pretty(doc).unwrap_or_else(|_| doc.to_string()) + "\n";
    std::fs::write(path, text).map_err(|source| WriteError {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        let at = |s| std::time::UNIX_EPOCH + std::time::Duration::from_secs(s);
        assert_eq!(utc_date(at(0)), "1970-01-01");
        assert_eq!(utc_date(at(951_782_400)), "2000-02-29");
        assert_eq!(utc_date(at(1_763_683_200)), "2025-11-21");
    }

    #[test]
    fn slugs() {
        assert_eq!(slug("llvmpipe (LLVM 15.0.7, 256 bits)", 2), "llvmpipe-llvm");
        assert_eq!(slug("NVIDIA H100 80GB HBM3", 9), "nvidia-h100-80gb-hbm3");
        assert_eq!(slug("", 2), "");
    }

    #[test]
    fn writing_into_a_missing_folder_is_a_typed_error() {
        let dir = std::env::temp_dir().join(format!("resident-bench-none-{}", std::process::id()));
        let e = write_json(&dir.join("x.json"), &json!({})).unwrap_err();
        assert_eq!(e.path, dir.join("x.json"));
        assert!(e.to_string().contains("x.json"));
    }
}
