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

macro_rules! c_prim {
    ($($t:ty => $c:literal),* $(,)?) => {$(
        impl CField for $t {
            fn c_field(name: &str) -> String {
                format!(concat!($c, " {}"), name)
            }
            fn wgsl_type(atomic: bool) -> Result<String, WgslLayoutError> {
                <$t as WgslScalar>::wgsl(atomic)
            }
        }
    )*};
}

c_prim! {
    u8 => "unsigned char", i8 => "signed char", u16 => "unsigned short", i16 => "short",
    u32 => "unsigned int", i32 => "int", u64 => "unsigned long long", i64 => "long long",
    f32 => "float", f64 => "double",
}

macro_rules! wgsl_prim {
    ($($t:ty => $w:literal, $atomic:literal;)*) => {$(
        impl WgslScalar for $t {
            fn wgsl(atomic: bool) -> Result<String, WgslLayoutError> {
                Ok(if atomic && $atomic { format!("atomic<{}>", $w) } else { $w.to_string() })
            }
        }
    )*};
}

macro_rules! wgsl_refused {
    ($($t:ty => $why:literal;)*) => {$(
        impl WgslScalar for $t {
            fn wgsl(_atomic: bool) -> Result<String, WgslLayoutError> {
                Err(WgslLayoutError::new(stringify!($t), $why))
            }
        }
    )*};
}

/// The WGSL side of the primitives (what [`CField::wgsl_type`] returns for them).
trait WgslScalar {
    fn wgsl(atomic: bool) -> Result<String, WgslLayoutError>;
}

// 64-bit scalars are two 32-bit words, low word first: `vec2<u32>` has size 8 and alignment 8
// in WGSL, as `u64`/`i64`/`f64` have in C (and in Rust on every target we build for).
wgsl_prim! {
    u32 => "u32", true; i32 => "i32", true; f32 => "f32", false;
    u64 => "vec2<u32>", false; i64 => "vec2<u32>", false; f64 => "vec2<u32>", false;
}
wgsl_refused! {
    u8 => "WGSL has no 8-bit integers (pack four into a u32)";
    i8 => "WGSL has no 8-bit integers (pack four into a u32)";
    u16 => "WGSL has no 16-bit integers (pack two into a u32)";
    i16 => "WGSL has no 16-bit integers (pack two into a u32)";
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
                let mut s = format!(
                    "typedef struct __attribute__((aligned({}))) {{\n",
                    ::core::mem::align_of::<$name>()
                );
                $(
                    s.push_str("    ");
                    s.push_str(&<$ty as $crate::message::CField>::c_field(stringify!($field)));
                    s.push_str(";\n");
                )*
                s.push_str(&format!(
                    "}} {};\nstatic_assert(sizeof({}) == {}, \"{} layout differs between Rust and C\");\n",
                    stringify!($name), stringify!($name), ::core::mem::size_of::<$name>(), stringify!($name)
                ));
                s
            }
            fn wgsl_struct(
                name: &str,
                atomic: bool,
            ) -> Result<String, $crate::message::WgslLayoutError> {
                let mut s = format!(
                    "// {} bytes, as the Rust type {}\nstruct {} {{\n",
                    ::core::mem::size_of::<$name>(),
                    stringify!($name),
                    name
                );
                $(
                    let ty = <$ty as $crate::message::CField>::wgsl_type(atomic)
                        .map_err(|e| e.in_field(stringify!($name), stringify!($field)))?;
                    s.push_str(&format!("    {}: {},\n", stringify!($field), ty));
                )*
                s.push_str("}\n");
                Ok(s)
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

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
