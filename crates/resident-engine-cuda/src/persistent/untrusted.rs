//! What a kernel's source text, which comes from users, may ask of the compiler beyond its own
//! text: nothing from the host's disk.
//!
//! A handler is compiled by NVRTC (CUDA) or the host C++ compiler (CudaSim), and both follow
//! `#include` anywhere on the machine: `#include "/dev/zero"` made g++ grow until the kernel's
//! OOM killer stopped it, and `#include "/etc/passwd"` put the file's lines into the compile
//! error handed back to whoever submitted the source. So every text a user hands in (the
//! handler, the message and buffer type declarations) is read here as the preprocessor reads
//! it, before any compiler sees it: line splices (`\` at a line's end) joined, comments, string,
//! character and raw string literals skipped, `#` and its digraph `%:` both taken as a
//! directive's start, and a directive that reads a file (`include`, `include_next`, `import`,
//! `embed`) or an operator that probes one (`__has_include`, `__has_include_next`,
//! `__has_embed`) is refused with its line and the name asked for, unless the name is one of
//! [`ALLOWED_INCLUDES`]: headers built into NVRTC, which read no file of the host.

/// The headers a kernel's source may include, in angle brackets: NVRTC's built-in half and
/// bfloat16 types (CudaSim's compiler has no such header, so there they are a compile error
/// naming the header, and no file of the host is read either way).
pub const ALLOWED_INCLUDES: [&str; 3] = ["cuda_fp16.h", "cuda_bf16.h", "cuda_fp8.h"];

/// A request of a file that a kernel's source may not make.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ForbiddenFile {
    /// The line of the text it is on (from 1; a spliced line counts from where it starts).
    pub line: usize,
    /// The directive or operator (`include`, `__has_include`, ...).
    pub directive: String,
    /// The name asked for, as written (at most 64 bytes of it; empty when none was given).
    pub name: String,
}

/// The first request in `text` of a file not in [`ALLOWED_INCLUDES`], if any.
///
/// ```
/// use resident_engine_cuda::persistent::untrusted::forbidden_file;
/// assert!(forbidden_file("#include <cuda_fp16.h>\n__device__ int f() { return 1; }").is_none());
/// let f = forbidden_file("int x;\n  # /* a */ include \"/etc/passwd\"\n").unwrap();
/// assert_eq!((f.line, f.directive.as_str(), f.name.as_str()), (2, "include", "\"/etc/passwd\""));
/// assert!(forbidden_file("%:include </dev/zero>").is_some());
/// assert!(forbidden_file("#inc\\\nlude \"x\"").is_some());
/// assert!(forbidden_file("const char* s = \"#include <x>\";").is_none());
/// ```
pub fn forbidden_file(text: &str) -> Option<ForbiddenFile> {
    let (code, lines, literal) = preprocess_view(text);
    let b = code.as_bytes();
    // Directives: at a line's start, after white space.
    let mut at_line_start = true;
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if literal[i] {
            // Inside a string, character or raw string literal: not code.
            at_line_start = false;
            i += 1;
            continue;
        }
        if c == b'\n' {
            at_line_start = true;
            i += 1;
            continue;
        }
        if c == b' ' || c == b'\t' || c == b'\x0b' || c == b'\x0c' || c == b'\r' {
            i += 1;
            continue;
        }
        let hash = if c == b'#' {
            Some(1)
        } else if c == b'%' && b.get(i + 1) == Some(&b':') {
            Some(2)
        } else {
            None
        };
        if at_line_start {
            if let Some(n) = hash {
                let mut j = i + n;
                while j < b.len() && (b[j] == b' ' || b[j] == b'\t') {
                    j += 1;
                }
                let start = j;
                while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'_') {
                    j += 1;
                }
                let word = &code[start..j];
                if matches!(word, "include" | "include_next" | "import" | "embed") {
                    let end = code[j..].find('\n').map_or(code.len(), |e| j + e);
                    let name = code[j..end].trim();
                    let allowed = name
                        .strip_prefix('<')
                        .and_then(|n| n.strip_suffix('>'))
                        .is_some_and(|n| ALLOWED_INCLUDES.contains(&n.trim()));
                    if !allowed {
                        return Some(ForbiddenFile {
                            line: lines[i],
                            directive: word.to_string(),
                            name: short(name),
                        });
                    }
                }
            }
        }
        at_line_start = false;
        // Operators that probe a file, anywhere in code.
        if c.is_ascii_alphabetic() || c == b'_' {
            let start = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            let word = &code[start..i];
            if matches!(word, "__has_include" | "__has_include_next" | "__has_embed") {
                return Some(ForbiddenFile {
                    line: lines[start],
                    directive: word.to_string(),
                    name: String::new(),
                });
            }
            continue;
        }
        i += 1;
    }
    None
}

