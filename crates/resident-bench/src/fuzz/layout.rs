//! The `layout` target: run-time message layouts as the Python binding builds them from numpy
//! dtypes (`resident-py/src/device.rs`: a field list of name, scalar code, array extents and
//! offset, and a size), through `StructLayout::new`, its C declaration and its WGSL structs.
//!
//! An input is the field list as text, one field a line:
//!
//! ```text
//! Tick 16
//! price f4 - 0
//! venue u1 8 8
//! ```
//!
//! (the struct's name and size, then each field's name, numpy code, extents `-` or `4,2`, and
//! offset). Text that is not such a list is rejected by the harness's own reader with a
//! [`DescriptorError`], as the Python half would refuse a dtype it cannot describe.

use std::fmt::Write as _;

use resident::ring::message::{FieldLayout, LayoutError, Scalar, StructLayout};

use super::gen::{Rng, NUMBERS};
use super::sink::{Bytes, Sink};

/// Why a descriptor text is not a field list (the harness's reader, not the decoder).
#[derive(Debug, thiserror::Error)]
pub(crate) enum DescriptorError {
    /// Not UTF-8.
    #[error("the descriptor is not UTF-8")]
    NotUtf8,
    /// No `name size` first line.
    #[error("the first line is not `name size`")]
    Header,
    /// A field line without four words.
    #[error("line {0}: not `name code dims offset`")]
    Field(usize),
    /// A number that does not parse as `usize`.
    #[error("line {0}: a number out of range")]
    Number(usize),
    /// A numpy code with no device type (as `resident-py` refuses it).
    #[error("line {0}: the numpy type has no device type")]
    Code(usize),
}

impl DescriptorError {
    fn kind(&self) -> &'static str {
        match self {
            DescriptorError::NotUtf8 => "NotUtf8",
            DescriptorError::Header => "Header",
            DescriptorError::Field(_) => "Field",
            DescriptorError::Number(_) => "Number",
            DescriptorError::Code(_) => "Code",
        }
    }
}

/// The numpy scalar codes, as `resident-py` maps them.
fn scalar(code: &str) -> Option<Scalar> {
    Scalar::from_numpy_code(code)
}

const CODES: &[&str] = &[
    "u1", "i1", "u2", "i2", "u4", "i4", "u8", "i8", "f4", "f8", "f2", "c8", "<f4", "b1", "",
];

type Descriptor = (String, usize, Vec<FieldLayout>);

fn parse(input: &[u8]) -> Result<Descriptor, DescriptorError> {
    let text = std::str::from_utf8(input).map_err(|_| DescriptorError::NotUtf8)?;
    let mut lines = text.lines();
    let header: Vec<&str> = lines
        .next()
        .ok_or(DescriptorError::Header)?
        .split(' ')
        .collect();
    let [name, size] = header[..] else {
        return Err(DescriptorError::Header);
    };
    let size = size.parse().map_err(|_| DescriptorError::Header)?;
    let mut fields = Vec::new();
    for (i, line) in lines.enumerate() {
        let n = i + 2;
        let words: Vec<&str> = line.split(' ').collect();
        let [fname, code, dims, offset] = words[..] else {
            return Err(DescriptorError::Field(n));
        };
        let scalar = scalar(code).ok_or(DescriptorError::Code(n))?;
        let dims = if dims == "-" {
            Vec::new()
        } else {
            dims.split(',')
                .map(|d| d.parse().map_err(|_| DescriptorError::Number(n)))
                .collect::<Result<_, _>>()?
        };
        let offset = offset.parse().map_err(|_| DescriptorError::Number(n))?;
        fields.push(FieldLayout {
            name: fname.to_string(),
            scalar,
            dims,
            offset,
        });
    }
    Ok((name.to_string(), size, fields))
}

/// The variant of a layout error: `LayoutError` is one struct, about the whole struct or about
/// one field.
fn layout_kind(e: &LayoutError) -> &'static str {
    match e.field {
        Some(_) => "LayoutError/field",
        None => "LayoutError/struct",
    }
}

