//! What can be a message, and how a message type describes itself to C.
//!
//! Any `bytemuck::Pod + Send + 'static` type is a [`Message`] (blanket impl): fixed size, no
//! pointers, any bit pattern valid, so it can be copied into a ring shared with a GPU as is.
//! A type that a CUDA handler reads field by field also implements [`DeviceMessage`], which
//! yields the matching C `struct` declaration; the [`device_message!`](crate::device_message)
//! macro defines such a type and its declaration from one field list, so the layout is never
//! written twice by hand.

use bytemuck::Pod;

/// A value that can travel through a ring: fixed size, plain bytes, sendable.
///
/// Define message types with [`device_message!`](crate::device_message) (a `#[repr(C)]` struct
/// that is `Pod`, with its C declaration), or derive `bytemuck::Pod`. A type that is not `Pod`
/// (a `String`, a `Vec`, a struct with padding or references) is refused at compile time with
/// an error naming `Pod` and `Message` ("the trait `Pod` is not implemented for `String` ...
/// required for `String` to implement `Message`"); the fix is `device_message!`:
///
/// ```compile_fail
/// fn send<T: resident_ring::Message>(_: T) {}
/// send(String::from("not plain bytes"));
/// ```
pub trait Message: Pod + Send + 'static {}

impl<T: Pod + Send + 'static> Message for T {}

/// How a field of this type is declared in C (`float x`, `unsigned int v[4]`, `Tick t`).
pub trait CField {
    /// The C declaration of a field called `name` of this type (no trailing `;`).
    fn c_field(name: &str) -> String;
    /// Appends the declarations this type needs before it can be used (nested structs), in
    /// dependency order, without duplicates.
    fn c_dependencies(_out: &mut Vec<String>) {}
    /// The WGSL type of a field of this type, or why it has none that matches the Rust layout
    /// byte for byte. `atomic` asks for `atomic<u32>`/`atomic<i32>` in place of `u32`/`i32`
    /// (same size and alignment), for state that the invocations of a batch share; 64-bit
    /// fields stay `vec2<u32>` (WGSL has no 64-bit atomics).
    fn wgsl_type(_atomic: bool) -> Result<String, WgslLayoutError> {
        Err(WgslLayoutError::new(
            std::any::type_name::<Self>(),
            "has no WGSL equivalent",
        ))
    }
    /// Appends the WGSL declarations this type needs first (nested structs), in dependency
    /// order, without duplicates.
    fn wgsl_dependencies(_out: &mut Vec<String>) -> Result<(), WgslLayoutError> {
        Ok(())
    }
}

/// A Rust type that cannot be declared in WGSL with the same bytes at the same offsets.
///
/// WGSL (storage address space) has 4-byte scalars only (`u32`, `i32`, `f32`; `f16` needs an
/// extension), aligns a struct to its largest member and an array element to its own
/// alignment, and has no 8-, 16- or 64-bit types. A 64-bit field (`u64`, `i64`, `f64`) is
/// declared `vec2<u32>`, low word in `.x`, high word in `.y` (little-endian, as the bytes lie):
/// size 8 and alignment 8, exactly the C layout. The WGSL code the runtime generates around a
/// handler provides the conversions (`resident_f64_to_f32`, `resident_f32_to_f64`,
/// `resident_u64`, ...; see the wgpu backend). A message made of these scalars, arrays of
/// them and structs of them has exactly its C layout in WGSL; 8- and 16-bit integers are
/// refused here (the runtime reports it when a WGSL kernel is launched), never silently
/// re-laid out.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("type `{ty}` cannot be shared with WGSL: {reason}")]
pub struct WgslLayoutError {
    /// The Rust type (and field, when known).
    pub ty: String,
    /// Why.
    pub reason: String,
}

impl WgslLayoutError {
    /// An error about `ty`.
    pub fn new(ty: impl Into<String>, reason: impl Into<String>) -> Self {
        WgslLayoutError {
            ty: ty.into(),
            reason: reason.into(),
        }
    }
    /// The same error, naming the field it came from.
    pub fn in_field(self, owner: &str, field: &str) -> Self {
        WgslLayoutError {
            ty: format!("{owner}.{field}: {}", self.ty),
            reason: self.reason,
        }
    }
}