/// At most 64 bytes of `s` (on a character boundary), for an error.
fn short(s: &str) -> String {
    let mut end = s.len().min(64);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

/// `text` as the preprocessor sees its tokens: line splices joined and every comment one space
/// (a comment's newlines kept); with the original line (from 1) of every byte, and whether it
/// is inside a string, character or raw string literal (quotes included).
fn preprocess_view(text: &str) -> (String, Vec<usize>, Vec<bool>) {
    // Phase 2: a backslash before a newline joins the lines (the newline is dropped).
    let mut joined = Vec::with_capacity(text.len());
    let mut line_of = Vec::with_capacity(text.len());
    let src = text.as_bytes();
    let mut line = 1usize;
    let mut i = 0;
    while i < src.len() {
        if src[i] == b'\\' {
            // `\` then optional spaces (g++ accepts them, with a warning) then a newline.
            let mut j = i + 1;
            while j < src.len() && (src[j] == b' ' || src[j] == b'\t' || src[j] == b'\r') {
                j += 1;
            }
            if j < src.len() && src[j] == b'\n' {
                line += 1;
                i = j + 1;
                continue;
            }
        }
        if src[i] == b'\n' {
            line += 1;
        }
        joined.push(src[i]);
        line_of.push(if src[i] == b'\n' { line - 1 } else { line });
        i += 1;
    }
    // Phase 3: comments and literals.
    let b = joined;
    let mut out = Vec::with_capacity(b.len());
    let mut lines = Vec::with_capacity(b.len());
    let mut lit = Vec::with_capacity(b.len());
    let mut push = |out: &mut Vec<u8>, lines: &mut Vec<usize>, c: u8, l: usize, in_lit: bool| {
        out.push(c);
        lines.push(l);
        lit.push(in_lit);
    };
    let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let l = line_of[i];
        if c == b'/' && b.get(i + 1) == Some(&b'/') {
            push(&mut out, &mut lines, b' ', l, false);
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
            continue;
        }
        if c == b'/' && b.get(i + 1) == Some(&b'*') {
            push(&mut out, &mut lines, b' ', l, false);
            i += 2;
            while i < b.len() && !(b[i] == b'*' && b.get(i + 1) == Some(&b'/')) {
                // Newlines inside a comment still end lines (a directive cannot span them).
                if b[i] == b'\n' {
                    push(&mut out, &mut lines, b'\n', line_of[i], false);
                }
                i += 1;
            }
            i += 2;
            continue;
        }
        // A raw string: R"delim( ... )delim", with an optional u8/u/U/L prefix before the R.
        if c == b'R'
            && b.get(i + 1) == Some(&b'"')
            && (i == 0 || !word(b[i - 1]) || raw_prefix(&b[..i]))
        {
            let open = i + 2;
            if let Some(paren) = b[open..].iter().take(17).position(|&x| x == b'(') {
                let delim = &b[open..open + paren];
                let mut close = Vec::with_capacity(delim.len() + 2);
                close.push(b')');
                close.extend_from_slice(delim);
                close.push(b'"');
                let body = open + paren + 1;
                let end = b[body..]
                    .windows(close.len())
                    .position(|w| w == close.as_slice())
                    .map_or(b.len(), |p| body + p + close.len());
                for (k, &byte) in b.iter().enumerate().take(end.min(b.len())).skip(i) {
                    push(&mut out, &mut lines, byte, line_of[k], true);
                }
                i = end;
                continue;
            }
        }
        if c == b'"' || c == b'\'' {
            push(&mut out, &mut lines, c, l, true);
            i += 1;
            while i < b.len() && b[i] != c && b[i] != b'\n' {
                if b[i] == b'\\' && i + 1 < b.len() && b[i + 1] != b'\n' {
                    push(&mut out, &mut lines, b[i], line_of[i], true);
                    i += 1;
                }
                push(&mut out, &mut lines, b[i], line_of[i], true);
                i += 1;
            }
            if i < b.len() && b[i] == c {
                push(&mut out, &mut lines, c, line_of[i], true);
                i += 1;
            }
            continue;
        }
        push(&mut out, &mut lines, c, l, false);
        i += 1;
    }
    // Comments were replaced by ASCII spaces between whole characters and every other byte
    // kept, so this is the input's UTF-8 (the lossy conversion never replaces a byte).
    let text = String::from_utf8_lossy(&out).into_owned();
    let n = text.len();
    lines.resize(n, lines.last().copied().unwrap_or(1));
    lit.resize(n, true);
    (text, lines, lit)
}

