//! The C lexer that keeps NVRTC's parser off its stack's end: a kernel's source text (handler,
//! type declarations) that nests, runs operators or chains deeper than NVRTC can parse within its
//! thread's stack is refused before it compiles.

/// The deepest a kernel's source text (handler, type declarations) may nest brackets (`(`, `[`,
/// `{` together, outside comments and literals) and statements without braces (`for`, `while`,
/// `if`, `do`, `switch`, `template` before the statement's end). NVRTC's parser recurses once
/// per level and takes 1 to 2 KiB of its thread's stack for each: 1024 nested parentheses
/// abort a process whose compiling thread has a 2 MiB stack (found by `resident fuzz --target
/// cuda`); its optimizer takes far more per nested loop (1000 nested `for` overflow even a
/// 512 MiB stack).
pub const MAX_NESTING: usize = 256;

/// The most operator characters a kernel's source text may hold in a row (outside comments and
/// literals, whitespace between them counted as nothing): each prefix operator of a chain
/// (`!!!!x`, `- - - -x`, `****p`) is another level of NVRTC's recursion, like a bracket.
pub const MAX_OPERATOR_RUN: usize = 256;

/// The most assignments, conditional operators and casts one statement may chain (outside
/// comments and literals): each is another level of NVRTC's recursion, and long chains
/// (`a = a = a = ...`, `c ? x : c ? x : ...`, `(int)(int)(int)x`) kept its parser busy for
/// minutes (`resident fuzz --target cuda`). Counted: an `=` that is not part of `==`, `<=`,
/// `>=` or `!=`; a `?`; a `)` followed by `(`, a name or a number.
pub const MAX_CHAIN: usize = 256;

/// Where `text` nests deeper than [`MAX_NESTING`], runs more than [`MAX_OPERATOR_RUN`]
/// operator characters or chains more than [`MAX_CHAIN`] in a statement: its line (from 1) and
/// what it does. A C lexer's view, simplified:
/// comments, string and character literals are skipped; digit separators (`1'000`) and raw
/// strings may be misread, which can only miss a deep nesting inside them.
pub(super) fn too_deep(text: &str) -> Option<(usize, &'static str)> {
    #[derive(Clone, Copy, PartialEq)]
    enum At {
        Code,
        LineComment,
        BlockComment,
        Literal(u8),
    }
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || !b.is_ascii();
    let bytes = text.as_bytes();
    let (mut at, mut line, mut i) = (At::Code, 1usize, 0usize);
    // Brackets open; statements opened without braces since the last `;`, `{` or `}`;
    // parentheses open (a `;` inside them, as in `for (;;)`, ends no statement); operator
    // characters in a row.
    let (mut depth, mut chain, mut parens, mut run) = (0usize, 0usize, 0usize, 0usize);
    // Assignments, conditionals and casts since the statement began.
    let mut links = 0usize;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'\n' {
            line += 1;
        }
        match at {
            At::LineComment if b == b'\n' => at = At::Code,
            At::BlockComment if b == b'*' && bytes.get(i + 1) == Some(&b'/') => {
                at = At::Code;
                i += 1;
            }
            At::Literal(_) if b == b'\\' => i += 1,
            At::Literal(q) if b == q || b == b'\n' => at = At::Code,
            At::LineComment | At::BlockComment | At::Literal(_) => {}
            At::Code => match b {
                b'/' if bytes.get(i + 1) == Some(&b'/') => at = At::LineComment,
                b'/' if bytes.get(i + 1) == Some(&b'*') => {
                    at = At::BlockComment;
                    i += 1;
                }
                b'"' | b'\'' => {
                    at = At::Literal(b);
                    run = 0;
                }
                b if b.is_ascii_whitespace() => {}
                b if word(b) => {
                    let start = i;
                    while bytes.get(i + 1).is_some_and(|&b| word(b)) {
                        i += 1;
                    }
                    run = 0;
                    if matches!(
                        &bytes[start..=i],
                        b"for" | b"while" | b"if" | b"do" | b"switch" | b"template"
                    ) {
                        chain += 1;
                        // A statement of its own begins: its chain counts from nothing.
                        links = 0;
                    }
                }
                _ => {
                    match b {
                        b'(' => {
                            depth += 1;
                            parens += 1;
                        }
                        b')' => {
                            depth = depth.saturating_sub(1);
                            parens = parens.saturating_sub(1);
                        }
                        b'[' => depth += 1,
                        b']' => depth = depth.saturating_sub(1),
                        b'{' => {
                            depth += 1;
                            chain = 0;
                            links = 0;
                        }
                        b'}' => {
                            depth = depth.saturating_sub(1);
                            chain = 0;
                            links = 0;
                        }
                        b';' if parens == 0 => {
                            chain = 0;
                            links = 0;
                        }
                        b'=' => {
                            let prev = if i > 0 { bytes[i - 1] } else { b' ' };
                            let next = bytes.get(i + 1).copied().unwrap_or(b' ');
                            if !matches!(prev, b'=' | b'<' | b'>' | b'!') && next != b'=' {
                                links += 1;
                            }
                        }
                        b'?' => links += 1,
                        _ => {}
                    }
                    if b == b')' {
                        let next = bytes[i + 1..].iter().find(|c| !c.is_ascii_whitespace());
                        if next.is_some_and(|&c| c == b'(' || word(c)) {
                            links += 1;
                        }
                    }
                    if links > MAX_CHAIN {
                        return Some((
                            line,
                            "chains more than 256 assignments, conditional operators or casts in one statement",
                        ));
                    }
                    run += 1;
                    if run > MAX_OPERATOR_RUN && depth + chain <= MAX_NESTING {
                        return Some((line, "holds more than 256 operator characters in a row"));
                    }
                }
            },
        }
        if depth + chain > MAX_NESTING {
            return Some((line, "nests brackets or statements deeper than 256"));
        }
        i += 1;
    }
    None
}
