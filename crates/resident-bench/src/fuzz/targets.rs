//! The decoders under test: what each is given, its seed corpus, its structure-aware generator,
//! and how its outcome is judged (the error's variant, the error's length, the invariants of
//! what it accepted).

use std::fmt::Write as _;
use std::path::Path;

use resident_nats::async_nats::{HeaderMap, HeaderValue, Message, Subject};
use resident_nats::{
    parse_reply, Codec, DecodeError, ErrorKind, ErrorReply, JsonCodec, PodCodec, Reply,
    ERROR_HEADER, MAX_QUOTED,
};
use resident_workloads::input::{parse_edge_list, parse_readings};
use resident_workloads::{InputError, LineError};

use super::gen::{Rng, NUMBERS};
use super::sink::{Bytes, Sink};
use super::Target;

macro_rules! corpus {
    ($dir:literal: $($file:literal),+ $(,)?) => {
        &[$(include_bytes!(concat!("../../fuzz/corpus/", $dir, "/", $file)) as &[u8]),+]
    };
}

/// The seed corpus of a target (crates/resident-bench/fuzz/corpus/<target>/).
pub(crate) fn corpus(t: Target) -> &'static [&'static [u8]] {
    match t {
        Target::NatsCodec => corpus!("nats-codec":
            "u32.json", "f64.json", "order.json", "order-min.json", "error-reply.json",
            "tick.bin", "kind.txt"),
        Target::EdgeList => corpus!("edge-list": "small.txt", "sparse.txt", "comments.txt"),
        Target::Readings => corpus!("readings": "header.csv", "plain.csv", "bounds.csv"),
        Target::Layout => corpus!("layout": "tick.txt", "padded.txt", "grid.txt", "state.txt"),
        Target::Wgsl => corpus!("wgsl":
            "handler.wgsl", "loops.wgsl", "helpers.wgsl", "oneshot.wgsl"),
        Target::Cuda => corpus!("cuda":
            "handle.cu", "pipeline.cu", "keyed.cu", "buffers.cu", "loops.cu"),
    }
}

/// Tokens of a target's format, for the mutator.
pub(crate) fn dict(t: Target) -> &'static [&'static str] {
    match t {
        Target::NatsCodec => &[
            "{",
            "}",
            "[",
            "]",
            ":",
            ",",
            "\"",
            "\\u0000",
            "\\ud800",
            "\\udc00\\ud800",
            "\\\"",
            "null",
            "true",
            "false",
            "\"id\":",
            "\"side\":",
            "\"price\":",
            "\"qty\":",
            "\"tags\":",
            "\"venue\":",
            "\"buy\"",
            "\"sell\"",
            "\"error\":",
            "\"message\":",
            "\"bad_input\"",
            "busy",
            "kernel_failed",
            "[[[[[[[[",
            "{\"a\":{\"a\":",
        ],
        Target::EdgeList => &[
            " ", "\t", "\n", "\r\n", "#", "# c\n", "0 1\n", "\u{a0}", "\u{2028}",
        ],
        Target::Readings => &[
            ",",
            "\n",
            "\r\n",
            "#",
            "sensor,value\n",
            " ",
            "SENSOR , VALUE",
            "0,1\n",
            "\u{a0}",
        ],
        Target::Layout => &[
            " ",
            "\n",
            "-",
            ",",
            " f4 ",
            " f8 ",
            " u1 ",
            " i2 ",
            " u8 ",
            " <f4 ",
            " c8 ",
            "_resident_x",
            "__x",
            "\u{e9}",
            "x f4 - 0\n",
            "0,0",
            "4,4",
        ],
        Target::Wgsl => super::wgsl_gen::DICT,
        Target::Cuda => super::cuda_gen::DICT,
    }
}

/// A structure-aware input: well-formed most of the way, with values at the edges.
pub(crate) fn generate(t: Target, rng: &mut Rng, out: &mut Vec<u8>) {
    match t {
        Target::Layout => super::layout::generate(rng, out),
        Target::Wgsl => super::wgsl_gen::generate(rng, out),
        Target::Cuda => super::cuda_gen::generate(rng, out),
        Target::NatsCodec => gen_json(rng, out),
        Target::EdgeList => {
            for _ in 0..rng.small_len(40) {
                match rng.below(10) {
                    0 => out.extend_from_slice(b"# a comment\n"),
                    1 => out.push(b'\n'),
                    _ => {
                        push_id(rng, out);
                        out.extend_from_slice(rng.pick(&[" ", "\t", "  ", " \t "]).as_bytes());
                        push_id(rng, out);
                        if rng.one_in(8) {
                            out.extend_from_slice(b" # back");
                        }
                        out.extend_from_slice(rng.pick(&["\n", "\r\n"]).as_bytes());
                    }
                }
            }
        }
        Target::Readings => {
            if rng.one_in(3) {
                out.extend_from_slice(
                    rng.pick(&["sensor,value\n", "Sensor, Value\r\n"])
                        .as_bytes(),
                );
            }
            for _ in 0..rng.small_len(40) {
                if rng.one_in(10) {
                    out.extend_from_slice(b"# c\n");
                    continue;
                }
                push_id(rng, out);
                out.extend_from_slice(rng.pick(&[",", " , ", ","]).as_bytes());
                push_float(rng, out);
                out.push(b'\n');
            }
        }
    }
}