/// The scalar types a message field can be made of: the one table of their C and WGSL names
/// (the primitives' [`CField`] impls and [`StructLayout`] both read it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scalar {
    /// `u8`, C `unsigned char`.
    U8,
    /// `i8`, C `signed char`.
    I8,
    /// `u16`, C `unsigned short`.
    U16,
    /// `i16`, C `short`.
    I16,
    /// `u32`, C `unsigned int`, WGSL `u32`.
    U32,
    /// `i32`, C `int`, WGSL `i32`.
    I32,
    /// `u64`, C `unsigned long long`, WGSL `vec2<u32>`.
    U64,
    /// `i64`, C `long long`, WGSL `vec2<u32>`.
    I64,
    /// `f32`, C `float`, WGSL `f32`.
    F32,
    /// `f64`, C `double`, WGSL `vec2<u32>`.
    F64,
}

impl Scalar {
    /// The scalar of a numpy type code without byte order (`"u1"`, `"i4"`, `"f8"`, ...): how
    /// the Python binding's dtypes name the scalars (`None` for any other code).
    pub fn from_numpy_code(code: &str) -> Option<Scalar> {
        Some(match code {
            "u1" => Scalar::U8,
            "i1" => Scalar::I8,
            "u2" => Scalar::U16,
            "i2" => Scalar::I16,
            "u4" => Scalar::U32,
            "i4" => Scalar::I32,
            "u8" => Scalar::U64,
            "i8" => Scalar::I64,
            "f4" => Scalar::F32,
            "f8" => Scalar::F64,
            _ => return None,
        })
    }

    /// Size in bytes (also its alignment, in C, in WGSL and in Rust on every target we build).
    pub const fn size(self) -> usize {
        match self {
            Scalar::U8 | Scalar::I8 => 1,
            Scalar::U16 | Scalar::I16 => 2,
            Scalar::U32 | Scalar::I32 | Scalar::F32 => 4,
            Scalar::U64 | Scalar::I64 | Scalar::F64 => 8,
        }
    }

    /// The Rust name (`u32`, `f64`, ...).
    pub const fn rust_name(self) -> &'static str {
        match self {
            Scalar::U8 => "u8",
            Scalar::I8 => "i8",
            Scalar::U16 => "u16",
            Scalar::I16 => "i16",
            Scalar::U32 => "u32",
            Scalar::I32 => "i32",
            Scalar::U64 => "u64",
            Scalar::I64 => "i64",
            Scalar::F32 => "f32",
            Scalar::F64 => "f64",
        }
    }

    /// The C type.
    pub const fn c_type(self) -> &'static str {
        match self {
            Scalar::U8 => "unsigned char",
            Scalar::I8 => "signed char",
            Scalar::U16 => "unsigned short",
            Scalar::I16 => "short",
            Scalar::U32 => "unsigned int",
            Scalar::I32 => "int",
            Scalar::U64 => "unsigned long long",
            Scalar::I64 => "long long",
            Scalar::F32 => "float",
            Scalar::F64 => "double",
        }
    }

    /// The WGSL type with the same bytes (`atomic`: `atomic<u32>`/`atomic<i32>` for the
    /// 32-bit integers), or why there is none.
    ///
    /// 64-bit scalars are two 32-bit words, low word first: `vec2<u32>` has size 8 and
    /// alignment 8 in WGSL, as `u64`/`i64`/`f64` have in C (and in Rust on every target we
    /// build for). 8- and 16-bit integers are refused.
    pub fn wgsl(self, atomic: bool) -> Result<String, WgslLayoutError> {
        let plain = match self {
            Scalar::U32 => "u32",
            Scalar::I32 => "i32",
            Scalar::F32 => "f32",
            Scalar::U64 | Scalar::I64 | Scalar::F64 => "vec2<u32>",
            Scalar::U8 | Scalar::I8 => {
                return Err(WgslLayoutError::new(
                    self.rust_name(),
                    "WGSL has no 8-bit integers (pack four into a u32)",
                ))
            }
            Scalar::U16 | Scalar::I16 => {
                return Err(WgslLayoutError::new(
                    self.rust_name(),
                    "WGSL has no 16-bit integers (pack two into a u32)",
                ))
            }
        };
        Ok(match self {
            Scalar::U32 | Scalar::I32 if atomic => format!("atomic<{plain}>"),
            _ => plain.to_string(),
        })
    }
}

