//! Keyed batches on wgpu: the host groups each batch by key, the device walks the groups.
//!
//! A keyed WGSL kernel (`WgslHandler::keyed`) keeps per-key order with one invocation per
//! message and no waiting: the first message of each key in a batch *leads* its key, loads the
//! key's state once, runs the key's messages of the batch in order and stores the state back.
//! Which message leads, and which message of the key comes next, is worked out here on the
//! host while the batch is uploaded, in one pass over the batch (a hash map from key to the
//! key's last message so far): O(n) per batch. The device gets one word per message, its
//! *link* (binding 6 of group 0, `resident_links`):
//!
//! * bit 31 ([`LEADS`]) is set on the first message of its key in the batch;
//! * bits 0..31 hold the index of the key's next message in the batch, or [`END`] on the key's
//!   last message.
//!
//! A leader follows the links, so every invocation runs only its own key's messages and a
//! batch's work is linear in its size (finding its key's messages on the device, by scanning
//! the batch, would be O(n^2) per batch). The key is read on the host
//! from the same bytes the device reads (the key field's offset in the input struct, as naga
//! lays it out), and two messages share a key exactly when those four bytes are equal, as the
//! device's `==` on the field's `u32`/`i32` value.
//!
//! A walk the device cuts short (llvmpipe ends an invocation's loops after 65535 iterations in
//! all: a key with that many messages in one batch) marks the leader's keep flag `CUT_SHORT`,
//! and the host fails the kernel with `WgpuFault::CutShort` instead of publishing a batch
//! whose later messages did not run.

/// Bit 31 of a message's link: the first message of its key in the batch.
pub(super) const LEADS: u32 = 1 << 31;
/// The low bits of a key's last message's link: no later message of the key in the batch.
pub(super) const END: u32 = LEADS - 1;

/// The generated declarations and entry point of a keyed handler: `field` is the input's key
/// field, `function` the handler, `cut` the keep flag a walk cut short leaves.
pub(super) fn entry_point(workgroup: u32, field: &str, function: &str, cut: u32) -> String {
    format!(
        r#"// Keyed batches: the host's per-message links (bit 31: leads its key; low bits: the index
// of the key's next message in the batch, or 0x7fffffff after the key's last).
@group(0) @binding(6) var<storage, read> resident_links: array<u32>;
const resident_leads: u32 = {leads}u;
const resident_end: u32 = {end}u;

@compute @workgroup_size({workgroup})
fn resident_main(@builtin(global_invocation_id) gid: vec3<u32>) {{
    let i = gid.x;
    let n = resident_count.x;
    if (i >= n) {{ return; }}
    // The first message of each key in the batch leads its key; the others return here.
    if ((resident_links[i] & resident_leads) == 0u) {{ return; }}
    let key = resident_in[i].{field};
    // The key's messages of this batch, in order (the links only go forward), on this
    // invocation, against a copy of the key's state stored back once (only the leader touches
    // it in this batch).
    var ks: KeyState = keys[key];
    var k = i;
    for (; k < n; k = resident_links[k] & resident_end) {{
        var out: ResidentOut;
        let keep = {function}(&ks, resident_in[k], &out, resident_env[k]);
        resident_out[k] = out;
        resident_keep[k] = select(0u, 1u, keep);
    }}
    keys[key] = ks;
    // Cut short (llvmpipe's loop cap): mark the leader's own message (only this invocation
    // writes its flag); the host fails the kernel instead of losing the messages not reached.
    if (k < n) {{ resident_keep[i] = {cut}u; }}
}}
"#,
        leads = LEADS,
        end = END,
    )
}

#[cfg(feature = "wgpu")]
pub(super) use host::{key_offset, KeyedBatches};

#[cfg(feature = "wgpu")]
mod host {
    use super::{END, LEADS};
    use crate::wgsl::{Compiled, WgslError};
    use parking_lot::Mutex;
    use std::collections::HashMap;
    use std::hash::{BuildHasherDefault, Hasher};

