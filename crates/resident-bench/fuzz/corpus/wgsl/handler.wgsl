fn handle(input: ResidentIn, out: ptr<function, ResidentOut>, env: Envelope) -> bool {
    var m = input;
    m.x = m.x * 3u + 1u;
    m.y = m.y * 0.5;
    *out = m;
    return true;
}