macro_rules! c_prim {
    ($($t:ty => $s:ident),* $(,)?) => {$(
        impl CField for $t {
            fn c_field(name: &str) -> String {
                format!("{} {}", Scalar::$s.c_type(), name)
            }
            fn wgsl_type(atomic: bool) -> Result<String, WgslLayoutError> {
                Scalar::$s.wgsl(atomic)
            }
        }
    )*};
}

c_prim! {
    u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32, u64 => U64,
    i64 => I64, f32 => F32, f64 => F64,
}

/// The text of a C struct declaration: `typedef struct __attribute__((aligned(align))) { .. }
/// name;` and a `static_assert` on its size. `fields` are C declarations without `;`.
/// [`device_message!`](crate::device_message) and [`StructLayout`] both emit through here.
#[doc(hidden)]
pub fn c_struct_text(name: &str, align: usize, size: usize, fields: &[String]) -> String {
    let mut s = format!("typedef struct __attribute__((aligned({align}))) {{\n");
    for f in fields {
        s.push_str("    ");
        s.push_str(f);
        s.push_str(";\n");
    }
    s.push_str(&format!(
        "}} {name};\nstatic_assert(sizeof({name}) == {size}, \"{name} layout differs between Rust and C\");\n"
    ));
    s
}

/// The text of a WGSL struct declaration, headed by a comment naming its size and `origin`
/// (`the Rust type Tick`). `fields` are `(name, WGSL type)`.
#[doc(hidden)]
pub fn wgsl_struct_text(
    name: &str,
    origin: &str,
    size: usize,
    fields: &[(&str, String)],
) -> String {
    let mut s = format!("// {size} bytes, as {origin}\nstruct {name} {{\n");
    for (f, ty) in fields {
        s.push_str(&format!("    {f}: {ty},\n"));
    }
    s.push_str("}\n");
    s
}

/// A message layout known only at run time (a numpy structured dtype, for example), declared
/// to C and WGSL through the same tables and text as [`device_message!`](crate::device_message)
/// types. Fields lie where C puts them: each at the next multiple of its alignment, in order
/// (a layout with fields elsewhere is refused, never re-laid out); `size` may exceed the
/// fields' natural size, the rest being declared as a trailing padding field
/// (`_resident_pad`), so a record can fill a fixed-size ring slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StructLayout {
    name: String,
    origin: String,
    fields: Vec<FieldLayout>,
    align: usize,
    natural: usize,
    size: usize,
}

/// One field of a [`StructLayout`]: `dims` empty for a scalar, `[n]` for `T name[n]`,
/// `[n, m]` for `T name[n][m]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldLayout {
    /// The field's name (a C and WGSL identifier).
    pub name: String,
    /// Its element type.
    pub scalar: Scalar,
    /// Array extents, outermost first.
    pub dims: Vec<usize>,
    /// Byte offset the caller's layout puts it at (checked against C's).
    pub offset: usize,
}

/// Why a run-time layout cannot be declared as a C (or WGSL) struct with the same bytes.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("layout `{layout}`{}: {reason}", field.as_ref().map(|f| format!(", field `{f}`")).unwrap_or_default())]
pub struct LayoutError {
    /// The layout's name (or origin).
    pub layout: String,
    /// The field concerned, if one.
    pub field: Option<String>,
    /// Why.
    pub reason: String,
}

/// A name as errors quote it: at most 64 bytes of it (names may come from anywhere), with its
/// whole length said when it was cut. Every error that quotes a user's name uses it.
pub fn quoted_name(s: &str) -> String {
    if s.len() <= 64 {
        return s.to_string();
    }
    let mut end = 64;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... ({} bytes)", &s[..end], s.len())
}

fn is_identifier(s: &str) -> bool {
    let mut c = s.chars();
    matches!(c.next(), Some(f) if f.is_ascii_alphabetic() || f == '_')
        && c.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !s.starts_with("__")
        && !s.starts_with("_resident")
}

