fn mix(a: u32, b: u32) -> u32 {
    return (a ^ (b << 5u)) * 2654435761u;
}

fn handle(input: ResidentIn, out: ptr<function, ResidentOut>, env: Envelope) -> bool {
    var acc = input.x;
    for (var i = 0u; i < 8u; i = i + 1u) {
        acc = mix(acc, i);
        if (acc % 7u == 0u) { continue; }
    }
    (*out).x = acc;
    (*out).y = f32(acc & 0xffu) / 255.0;
    return resident_priority(env) < 4u;
}
