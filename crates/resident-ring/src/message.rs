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
}

macro_rules! c_prim {
    ($($t:ty => $c:literal),* $(,)?) => {$(
        impl CField for $t {
            fn c_field(name: &str) -> String {
                format!(concat!($c, " {}"), name)
            }
        }
    )*};
}

c_prim! {
    u8 => "unsigned char", i8 => "signed char", u16 => "unsigned short", i16 => "short",
    u32 => "unsigned int", i32 => "int", u64 => "unsigned long long", i64 => "long long",
    f32 => "float", f64 => "double",
}

impl<T: CField, const N: usize> CField for [T; N] {
    fn c_field(name: &str) -> String {
        // `[[f32; 4]; 2]` -> `float name[2][4]`: the outer extent is written first in C.
        T::c_field(&format!("{name}[{N}]"))
    }
    fn c_dependencies(out: &mut Vec<String>) {
        T::c_dependencies(out)
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