impl StructLayout {
    /// The layout `name` (a C identifier) with `fields`, `size` bytes in all; `origin` says
    /// where it came from, for the generated comments (`the numpy dtype [('x', '<f4')]`).
    ///
    /// Refused (a [`LayoutError`] naming the field): a name that is not an identifier or is
    /// repeated, no fields, an empty array extent, a field not at the offset C gives it (fix:
    /// reorder the fields or build the dtype with `align=True`), overlapping fields, a `size`
    /// smaller than the C struct or not a multiple of its alignment.
    pub fn new(
        name: impl Into<String>,
        origin: impl Into<String>,
        fields: Vec<FieldLayout>,
        size: usize,
    ) -> Result<Self, LayoutError> {
        let name = name.into();
        let err = |field: Option<&str>, reason: String| LayoutError {
            layout: quoted_name(&name),
            field: field.map(|f| quoted_name(f)),
            reason,
        };
        if !is_identifier(&name) {
            return Err(err(None, "the struct name is not an identifier".into()));
        }
        if fields.is_empty() {
            return Err(err(None, "it has no fields".into()));
        }
        let mut at = 0usize;
        let mut align = 1usize;
        for (i, f) in fields.iter().enumerate() {
            let fe = |reason: String| err(Some(&f.name), reason);
            if !is_identifier(&f.name) {
                return Err(fe("the name is not an identifier ([A-Za-z_][A-Za-z0-9_]*, not starting with `__` or `_resident`)".into()));
            }
            if fields[..i].iter().any(|g| g.name == f.name) {
                return Err(fe("the name is repeated".into()));
            }
            if f.dims.contains(&0) {
                return Err(fe("an array extent is 0".into()));
            }
            let a = f.scalar.size();
            let too_big =
                || fe("the struct's size overflows (an array extent is too large)".into());
            let natural = at.div_ceil(a).checked_mul(a).ok_or_else(too_big)?;
            if f.offset != natural {
                return Err(fe(format!(
                    "it lies at byte {} but C puts it at byte {natural} (each field at the next multiple of its {a}-byte alignment, in order): reorder the fields or build the dtype with align=True",
                    f.offset
                )));
            }
            let n = f
                .dims
                .iter()
                .try_fold(1usize, |p, &d| p.checked_mul(d))
                .ok_or_else(too_big)?;
            at = n
                .checked_mul(a)
                .and_then(|b| natural.checked_add(b))
                .ok_or_else(too_big)?;
            align = align.max(a);
        }
        let natural = at
            .div_ceil(align)
            .checked_mul(align)
            .ok_or_else(|| err(None, "the struct's size overflows".into()))?;
        if size < natural || !size.is_multiple_of(align) {
            return Err(err(
                None,
                format!("{size} bytes, but the C struct of these fields has {natural} bytes and alignment {align}"),
            ));
        }
        Ok(StructLayout {
            name,
            origin: origin.into(),
            fields,
            align,
            natural,
            size,
        })
    }

    /// The struct's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its size in bytes (trailing padding included).
    pub fn size(&self) -> usize {
        self.size
    }

    /// Its alignment (the largest field's).
    pub fn align(&self) -> usize {
        self.align
    }

    /// The size of the fields alone, rounded to the alignment (what C gives the struct
    /// without the trailing padding field).
    pub fn natural_size(&self) -> usize {
        self.natural
    }

    /// `Ok` when the layout is `bytes` long (the record size a ring carries), else why not.
    pub fn expect_size(&self, bytes: usize) -> Result<(), LayoutError> {
        if self.size == bytes {
            return Ok(());
        }
        Err(LayoutError {
            layout: self.name.clone(),
            field: None,
            reason: format!(
                "{} bytes, but the kernel's records are {bytes} bytes",
                self.size
            ),
        })
    }

    /// The fields.
    pub fn fields(&self) -> &[FieldLayout] {
        &self.fields
    }

    fn c_field(f: &FieldLayout) -> String {
        let dims: String = f.dims.iter().map(|d| format!("[{d}]")).collect();
        format!("{} {}{dims}", f.scalar.c_type(), f.name)
    }

    /// The C `typedef struct` (as `device_message!` writes it), with a `static_assert` on the
    /// size.
    pub fn c_declaration(&self) -> String {
        let mut fields: Vec<String> = self.fields.iter().map(Self::c_field).collect();
        if self.size > self.natural {
            fields.push(format!(
                "unsigned char _resident_pad[{}]",
                self.size - self.natural
            ));
        }
        c_struct_text(&self.name, self.align, self.size, &fields)
    }

