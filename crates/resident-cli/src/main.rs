//! The `resident` command-line tool.
mod info;
fn main() {
    println!("resident {}", env!("CARGO_PKG_VERSION"));
}
