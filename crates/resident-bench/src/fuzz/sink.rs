//! What a fuzz target reports of each decoder call ([`Sink`], the runner's record of it), and
//! the small writers the targets and their generators share. Below the targets and the
//! generators: each of them uses it, it uses none of them.

use std::fmt::{self, Display, Write as _};

/// What one decoder call gave, as the runner records it.
pub(crate) trait Sink {
    /// The input was accepted by `decoder`.
    fn accepted(&mut self, decoder: &'static str);
    /// `decoder` rejected the input with the typed error variant `kind`; `error` is the error
    /// (its message is measured against `MAX_ERROR_DISPLAY`).
    fn rejected(&mut self, decoder: &'static str, kind: &'static str, error: &dyn Display);
    /// [`Sink::rejected`] for an error that carries a compiler's log (measured against
    /// `MAX_COMPILE_ERROR_DISPLAY`).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))] // only the cuda target compiles
    fn rejected_with_log(&mut self, decoder: &'static str, kind: &'static str, error: &dyn Display);
    /// `decoder` could not run here (`why`: NVRTC is not available).
    fn skipped(&mut self, decoder: &'static str, why: &'static str);
    /// An invariant of the decoder's result does not hold.
    fn violation(&mut self, decoder: &'static str, what: fmt::Arguments<'_>);
}

/// The length of a message, counted without writing it anywhere.
pub(crate) fn display_len(d: &dyn Display) -> usize {
    struct Count(usize);
    impl fmt::Write for Count {
        fn write_str(&mut self, s: &str) -> fmt::Result {
            self.0 += s.len();
            Ok(())
        }
    }
    let mut c = Count(0);
    let _ = write!(c, "{d}");
    c.0
}

/// `fmt::Write` into a byte buffer.
pub(crate) struct Bytes<'a>(pub(crate) &'a mut Vec<u8>);

impl fmt::Write for Bytes<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
}
