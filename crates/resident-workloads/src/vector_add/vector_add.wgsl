// Vector add as a WGSL ring-kernel handler: `vector_add::AddRange -> RangeDone` over the bound
// f32 buffers `a`, `b` and `c`. One message per invocation (the messages of a batch run in
// parallel; ranges are expected not to overlap, as the host sends them).
//
//   for i in offset .. offset + len: c[i] = a[i] + b[i]; answer ok = 1.
//   A range past any buffer, or overflowing, answers ok = 0 and touches nothing.
//   A loop the device cut short (llvmpipe runs at most 65535 loop iterations per invocation)
//   answers ok = 0 too, with the range partly written: keep ranges well under that on lavapipe.

fn vector_add(m: ResidentIn, out: ptr<function, ResidentOut>, env: Envelope) -> bool {
    (*out).offset = m.offset;
    (*out).len = m.len;
    (*out).ok = 0u;
    (*out)._pad = 0u;
    let n = min(a_len, min(b_len, c_len));
    // offset and len are u64 (vec2<u32>, low word first): anything with a high word is past
    // every buffer a storage binding can hold.
    if (m.offset.y != 0u || m.len.y != 0u) {
        return true;
    }
    let lo = m.offset.x;
    let len = m.len.x;
    if (lo > n || len > n - lo) {
        return true;
    }
    let end = lo + len;
    var i = lo;
    for (; i < end; i += 1u) {
        c[i] = a[i] + b[i];
    }
    (*out).ok = select(0u, 1u, i == end);
    return true;
}