    /// A hasher for `u32` keys: a multiply, then the high half folded into the low half (the
    /// map picks buckets with the low bits; keys that are multiples of a power of two still
    /// spread). Keys chosen to collide only slow the host's pass over a batch down (a map
    /// has no worst case worse than linear per lookup), never change its result.
    #[derive(Default)]
    pub(super) struct KeyHash(u64);

    impl Hasher for KeyHash {
        fn finish(&self) -> u64 {
            self.0 ^ (self.0 >> 32)
        }
        fn write(&mut self, bytes: &[u8]) {
            for &b in bytes {
                self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            }
        }
        fn write_u32(&mut self, k: u32) {
            self.0 = (self.0 ^ k as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    /// The links of one batch, and the map that makes them (both kept between batches, so a
    /// batch allocates nothing once the first has run).
    #[derive(Default)]
    pub(super) struct Chains {
        /// Key -> index of its last message so far in the batch.
        last: HashMap<u32, u32, BuildHasherDefault<KeyHash>>,
        links: Vec<u32>,
    }

    impl Chains {
        /// The links of a batch whose messages have the keys `keys`, in batch order (see the
        /// module docs). The batch must have fewer than [`END`] messages.
        pub(super) fn link(&mut self, keys: impl Iterator<Item = u32>) -> &[u32] {
            self.last.clear();
            self.links.clear();
            for (i, key) in keys.enumerate() {
                let i = i as u32;
                debug_assert!(i < END);
                match self.last.insert(key, i) {
                    None => self.links.push(LEADS | END),
                    Some(prev) => {
                        let l = &mut self.links[prev as usize];
                        *l = (*l & LEADS) | i;
                        self.links.push(END);
                    }
                }
            }
            &self.links
        }
    }

    /// What a keyed pipeline needs to link its batches: where the key is in an input message,
    /// and the chains' scratch (one batch is linked at a time: the lock is never contended).
    pub(crate) struct KeyedBatches {
        /// Byte offset of the key field (4 bytes) in the input message.
        key_at: usize,
        chains: Mutex<Chains>,
    }

    impl KeyedBatches {
        pub(crate) fn new(key_at: usize) -> Self {
            KeyedBatches {
                key_at,
                chains: Mutex::new(Chains::default()),
            }
        }

        /// Calls `upload` with the links of the batch whose input messages (`in_size` bytes
        /// each) are `payloads`, back to back as they are uploaded.
        pub(crate) fn with_links(
            &self,
            payloads: &[u8],
            in_size: usize,
            upload: impl FnOnce(&[u32]),
        ) {
            let at = self.key_at;
            let mut chains = self.chains.lock();
            let keys = payloads.chunks_exact(in_size.max(1)).map(|m| {
                // The device compares the field's four bytes as one u32/i32: so do we.
                u32::from_ne_bytes([m[at], m[at + 1], m[at + 2], m[at + 3]])
            });
            upload(chains.link(keys));
        }
    }

    /// The byte offset of the input struct's key field `field` (a member name, or a path
    /// `a.b` through nested structs) in the compiled module, through the type of
    /// `resident_in`'s elements: the field must be a `u32` or `i32` (the type that indexes
    /// `keys`). The module compiled, so the field exists; anything else is a `layout` error.
    pub(crate) fn key_offset(compiled: &Compiled, field: &str) -> Result<usize, WgslError> {
        let refuse = |message: String| WgslError {
            stage: "layout",
            message,
            line: None,
            column: None,
        };
        let m = &compiled.module;
        let input = m
            .global_variables
            .iter()
            .find(|(_, g)| g.name.as_deref() == Some("resident_in"))
            .map(|(_, g)| g.ty)
            .ok_or_else(|| refuse("the generated `resident_in` is missing".into()))?;
        let mut ty = match &m.types[input].inner {
            naga::TypeInner::Array { base, .. } => *base,
            _ => return Err(refuse("`resident_in` is not an array".into())),
        };
        let mut offset = 0usize;
        for name in field.split('.') {
            let naga::TypeInner::Struct { members, .. } = &m.types[ty].inner else {
                return Err(refuse(format!(
                    "key field `{field}`: `{name}` is not inside a struct"
                )));
            };
            let member = members
                .iter()
                .find(|s| s.name.as_deref() == Some(name.trim()))
                .ok_or_else(|| refuse(format!("key field `{field}`: no member `{name}`")))?;
            offset += member.offset as usize;
            ty = member.ty;
        }
        match m.types[ty].inner {
            naga::TypeInner::Scalar(naga::Scalar {
                kind: naga::ScalarKind::Uint | naga::ScalarKind::Sint,
                width: 4,
            }) => Ok(offset),
            _ => Err(refuse(format!(
                "key field `{field}` must be a u32 or an i32 (it indexes `keys`)"
            ))),
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        /// Follows the links from every leader: each key's messages in batch order, once each.
        fn walks(links: &[u32]) -> Vec<Vec<usize>> {
            let mut out = Vec::new();
            for (i, &l) in links.iter().enumerate() {
                if l & LEADS == 0 {
                    continue;
                }
                let mut walk = vec![i];
                let mut k = (l & END) as usize;
                while k < links.len() {
                    assert!(k > *walk.last().unwrap(), "links go forward");
                    walk.push(k);
                    k = (links[k] & END) as usize;
                }
                out.push(walk);
            }
            out
        }

        /// Per key, the indices of its messages, in order (the definition the links must meet).
        fn groups(keys: &[u32]) -> Vec<Vec<usize>> {
            let mut first: Vec<u32> = Vec::new();
            let mut out: Vec<Vec<usize>> = Vec::new();
            for (i, &k) in keys.iter().enumerate() {
                match first.iter().position(|&f| f == k) {
                    Some(g) => out[g].push(i),
                    None => {
                        first.push(k);
                        out.push(vec![i]);
                    }
                }
            }
            out
        }

        fn check(keys: &[u32]) {
            let mut c = Chains::default();
            let links = c.link(keys.iter().copied()).to_vec();
            assert_eq!(links.len(), keys.len());
            assert_eq!(walks(&links), groups(keys), "keys {keys:?}");
        }

        #[test]
        fn links_follow_each_key_in_batch_order() {
            check(&[]);
            check(&[7]);
            check(&[3, 3, 3, 3]);
            check(&[0, 1, 2, 3, 4]);
            check(&[5, 1, 5, 2, 1, 5, 9, 2]);
            // Keys whose low bits agree (multiples of 1024) and the extremes of u32.
            let spread: Vec<u32> = (0..300)
                .map(|i| (i % 17) * 1024)
                .chain([0, u32::MAX, u32::MAX - 1, u32::MAX])
                .collect();
            check(&spread);
            let mut x = 0x2545_f491u32;
            let random: Vec<u32> = (0..5000)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    x % 97
                })
                .collect();
            check(&random);
        }

        #[test]
        fn a_batch_reuses_the_map_of_the_last() {
            let mut c = Chains::default();
            c.link([1, 2, 1].into_iter());
            // Keys of the last batch must not leak into this one: 1 leads again.
            let links = c.link([2, 1].into_iter()).to_vec();
            assert_eq!(links, vec![LEADS | END, LEADS | END]);
        }

        #[test]
        fn key_offset_follows_nested_members() {
            let src = "struct Inner { a: u32, k: i32 }\n\
                       struct M { x: vec2<u32>, tag: f32, inner: Inner, key: u32 }\n\
                       @group(0) @binding(0) var<storage, read> resident_in: array<M>;\n\
                       @compute @workgroup_size(1) fn main() { let m = resident_in[0]; }\n";
            let c = crate::wgsl::compile(src)
                .map_err(|e| format!("{e:?}"))
                .unwrap();
            assert_eq!(key_offset(&c, "key").unwrap(), 20);
            assert_eq!(key_offset(&c, "inner.k").unwrap(), 16);
            for bad in ["tag", "x", "inner", "nope", "key.k"] {
                let e = key_offset(&c, bad).unwrap_err();
                assert_eq!(e.stage, "layout", "{bad}: {e}");
            }
        }
    }
}