    /// The WGSL struct under `name` (`atomic`: 32-bit integer fields as atomics, for device
    /// state), or why WGSL cannot hold these bytes at these offsets (8- and 16-bit integers).
    pub fn wgsl_struct(&self, name: &str, atomic: bool) -> Result<String, WgslLayoutError> {
        let mut fields = Vec::with_capacity(self.fields.len() + 1);
        for f in &self.fields {
            let mut ty = f
                .scalar
                .wgsl(atomic)
                .map_err(|e| e.in_field(&quoted_name(&self.name), &quoted_name(&f.name)))?;
            for d in f.dims.iter().rev() {
                ty = format!("array<{ty}, {d}>");
            }
            fields.push((f.name.as_str(), ty));
        }
        let pad = self.size - self.natural;
        if pad > 0 {
            if !pad.is_multiple_of(4) {
                return Err(WgslLayoutError::new(
                    format!(
                        "{}: {} bytes of trailing padding",
                        quoted_name(&self.name),
                        pad
                    ),
                    "WGSL can only pad with 4-byte words",
                ));
            }
            fields.push(("_resident_pad", format!("array<u32, {}>", pad / 4)));
        }
        Ok(wgsl_struct_text(name, &self.origin, self.size, &fields))
    }
}

impl<T: CField, const N: usize> CField for [T; N] {
    fn c_field(name: &str) -> String {
        // `[[f32; 4]; 2]` -> `float name[2][4]`: the outer extent is written first in C.
        T::c_field(&format!("{name}[{N}]"))
    }
    fn c_dependencies(out: &mut Vec<String>) {
        T::c_dependencies(out)
    }
    fn wgsl_type(atomic: bool) -> Result<String, WgslLayoutError> {
        // Element stride in a WGSL array is roundUp(align(T), size(T)); every type accepted
        // here has a size that is a multiple of its alignment, so the stride is size_of::<T>().
        Ok(format!("array<{}, {N}>", T::wgsl_type(atomic)?))
    }
    fn wgsl_dependencies(out: &mut Vec<String>) -> Result<(), WgslLayoutError> {
        T::wgsl_dependencies(out)
    }
}

/// A message whose C declaration is known, so CUDA code can read its fields.
pub trait DeviceMessage: Message + CField {
    /// The C type name.
    const C_NAME: &'static str;

    /// The C `typedef struct` of this type alone, with a `static_assert` on its size.
    fn c_declaration() -> String;

    /// This type's declaration preceded by every nested struct's, each once.
    fn c_declarations() -> String {
        let mut decls = Vec::new();
        Self::c_dependencies(&mut decls);
        decls.concat()
    }

    /// The WGSL `struct` of this type alone, declared as `name` (`atomic`: integer fields as
    /// `atomic<u32>`/`atomic<i32>`, for shared device state), or why WGSL cannot hold it with
    /// the same layout.
    fn wgsl_struct(name: &str, atomic: bool) -> Result<String, WgslLayoutError>;

    /// This type's WGSL declaration (under its own name) preceded by every nested struct's,
    /// each once; `Err` when any field has no byte-identical WGSL type.
    fn wgsl_declarations() -> Result<String, WgslLayoutError> {
        let mut decls = Vec::new();
        Self::wgsl_dependencies(&mut decls)?;
        Ok(decls.concat())
    }
}