pub(crate) fn run(input: &[u8], sink: &mut dyn Sink) {
    const P: &str = "descriptor";
    const N: &str = "StructLayout::new";
    const W: &str = "StructLayout::wgsl_struct";
    let (name, size, fields) = match parse(input) {
        Ok(d) => d,
        Err(e) => return sink.rejected(P, e.kind(), &e),
    };
    let count = fields.len();
    let layout = match StructLayout::new(name.clone(), "a fuzz descriptor", fields, size) {
        Ok(l) => {
            sink.accepted(N);
            l
        }
        Err(e) => return sink.rejected(N, layout_kind(&e), &e),
    };
    let (align, natural) = (layout.align(), layout.natural_size());
    if layout.size() != size
        || !matches!(align, 1 | 2 | 4 | 8)
        || !size.is_multiple_of(align)
        || natural > size
        || layout.fields().len() != count
        || layout.name() != name
    {
        sink.violation(
            N,
            format_args!(
                "accepted size {size} as size {} align {align} natural {natural}",
                layout.size()
            ),
        );
    }
    if layout.expect_size(size).is_err() || layout.expect_size(size.wrapping_add(1)).is_ok() {
        sink.violation(N, format_args!("expect_size disagrees with size {size}"));
    }
    let c = layout.c_declaration();
    if !c.contains(&format!("sizeof({name}) == {size}")) {
        sink.violation(
            N,
            format_args!("the C declaration does not assert size {size}"),
        );
    }
    let narrow = layout.fields().iter().any(|f| f.scalar.size() < 4);
    let odd_pad = !(size - natural).is_multiple_of(4);
    for atomic in [false, true] {
        match layout.wgsl_struct("FuzzStruct", atomic) {
            Ok(w) => {
                sink.accepted(W);
                if narrow || odd_pad || !w.contains(&format!("// {size} bytes")) {
                    sink.violation(W, format_args!("declared a layout WGSL cannot hold"));
                }
            }
            Err(e) => {
                sink.rejected(W, "WgslLayoutError", &e);
                if !(narrow || odd_pad) {
                    sink.violation(W, format_args!("refused a layout of 32- and 64-bit fields"));
                }
            }
        }
    }
}

/// A field list: mostly as numpy lays a dtype out (fields at their C offsets, a size rounded
/// to the alignment or padded), with names, codes, extents, offsets and sizes at the edges.
pub(crate) fn generate(rng: &mut Rng, out: &mut Vec<u8>) {
    const NAMES: &[&str] = &[
        "x",
        "price",
        "_a",
        "T9",
        "9x",
        "__x",
        "_resident_pad",
        "a-b",
        "\u{e9}t\u{e9}",
        "",
    ];
    let name = |rng: &mut Rng, out: &mut Vec<u8>, i: usize| match rng.below(12) {
        0 => out.extend_from_slice(rng.pick(NAMES).as_bytes()),
        1 => out.extend(std::iter::repeat_n(b'n', rng.small_len(2000).max(1))),
        _ => {
            let _ = write!(Bytes(out), "f{i}");
        }
    };
    let n = 1 + rng.small_len(12);
    let mut lines = Vec::new();
    let mut at = 0usize;
    let mut align = 1usize;
    for i in 0..n {
        let mut line = Vec::new();
        name(rng, &mut line, i);
        let code_i = if rng.one_in(16) {
            rng.below(CODES.len())
        } else {
            rng.below(10)
        };
        let code = CODES[code_i];
        let a = scalar(code).map_or(4, Scalar::size);
        let _ = write!(Bytes(&mut line), " {code} ");
        let mut elems = 1usize;
        match rng.below(6) {
            0 => {
                let d = 1 + rng.below(16);
                elems = d;
                let _ = write!(Bytes(&mut line), "{d}");
            }
            1 => {
                let (d, e) = (1 + rng.below(8), 1 + rng.below(8));
                elems = d * e;
                let _ = write!(Bytes(&mut line), "{d},{e}");
            }
            2 if rng.one_in(4) => {
                line.extend_from_slice(rng.pick(NUMBERS).as_bytes());
                elems = 0;
            }
            _ => line.push(b'-'),
        }
        let natural = at.div_ceil(a).saturating_mul(a);
        let offset = match rng.below(12) {
            0 => natural.wrapping_add(1),
            1 => natural.saturating_sub(a),
            2 => rng.next_u64() as usize >> rng.below(64),
            _ => natural,
        };
        let _ = write!(Bytes(&mut line), " {offset}");
        at = natural.saturating_add(elems.saturating_mul(a));
        align = align.max(a);
        lines.push(line);
    }
    let natural = at.div_ceil(align).saturating_mul(align);
    let size = match rng.below(8) {
        0 => natural.saturating_add(4 * rng.below(8)),
        1 => natural.saturating_add(rng.below(16)),
        2 => natural.saturating_sub(align),
        3 => rng.next_u64() as usize >> rng.below(64),
        _ => natural,
    };
    name(rng, out, 99);
    let _ = write!(Bytes(out), " {size}");
    for line in lines {
        out.push(b'\n');
        out.extend_from_slice(&line);
    }
    if rng.one_in(4) {
        out.push(b'\n');
    }
}