/// Whether the identifier characters just before an `R"` are a raw string's encoding prefix.
fn raw_prefix(before: &[u8]) -> bool {
    let tail: Vec<u8> = before
        .iter()
        .rev()
        .take_while(|c| c.is_ascii_alphanumeric() || **c == b'_')
        .copied()
        .collect();
    matches!(tail.as_slice(), b"8u" | b"u" | b"U" | b"L")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_way_to_spell_an_include_is_found() {
        for (text, line, name) in [
            ("#include \"/etc/passwd\"", 1, "\"/etc/passwd\""),
            ("#include </dev/zero>", 1, "</dev/zero>"),
            ("x;\n\n   #   include \"a.h\"", 3, "\"a.h\""),
            ("#/* c */include \"a.h\"", 1, "\"a.h\""),
            ("%:include \"a.h\"", 1, "\"a.h\""),
            ("#\\\ninclude \"a.h\"", 1, "\"a.h\""),
            ("#inc\\  \nlude \"a.h\"", 1, "\"a.h\""),
            ("#include_next <stdio.h>", 1, "<stdio.h>"),
            ("#import \"a.h\"", 1, "\"a.h\""),
            ("#embed \"/dev/urandom\"", 1, "\"/dev/urandom\""),
            ("#define F \"/etc/passwd\"\n#include F", 2, "F"),
            ("/* a\n b */ #include \"x\"", 2, "\"x\""),
            (
                "#include <cuda_fp16.h> // ok\n#include <cuda_fp16.h/../../etc/passwd>",
                2,
                "<cuda_fp16.h/../../etc/passwd>",
            ),
        ] {
            let f = forbidden_file(text).unwrap_or_else(|| panic!("missed: {text:?}"));
            assert_eq!((f.line, f.name.as_str()), (line, name), "{text:?}: {f:?}");
        }
        let f = forbidden_file("#if __has_include(\"/etc/shadow\")\n#endif").unwrap();
        assert_eq!((f.line, f.directive.as_str()), (1, "__has_include"));
    }

    #[test]
    fn code_comments_and_literals_are_not_directives() {
        for text in [
            "__device__ bool handle() { return true; }",
            "#include <cuda_fp16.h>",
            "#include <cuda_bf16.h>\n#define X 1\n#pragma unroll",
            "// #include \"/etc/passwd\"",
            "/* #include \"/etc/passwd\" */",
            "const char* s = \"\\n#include <x>\";",
            "const char* r = R\"(\n#include </etc/passwd>\n)\";",
            "const char* r = u8R\"xy(\n#include </etc/passwd>\n)xy\";",
            "int include = 1; x = a # b;",
            "char c = '#';",
        ] {
            assert_eq!(forbidden_file(text), None, "{text:?}");
        }
    }

    /// A raw string that hides a `/*` ends where the compiler ends it, so no directive after it
    /// hides in a comment the compiler does not see.
    #[test]
    fn a_raw_string_cannot_open_a_comment_the_compiler_does_not_see() {
        let text = "const char* s = R\"x( /* )x\";\n#include \"/etc/passwd\"\n// */";
        assert_eq!(forbidden_file(text).map(|f| f.line), Some(2));
    }

    #[test]
    fn a_long_name_is_quoted_short() {
        let text = format!("#include \"{}\"", "a".repeat(100_000));
        let f = forbidden_file(&text).unwrap();
        assert!(f.name.len() <= 64, "{}", f.name.len());
    }
}
