//! The input generator: a seeded SplitMix64, byte-level mutations of seed-corpus inputs, and the
//! building blocks the targets' structure-aware generators use.

use resident_workloads::rng::SplitMix64;

/// The workloads' SplitMix64 ([`resident_workloads::rng`]): the same sequence for the same
/// seed on every machine, with the helpers the generators use.
#[derive(Clone, Debug)]
pub struct Rng(SplitMix64);

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(SplitMix64::new(seed))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in `0..n` (`0` when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            return 0;
        }
        self.0.below(n as u64) as usize
    }

    /// True with probability `1 / n`.
    pub fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }

    /// One of `items` (`items` must not be empty).
    pub fn pick<'a, T: ?Sized>(&mut self, items: &[&'a T]) -> &'a T {
        items[self.below(items.len())]
    }

    /// A length biased to small values: mostly below 8, sometimes up to `max`.
    pub fn small_len(&mut self, max: usize) -> usize {
        match self.below(8) {
            0..=4 => self.below(8.min(max + 1)),
            5 | 6 => self.below(64.min(max + 1)),
            _ => self.below(max + 1),
        }
    }
}

/// Numbers at the edges of the types the decoders parse, as text.
pub const NUMBERS: &[&str] = &[
    "0",
    "-0",
    "1",
    "-1",
    "255",
    "256",
    "65535",
    "4294967295",
    "4294967296",
    "-2147483649",
    "9223372036854775807",
    "9223372036854775808",
    "18446744073709551615",
    "18446744073709551616",
    "99999999999999999999999999999",
    "1e308",
    "1e309",
    "-1e309",
    "5e-324",
    "2e-400",
    "1.7976931348623157e308",
    "NaN",
    "nan",
    "inf",
    "-inf",
    "infinity",
    "+1",
    ".5",
    "5.",
    "0x10",
    "1_000",
    "1e",
    "--1",
    "00",
    "0.0000000000000000000000000000000000000001",
];

/// Byte sequences that are not UTF-8: lone continuation bytes, overlong forms, surrogates,
/// code points above U+10FFFF, truncated sequences.
pub const NOT_UTF8: &[&[u8]] = &[
    b"\x80",
    b"\xff",
    b"\xc3",
    b"\xc0\xaf",
    b"\xe0\x80\xaf",
    b"\xed\xa0\x80",
    b"\xf4\x90\x80\x80",
    b"\xf0\x9f\x98",
    b"\xfe\xfe",
];

/// Bytes that separate or end things in the inputs.
const SPECIAL: &[u8] = b"\n\r\t ,#\"\\{}[]:0-.eE+\x00\x7f";

/// Applies one random mutation to `data`; `others` are inputs to splice from; `dict` are
/// tokens of the target's format. True when this was the rare "huge" mutation, which inserts
/// `huge / 2 ..= huge` bytes (the caller bounds the others' growth).
pub fn mutate(
    rng: &mut Rng,
    data: &mut Vec<u8>,
    others: &[&[u8]],
    dict: &[&str],
    huge: usize,
) -> bool {
    let len = data.len();
    let at = rng.below(len + 1);
    match rng.below(14) {
        // A bit flip.
        0 if len > 0 => {
            let i = rng.below(len);
            data[i] ^= 1 << rng.below(8);
        }
        // A byte set to a random or special value.
        1 if len > 0 => {
            let i = rng.below(len);
            data[i] = if rng.one_in(2) {
                rng.next_u64() as u8
            } else {
                SPECIAL[rng.below(SPECIAL.len())]
            };
        }
        // Random bytes inserted.
        2 => {
            let n = rng.small_len(16);
            let bytes: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
            data.splice(at..at, bytes);
        }
        // A range deleted.
        3 if len > 0 => {
            let n = rng.small_len(len - at.min(len));
            let end = (at + n).min(len);
            data.drain(at..end);
        }
        // Truncated.
        4 => data.truncate(at),
        // A range repeated.
        5 if len > 0 => {
            let start = rng.below(len);
            let end = (start + 1 + rng.small_len(len - start - 1)).min(len);
            let piece = data[start..end].to_vec();
            let times = 1 + rng.small_len(32);
            for _ in 0..times {
                data.splice(at..at, piece.iter().copied());
            }
        }
        // Spliced with another input: this one's head, the other's tail.
        6 if !others.is_empty() => {
            let other = others[rng.below(others.len())];
            let from = rng.below(other.len() + 1);
            data.truncate(at);
            data.extend_from_slice(&other[from..]);
        }
        // A number at a boundary, inserted or replacing a run of digits.
        7 => {
            let n = rng.pick(NUMBERS).as_bytes();
            let end = data[at..]
                .iter()
                .position(|b| !b.is_ascii_digit())
                .map_or(len, |p| at + p);
            data.splice(at..end, n.iter().copied());
        }
        // A token of the format.
        8 if !dict.is_empty() => {
            let t = rng.pick(dict).as_bytes();
            data.splice(at..at, t.iter().copied());
        }
        // Bytes that are not UTF-8.
        9 => {
            let b = rng.pick(NOT_UTF8);
            data.splice(at..at, b.iter().copied());
        }
        // Huge: one byte or a token repeated to a large size (rare).
        10 if rng.one_in(512) => {
            let n = huge / 2 + rng.below(huge / 2 + 1);
            let fill: Vec<u8> = if rng.one_in(2) {
                vec![SPECIAL[rng.below(SPECIAL.len())]; 1]
            } else if !dict.is_empty() {
                rng.pick(dict).as_bytes().to_vec()
            } else {
                b"7".to_vec()
            };
            let mut big = Vec::with_capacity(n + fill.len());
            while big.len() < n {
                big.extend_from_slice(&fill);
            }
            data.splice(at..at, big);
            return true;
        }
        // A special byte inserted.
        11 => data.insert(at, SPECIAL[rng.below(SPECIAL.len())]),
        // Two bytes swapped.
        12 if len > 1 => {
            let i = rng.below(len);
            let j = rng.below(len);
            data.swap(i, j);
        }
        _ => data.push(SPECIAL[rng.below(SPECIAL.len())]),
    }
    false
}

/// The pieces of a generated expression language ([`expr`]).
pub(crate) struct Expr {
    /// Operands.
    pub leaves: &'static [&'static str],
    /// A three-way choice: what comes before the first operand, between the two, after the
    /// second.
    pub select: [&'static str; 3],
    /// Binary operators, spaced.
    pub ops: &'static [&'static str],
}

/// An expression of `g` nested up to `depth` levels: a leaf, a parenthesized expression, a
/// choice of two, or two joined by an operator.
pub(crate) fn expr(rng: &mut Rng, out: &mut Vec<u8>, depth: usize, g: &Expr) {
    if depth == 0 || rng.one_in(3) {
        out.extend_from_slice(g.leaves[rng.below(g.leaves.len())].as_bytes());
        return;
    }
    match rng.below(4) {
        0 => {
            out.push(b'(');
            expr(rng, out, depth - 1, g);
            out.push(b')');
        }
        1 => {
            out.extend_from_slice(g.select[0].as_bytes());
            expr(rng, out, depth - 1, g);
            out.extend_from_slice(g.select[1].as_bytes());
            expr(rng, out, depth - 1, g);
            out.extend_from_slice(g.select[2].as_bytes());
        }
        _ => {
            expr(rng, out, depth - 1, g);
            out.extend_from_slice(g.ops[rng.below(g.ops.len())].as_bytes());
            expr(rng, out, depth - 1, g);
        }
    }
}