/// Defines a `#[repr(C)]` message struct together with its [`DeviceMessage`] impl.
///
/// The struct gets `Clone`, `Copy`, `Debug`, `bytemuck::Pod` and `bytemuck::Zeroable`; fields
/// must themselves be `Pod + CField` (primitives, arrays of them, other device messages), and a
/// compile-time check refuses a struct with padding (padding bytes are not plain data).
///
/// ```
/// resident_ring::device_message! {
///     /// One market tick.
///     pub struct Tick { pub price: f32, pub qty: u32, pub venue: [u8; 8] }
/// }
/// use resident_ring::message::DeviceMessage;
/// let decl = Tick::c_declaration();
/// assert!(decl.contains("float price;"));
/// assert!(decl.contains("unsigned char venue[8];"));
/// assert!(decl.contains("sizeof(Tick) == 16"));
/// ```
#[macro_export]
macro_rules! device_message {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident {
            $( $(#[$fmeta:meta])* $fvis:vis $field:ident : $ty:ty ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug)]
        $vis struct $name {
            $( $(#[$fmeta])* $fvis $field : $ty ),*
        }

        const _: () = {
            // No padding: the struct's size is exactly the sum of its fields' sizes.
            assert!(
                ::core::mem::size_of::<$name>() == 0 $( + ::core::mem::size_of::<$ty>() )*,
                concat!("device_message ", stringify!($name), " has padding; reorder or pad its fields explicitly")
            );
        };

        // SAFETY: repr(C), every field is Zeroable (checked below), so all-zero is valid.
        unsafe impl $crate::__bytemuck::Zeroable for $name {}
        // SAFETY: repr(C), no padding (asserted above), every field is Pod (checked below),
        // and the struct is Copy + 'static.
        unsafe impl $crate::__bytemuck::Pod for $name {}

        impl $name {
            #[allow(dead_code)]
            fn __resident_fields_are_pod() {
                fn is_pod<T: $crate::__bytemuck::Pod + $crate::message::CField>() {}
                $( is_pod::<$ty>(); )*
            }
        }

        impl $crate::message::CField for $name {
            fn c_field(name: &str) -> String {
                format!("{} {}", stringify!($name), name)
            }
            fn c_dependencies(out: &mut Vec<String>) {
                $( <$ty as $crate::message::CField>::c_dependencies(out); )*
                let decl = <$name as $crate::message::DeviceMessage>::c_declaration();
                if !out.contains(&decl) {
                    out.push(decl);
                }
            }
            fn wgsl_type(_atomic: bool) -> Result<String, $crate::message::WgslLayoutError> {
                // Nested structs are never made atomic: atomics apply to the state's own fields.
                Ok(stringify!($name).to_string())
            }
            fn wgsl_dependencies(
                out: &mut Vec<String>,
            ) -> Result<(), $crate::message::WgslLayoutError> {
                $( <$ty as $crate::message::CField>::wgsl_dependencies(out)?; )*
                let decl = <$name as $crate::message::DeviceMessage>::wgsl_struct(
                    stringify!($name),
                    false,
                )?;
                if !out.contains(&decl) {
                    out.push(decl);
                }
                Ok(())
            }
        }

        impl $crate::message::DeviceMessage for $name {
            const C_NAME: &'static str = stringify!($name);
            fn c_declaration() -> String {
                $crate::message::c_struct_text(
                    stringify!($name),
                    ::core::mem::align_of::<$name>(),
                    ::core::mem::size_of::<$name>(),
                    &[$( <$ty as $crate::message::CField>::c_field(stringify!($field)) ),*],
                )
            }
            fn wgsl_struct(
                name: &str,
                atomic: bool,
            ) -> Result<String, $crate::message::WgslLayoutError> {
                let fields = [$(
                    (
                        stringify!($field),
                        <$ty as $crate::message::CField>::wgsl_type(atomic)
                            .map_err(|e| e.in_field(stringify!($name), stringify!($field)))?,
                    )
                ),*];
                Ok($crate::message::wgsl_struct_text(
                    name,
                    concat!("the Rust type ", stringify!($name)),
                    ::core::mem::size_of::<$name>(),
                    &fields,
                ))
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by `resident fuzz --target layout`: a layout WGSL cannot hold named its struct
    /// and field whole in the error, so a long field name made a long error.
    #[test]
    fn regression_fuzz_wgsl_error_quotes_names_short() {
        let name = "n".repeat(5000);
        let l = StructLayout::new(
            "T".repeat(3000),
            "test",
            vec![FieldLayout {
                name: name.clone(),
                scalar: Scalar::U8,
                dims: vec![],
                offset: 0,
            }],
            1,
        )
        .unwrap();
        let e = l.wgsl_struct("W", false).unwrap_err();
        assert!(e.to_string().len() <= 512, "{} bytes", e.to_string().len());
        assert!(e.to_string().contains("5000 bytes"), "{e}");
        let l = StructLayout::new(
            "T".repeat(3000),
            "test",
            vec![FieldLayout {
                name,
                scalar: Scalar::U32,
                dims: vec![],
                offset: 0,
            }],
            6,
        );
        assert!(l.is_err(), "6 bytes is not a multiple of the alignment 4");
    }

    crate::device_message! {
        /// A nested type.
        pub struct Vec3 { pub x: f32, pub y: f32, pub z: f32 }
    }
    crate::device_message! {
        pub struct Particle { pub pos: Vec3, pub id: u32, pub m: [[f32; 2]; 3] }
    }

    #[test]
    fn nested_declarations_come_first_once() {
        let all = Particle::c_declarations();
        let v = all.find("} Vec3;").expect("Vec3 declared");
        let p = all.find("} Particle;").expect("Particle declared");
        assert!(v < p);
        assert_eq!(all.matches("} Vec3;").count(), 1);
        assert!(all.contains("Vec3 pos;"));
        assert!(all.contains("float m[3][2];"));
        assert!(all.contains("sizeof(Particle) == 40"));
    }

    crate::device_message! {
        pub struct Wide { pub id: u64, pub x: f32, pub pad: u32 }
    }
    crate::device_message! {
        pub struct Narrow { pub tag: u16, pub pad: u16, pub x: f32 }
    }

    #[test]
    fn wgsl_declarations_match_the_c_layout_or_are_refused() {
        let all = Particle::wgsl_declarations().unwrap();
        let v = all.find("struct Vec3 {").expect("Vec3 declared");
        let p = all.find("struct Particle {").expect("Particle declared");
        assert!(v < p);
        assert_eq!(all.matches("struct Vec3 {").count(), 1);
        assert!(all.contains("pos: Vec3,"));
        assert!(all.contains("m: array<array<f32, 2>, 3>,"));
        assert!(all.contains("// 40 bytes"));
        // The C emission is unchanged by the WGSL one.
        assert!(Particle::c_declarations().contains("float m[3][2];"));
        let atomic = Particle::wgsl_struct("ResidentState", true).unwrap();
        assert!(atomic.contains("struct ResidentState {"));
        assert!(atomic.contains("id: atomic<u32>,"));
        assert!(
            atomic.contains("pos: Vec3,"),
            "nested structs stay plain: {atomic}"
        );
        // 64-bit fields are two words, low first; never atomic.
        let wide = Wide::wgsl_declarations().unwrap();
        assert!(wide.contains("id: vec2<u32>,"), "{wide}");
        assert!(wide.contains("// 16 bytes"), "{wide}");
        let atomic = Wide::wgsl_struct("ResidentState", true).unwrap();
        assert!(atomic.contains("id: vec2<u32>,"), "{atomic}");
        assert!(atomic.contains("pad: atomic<u32>,"), "{atomic}");
        assert_eq!(<[f64; 3]>::wgsl_type(false).unwrap(), "array<vec2<u32>, 3>");
        assert_eq!(i64::wgsl_type(true).unwrap(), "vec2<u32>");
        assert!(Wide::c_declarations().contains("unsigned long long id;"));
        // 8- and 16-bit integers are still refused, naming the field.
        let e = Narrow::wgsl_declarations().unwrap_err();
        assert_eq!(e.ty, "Narrow.tag: u16");
        assert!(e.reason.contains("16-bit"), "{e}");
    }

    fn field(name: &str, scalar: Scalar, dims: &[usize], offset: usize) -> FieldLayout {
        FieldLayout {
            name: name.into(),
            scalar,
            dims: dims.to_vec(),
            offset,
        }
    }

    /// Found by fuzzing the layout path: extents whose product overflows panicked ("attempt
    /// to multiply with overflow") in debug and wrapped silently in release.
    #[test]
    fn regression_array_extents_that_overflow_are_a_typed_error() {
        for dims in [
            vec![usize::MAX / 2, 3],
            vec![usize::MAX],
            vec![1 << 40, 1 << 40],
        ] {
            let e = StructLayout::new("Huge", "test", vec![field("x", Scalar::F32, &dims, 0)], 16)
                .unwrap_err();
            assert!(e.reason.contains("overflows"), "{dims:?}: {e}");
        }
        // Past the last field: the struct's rounding up to its alignment.
        let e = StructLayout::new(
            "Edge",
            "test",
            vec![
                field("a", Scalar::U8, &[usize::MAX - 8], 0),
                field("b", Scalar::F64, &[], usize::MAX - 7),
            ],
            16,
        )
        .unwrap_err();
        assert!(e.reason.contains("overflows"), "{e}");
    }

    #[test]
    fn names_are_quoted_short_in_errors() {
        let long = format!("{}-", "x".repeat(1 << 20)); // not an identifier
        let e = StructLayout::new(
            long.clone(),
            "test",
            vec![field("a", Scalar::U32, &[], 0)],
            4,
        )
        .unwrap_err();
        assert!(e.to_string().len() < 300, "{} bytes", e.to_string().len());
        let e = StructLayout::new("Ok", "test", vec![field(&long, Scalar::U32, &[], 0)], 4)
            .unwrap_err();
        assert!(e.to_string().len() < 300, "{} bytes", e.to_string().len());
    }

    #[test]
    fn a_run_time_layout_declares_what_the_macro_declares() {
        let wide = StructLayout::new(
            "Wide",
            "the Rust type Wide",
            vec![
                field("id", Scalar::U64, &[], 0),
                field("x", Scalar::F32, &[], 8),
                field("pad", Scalar::U32, &[], 12),
            ],
            16,
        )
        .unwrap();
        assert_eq!(wide.c_declaration(), Wide::c_declaration());
        assert_eq!(
            wide.wgsl_struct("Wide", false).unwrap(),
            Wide::wgsl_struct("Wide", false).unwrap()
        );
        assert_eq!(
            wide.wgsl_struct("ResidentState", true).unwrap(),
            Wide::wgsl_struct("ResidentState", true).unwrap()
        );
        crate::device_message! {
            pub struct Grid { pub m: [[f32; 2]; 3], pub n: [u32; 2] }
        }
        let grid = StructLayout::new(
            "Grid",
            "the Rust type Grid",
            vec![
                field("m", Scalar::F32, &[3, 2], 0),
                field("n", Scalar::U32, &[2], 24),
            ],
            32,
        )
        .unwrap();
        assert_eq!(grid.c_declaration(), Grid::c_declaration());
        assert_eq!(
            grid.wgsl_struct("Grid", true).unwrap(),
            Grid::wgsl_struct("Grid", true).unwrap()
        );
    }

    #[test]
    fn a_run_time_layout_pads_to_its_size_and_refuses_what_c_would_lay_out_otherwise() {
        // C's implicit padding (u32 then f64: 4 bytes before the f64) is accepted as C has it,
        // and a larger size becomes a trailing padding field.
        let l = StructLayout::new(
            "M",
            "a test",
            vec![
                field("a", Scalar::U32, &[], 0),
                field("b", Scalar::F64, &[], 8),
            ],
            32,
        )
        .unwrap();
        assert_eq!((l.natural_size(), l.size(), l.align()), (16, 32, 8));
        let c = l.c_declaration();
        assert!(c.contains("unsigned char _resident_pad[16];"), "{c}");
        assert!(c.contains("sizeof(M) == 32"), "{c}");
        let w = l.wgsl_struct("M", false).unwrap();
        assert!(w.contains("b: vec2<u32>,"), "{w}");
        assert!(w.contains("_resident_pad: array<u32, 4>,"), "{w}");
        // A packed layout (f64 at byte 4) is not what C lays out: refused, naming the field.
        let e = StructLayout::new(
            "P",
            "a test",
            vec![
                field("a", Scalar::U32, &[], 0),
                field("b", Scalar::F64, &[], 4),
            ],
            16,
        )
        .unwrap_err();
        assert_eq!(e.field.as_deref(), Some("b"));
        assert!(e.reason.contains("align=True"), "{e}");
        for (fields, size, what) in [
            (vec![field("a b", Scalar::U32, &[], 0)], 4, "identifier"),
            (
                vec![
                    field("a", Scalar::U32, &[], 0),
                    field("a", Scalar::U32, &[], 4),
                ],
                8,
                "repeated",
            ),
            (vec![field("a", Scalar::U64, &[], 0)], 12, "alignment"),
            (vec![field("a", Scalar::U32, &[0], 0)], 4, "extent"),
            (vec![], 4, "no fields"),
        ] {
            let e = StructLayout::new("Q", "a test", fields, size).unwrap_err();
            assert!(e.to_string().contains(what), "{e}");
        }
        // WGSL refuses 8- and 16-bit fields, naming the field.
        let n =
            StructLayout::new("N", "a test", vec![field("t", Scalar::U16, &[2], 0)], 4).unwrap();
        assert!(n.c_declaration().contains("unsigned short t[2];"));
        let e = n.wgsl_struct("N", false).unwrap_err();
        assert_eq!(e.ty, "N.t: u16");
    }

    #[test]
    fn any_pod_is_a_message() {
        fn takes<M: Message>(_: M) {}
        takes(5u64);
        takes([0u8; 64]);
        takes(Particle {
            pos: Vec3 {
                x: 0.0,
                y: 0.0,
                z: 0.0,
            },
            id: 1,
            m: [[0.0; 2]; 3],
        });
    }
}