pub(crate) fn push_id(rng: &mut Rng, out: &mut Vec<u8>) {
    if rng.one_in(4) {
        out.extend_from_slice(rng.pick(NUMBERS).as_bytes());
    } else {
        let _ = write!(Bytes(out), "{}", rng.next_u64() >> rng.below(64));
    }
}

fn push_float(rng: &mut Rng, out: &mut Vec<u8>) {
    match rng.below(4) {
        0 => out.extend_from_slice(rng.pick(NUMBERS).as_bytes()),
        1 => {
            let _ = write!(Bytes(out), "{:e}", f64::from_bits(rng.next_u64()));
        }
        _ => {
            let _ = write!(Bytes(out), "{}", (rng.next_u64() as i64) as f64 / 1e6);
        }
    }
}

fn gen_json(rng: &mut Rng, out: &mut Vec<u8>) {
    match rng.below(8) {
        // An order, its fields in any order, some missing, some repeated or unknown.
        0..=3 => {
            out.push(b'{');
            let fields = ["id", "side", "price", "qty", "tags", "venue", "extra"];
            let n = 3 + rng.below(5);
            for i in 0..n {
                if i > 0 {
                    out.push(b',');
                }
                let f = fields[rng.below(fields.len())];
                let _ = write!(Bytes(out), "\"{f}\":");
                match f {
                    "side" if rng.one_in(4) => gen_string(rng, out, 2),
                    "side" => out.extend_from_slice(
                        rng.pick(&["\"buy\"", "\"sell\"", "\"hold\"", "\"BUY\"", "1"])
                            .as_bytes(),
                    ),
                    "tags" => {
                        out.push(b'[');
                        for j in 0..rng.small_len(6) {
                            if j > 0 {
                                out.push(b',');
                            }
                            gen_value(rng, out, 1);
                        }
                        out.push(b']');
                    }
                    "venue" => {
                        out.push(b'[');
                        for j in 0..rng.below(6) {
                            if j > 0 {
                                out.push(b',');
                            }
                            push_id(rng, out);
                        }
                        out.push(b']');
                    }
                    _ => push_float(rng, out),
                }
            }
            out.push(b'}');
        }
        // An error reply.
        4 => {
            let kind = rng.pick(&["bad_input", "busy", "timeout", "nope", "Busy", ""]);
            let _ = write!(Bytes(out), "{{\"error\":\"{kind}\",\"message\":");
            gen_value(rng, out, 2);
            out.push(b'}');
        }
        // A string (what a `String` request is; a number's decoder quotes it in its error).
        5 => gen_string(rng, out, 4),
        // Any value.
        _ => gen_value(rng, out, 6),
    }
}

fn gen_value(rng: &mut Rng, out: &mut Vec<u8>, depth: usize) {
    let choice = if depth == 0 {
        rng.below(3)
    } else {
        rng.below(5)
    };
    match choice {
        0 => push_float(rng, out),
        1 => gen_string(rng, out, 32),
        2 => out.extend_from_slice(rng.pick(&["null", "true", "false"]).as_bytes()),
        3 => {
            out.push(b'[');
            for j in 0..rng.small_len(5) {
                if j > 0 {
                    out.push(b',');
                }
                gen_value(rng, out, depth - 1);
            }
            out.push(b']');
        }
        _ => {
            out.push(b'{');
            for j in 0..rng.small_len(5) {
                if j > 0 {
                    out.push(b',');
                }
                if rng.one_in(8) {
                    gen_string(rng, out, 4);
                    out.push(b':');
                } else {
                    let _ = write!(Bytes(out), "\"k{j}\":");
                }
                gen_value(rng, out, depth - 1);
            }
            out.push(b'}');
        }
    }
}

