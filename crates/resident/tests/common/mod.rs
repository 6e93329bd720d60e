//! What the wgpu test binaries share (each includes it with `mod common;`).

use resident::backend::{self, Backend, DeviceHandle};

/// The wgpu device (lavapipe in CI), or `None` after printing `SKIP:` for `test` when there is
/// no adapter; with `RESIDENT_REQUIRE_WGPU=1` a missing adapter fails the test instead.
pub fn wgpu_device(test: &str) -> Option<DeviceHandle> {
    match backend::open(Backend::Wgpu) {
        Ok(d) => Some(d),
        Err(e) => {
            if std::env::var("RESIDENT_REQUIRE_WGPU").as_deref() == Ok("1") {
                panic!("RESIDENT_REQUIRE_WGPU=1 but no wgpu adapter: {e}");
            }
            println!("SKIP: {test}: {e}");
            None
        }
    }
}
