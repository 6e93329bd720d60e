fn handle(input: ResidentIn, out: ptr<function, ResidentOut>, env: Envelope) -> bool {
    let wide = resident_f32_to_f64(input.y);
    let back = resident_f64_to_f32(wide);
    let id = resident_u64_add(env.message_id, resident_u64(1u));
    (*out).x = id.x ^ input.x;
    (*out).y = back;
    switch input.x & 3u {
        case 0u: { return false; }
        default: { return true; }
    }
}