/// A JSON string with escapes and multi-byte characters; one in `long_one_in` is longer than
/// any error may quote.
fn gen_string(rng: &mut Rng, out: &mut Vec<u8>, long_one_in: usize) {
    out.push(b'"');
    let long = rng.one_in(long_one_in);
    let len = if long {
        256 + rng.below(4096)
    } else {
        rng.small_len(24)
    };
    // A long string stays valid (its error must be the one that quotes it); a short one may
    // hold an invalid escape or a lone surrogate.
    let escapes: &[&str] = if long {
        &["\\n", "\\\"", "\\\\", "\\u00e9", "\\ud83d\\ude00"]
    } else {
        &[
            "\\n",
            "\\\"",
            "\\\\",
            "\\u00e9",
            "\\ud83d\\ude00",
            "\\ud800",
            "\\x",
        ]
    };
    for _ in 0..len {
        match rng.below(8) {
            0 => out.extend_from_slice(rng.pick(escapes).as_bytes()),
            1 => out.extend_from_slice("é😀".as_bytes()),
            _ => out.push(b'a' + rng.below(26) as u8),
        }
    }
    out.push(b'"');
}

/// Runs `input` through every decoder of the target (`full`: the slow ones too, the `cuda`
/// target's NVRTC compile).
pub(crate) fn run(t: Target, input: &[u8], sink: &mut dyn Sink, full: bool) {
    match t {
        Target::NatsCodec => nats(input, sink),
        Target::EdgeList => edge_list(input, sink),
        Target::Readings => readings(input, sink),
        Target::Layout => super::layout::run(input, sink),
        Target::Wgsl => super::wgsl_gen::run(input, sink),
        Target::Cuda => super::cuda_gen::run(input, sink, full),
    }
}

/// The variant of an input error (every one is typed: the match is exhaustive).
fn input_kind(e: &InputError) -> &'static str {
    match e {
        InputError::Io { .. } => "Io",
        InputError::Empty { .. } => "Empty",
        InputError::BadParameter { .. } => "BadParameter",
        InputError::BadLine { reason, .. } => match reason {
            LineError::NotUtf8 => "BadLine/NotUtf8",
            LineError::Fields { .. } => "BadLine/Fields",
            LineError::ExtraField { .. } => "BadLine/ExtraField",
            LineError::BadId { .. } => "BadLine/BadId",
            LineError::NotANumber { .. } => "BadLine/NotANumber",
            LineError::NotFinite { .. } => "BadLine/NotFinite",
        },
    }
}

fn edge_list(input: &[u8], sink: &mut dyn Sink) {
    const D: &str = "parse_edge_list";
    match parse_edge_list(Path::new("fuzz.txt"), input) {
        Ok(g) => {
            sink.accepted(D);
            if !g.ids.windows(2).all(|w| w[0] < w[1]) {
                sink.violation(D, format_args!("ids not strictly ascending"));
            }
            let n = g.ids.len();
            if g.edges
                .iter()
                .any(|&(a, b)| a as usize >= n || b as usize >= n)
            {
                sink.violation(D, format_args!("an edge names a node past {n}"));
            }
            if !g.edges.windows(2).all(|w| w[0] < w[1]) {
                sink.violation(D, format_args!("edges not sorted and distinct"));
            }
        }
        Err(e) => sink.rejected(D, input_kind(&e), &e),
    }
}

fn readings(input: &[u8], sink: &mut dyn Sink) {
    const D: &str = "parse_readings";
    match parse_readings(Path::new("fuzz.csv"), input) {
        Ok(r) => {
            sink.accepted(D);
            if let Some(x) = r.iter().find(|x| !x.value.is_finite()) {
                sink.violation(D, format_args!("accepted a value {}", x.value));
            }
        }
        Err(e) => sink.rejected(D, input_kind(&e), &e),
    }
}

/// A Pod message as a kernel takes it (16 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
struct Tick {
    price: f32,
    qty: u32,
    venue: [u8; 8],
}

/// A JSON request as a service declares it.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct OrderJson {
    id: u64,
    side: String,
    price: f64,
    qty: u32,
    #[serde(default)]
    tags: Vec<String>,
    venue: Option<[u8; 4]>,
}

/// The kernel input an order becomes.
#[derive(Debug)]
#[allow(dead_code)]
struct Order {
    id: u64,
    buy: bool,
    price: f32,
    qty: u32,
}

/// Why an order is not a valid input (its message quotes the side whole, as a user's
/// conversion may: the codec's error bounds it).
#[derive(Debug, thiserror::Error)]
enum OrderError {
    #[error("side '{0}' is neither buy nor sell")]
    Side(String),
    #[error("quantity 0")]
    ZeroQty,
    #[error("price {0} is not positive and finite")]
    Price(f64),
}

impl TryFrom<OrderJson> for Order {
    type Error = OrderError;
    fn try_from(o: OrderJson) -> Result<Self, OrderError> {
        let buy = match o.side.as_str() {
            "buy" => true,
            "sell" => false,
            _ => return Err(OrderError::Side(o.side)),
        };
        if o.qty == 0 {
            return Err(OrderError::ZeroQty);
        }
        if !(o.price.is_finite() && o.price > 0.0) {
            return Err(OrderError::Price(o.price));
        }
        Ok(Order {
            id: o.id,
            buy,
            price: o.price as f32,
            qty: o.qty,
        })
    }
}

