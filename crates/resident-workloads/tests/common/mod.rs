//! What the workload test files share: opening a backend or skipping it visibly.

use resident::backend::{self, DeviceHandle};
use resident::prelude::*;

/// A runtime and a device of backend `b`, or `None` after printing `SKIP:` (for `test`) when
/// it is unavailable; a failure instead when the environment variable `require` is `1`.
pub fn open(b: Backend, require: &str, test: &str) -> Option<(Runtime, DeviceHandle)> {
    let r = Runtime::builder()
        .backend(b)
        .build()
        .map_err(|e| e.to_string())
        .and_then(|rt| Ok((rt, backend::open(b).map_err(|e| e.to_string())?)));
    match r {
        Ok(x) => Some(x),
        Err(e) => {
            if std::env::var(require).as_deref() == Ok("1") {
                panic!("{require}=1 but {b:?} is unavailable: {e}");
            }
            println!("SKIP: {test}: {b:?} unavailable: {e}");
            None
        }
    }
}
