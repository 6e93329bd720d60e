//! The `resident` command-line tool.
fn main() {
    println!("resident {}", env!("CARGO_PKG_VERSION"));
}