/// The variant of a decode error (exhaustive: every rejection is typed).
fn decode_kind(e: &DecodeError) -> &'static str {
    match e {
        DecodeError::WrongSize { .. } => "WrongSize",
        DecodeError::Json(j) => match j.classify() {
            serde_json::error::Category::Io => "Json/Io",
            serde_json::error::Category::Syntax => "Json/Syntax",
            serde_json::error::Category::Data => "Json/Data",
            serde_json::error::Category::Eof => "Json/Eof",
        },
        DecodeError::Invalid(_) => "Invalid",
    }
}

fn decode<In, C: Codec<In, u32>>(
    codec: &C,
    decoder: &'static str,
    input: &[u8],
    sink: &mut dyn Sink,
) -> Option<In> {
    match codec.decode(input) {
        Ok(x) => {
            sink.accepted(decoder);
            Some(x)
        }
        Err(e) => {
            sink.rejected(decoder, decode_kind(&e), &e);
            None
        }
    }
}

fn pod<T: bytemuck::Pod>(decoder: &'static str, input: &[u8], sink: &mut dyn Sink) {
    let got = decode::<T, _>(&PodCodec, decoder, input, sink);
    if got.is_some() != (input.len() == std::mem::size_of::<T>()) {
        sink.violation(decoder, format_args!("accepted {} bytes", input.len()));
    }
}

fn nats(input: &[u8], sink: &mut dyn Sink) {
    // The request payload as each codec decodes it.
    pod::<u8>("PodCodec<u8>", input, sink);
    pod::<f32>("PodCodec<f32>", input, sink);
    pod::<Tick>("PodCodec<Tick>", input, sink);
    pod::<[u64; 8]>("PodCodec<[u64; 8]>", input, sink);
    decode::<u32, _>(&JsonCodec::<u32, u32>::new(), "JsonCodec<u32>", input, sink);
    decode::<f64, _>(&JsonCodec::<f64, u32>::new(), "JsonCodec<f64>", input, sink);
    decode::<String, _>(
        &JsonCodec::<String, u32>::new(),
        "JsonCodec<String>",
        input,
        sink,
    );
    decode::<Vec<f32>, _>(
        &JsonCodec::<Vec<f32>, u32>::new(),
        "JsonCodec<Vec<f32>>",
        input,
        sink,
    );
    decode::<Order, _>(
        &JsonCodec::<OrderJson, u32>::new(),
        "JsonCodec<Order>",
        input,
        sink,
    );

    // The client's side: a header value and a reply.
    const K: &str = "ErrorKind::parse";
    let text = std::str::from_utf8(input).ok();
    match text.map(|s| (s, ErrorKind::parse(s))) {
        Some((s, Some(k))) if k.as_str() == s => sink.accepted(K),
        Some((s, Some(k))) => sink.violation(K, format_args!("{s:?} parsed as {k}")),
        _ => sink.accepted("ErrorKind::parse/None"),
    }
    // The header is the input's first line when it is a valid header value.
    let first = input.split(|&b| b == b'\n').next().unwrap_or_default();
    let header: HeaderValue = std::str::from_utf8(first)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| HeaderValue::from("bad_input"));
    let header_kind = ErrorKind::parse(header.as_str());
    let mut headers = HeaderMap::new();
    headers.insert(ERROR_HEADER, header);
    let msg = Message {
        subject: Subject::from_static("fuzz"),
        reply: None,
        payload: input.to_vec().into(),
        headers: Some(headers),
        status: None,
        description: None,
        length: input.len(),
    };
    const R: &str = "parse_reply";
    match (parse_reply(&msg), header_kind) {
        (Reply::Output(p), None) if p.as_ref() == input => sink.accepted("parse_reply/Output"),
        (Reply::Error(e), Some(k)) => {
            sink.accepted("parse_reply/Error");
            match serde_json::from_slice::<ErrorReply>(input) {
                Ok(body) if body == e => {}
                Ok(_) => sink.violation(R, format_args!("the reply's own body was not kept")),
                Err(_) if e.error != k => sink.violation(R, format_args!("the header's kind lost")),
                Err(_) if e.message.len() > MAX_QUOTED + 32 => sink.violation(
                    R,
                    format_args!(
                        "a {}-byte body quoted in {} bytes",
                        input.len(),
                        e.message.len()
                    ),
                ),
                Err(_) => {}
            }
        }
        (r, k) => sink.violation(R, format_args!("{r:?} for header kind {k:?}")),
    }
}
