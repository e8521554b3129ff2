//! Splits one text into literal runs and placeholders, dropping comments. Every delimiter is
//! ASCII, so scanning bytes and slicing at delimiter offsets always lands on character
//! boundaries.

use crate::error::{Field, Position, TemplateError};

/// One piece of a parsed text, as byte ranges into that text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Piece {
    /// `text[start..end]`, output as is.
    Literal { start: usize, end: usize },
    /// `[[name]]` spanning `text[start..end]`; the name is `text[start + 2..end - 2]`.
    Placeholder { start: usize, end: usize },
}

impl Piece {
    /// The name of a placeholder; `None` for a literal.
    pub(crate) fn name(self, text: &str) -> Option<&str> {
        match self {
            Piece::Placeholder { start, end } => text.get(start + 2..end - 2),
            Piece::Literal { .. } => None,
        }
    }
}

/// `[a-z0-9_]+`: parameter and template names.
pub fn validate_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|byte| byte.is_ascii_lowercase() || byte.is_ascii_digit() || byte == b'_')
}

/// Parses `text` into pieces. Errors carry positions in `text` as given.
pub(crate) fn parse(text: &str, field: Field) -> Result<Vec<Piece>, TemplateError> {
    let bytes = text.as_bytes();
    let mut pieces = Vec::new();
    // Start of the literal run not yet pushed.
    let mut literal = 0;
    let mut i = 0;
    let flush = |pieces: &mut Vec<Piece>, start: usize, end: usize| {
        if start < end {
            pieces.push(Piece::Literal { start, end });
        }
    };
    while i < bytes.len() {
        let next = bytes.get(i + 1).copied();
        match (bytes[i], next) {
            // In a run of `[`, only the last two open a placeholder: `[[[x]]]` is `[`, `[[x]]`, `]`.
            (b'[', Some(b'[')) if bytes.get(i + 2) != Some(&b'[') => {
                let Some(close) = closing(bytes, i + 2) else {
                    return Err(TemplateError::Unclosed {
                        position: Position::of(text, i),
                        field,
                    });
                };
                if !validate_name(&text[i + 2..close]) {
                    return Err(TemplateError::InvalidName {
                        token: text[i..close + 2].to_owned(),
                        position: Position::of(text, i),
                        field,
                    });
                }
                flush(&mut pieces, literal, i);
                pieces.push(Piece::Placeholder {
                    start: i,
                    end: close + 2,
                });
                i = close + 2;
                literal = i;
            }
            (b'/', Some(b'*')) => {
                flush(&mut pieces, literal, i);
                // An unclosed block comment runs to the end of the text.
                i = find(bytes, i + 2, b"*/").map_or(bytes.len(), |end| end + 2);
                literal = i;
            }
            (b'/', Some(b'/')) if starts_line_comment(text, i) => {
                flush(&mut pieces, literal, i);
                // The newline is not part of the comment: the next line stays a line.
                i = bytes[i + 2..]
                    .iter()
                    .position(|&byte| byte == b'\n')
                    .map_or(bytes.len(), |newline| i + 2 + newline);
                literal = i;
            }
            _ => i += 1,
        }
    }
    flush(&mut pieces, literal, bytes.len());
    Ok(pieces)
}

/// Offset of the `]]` closing a placeholder whose name starts at `from`. `None` when the line
/// ends, or another `[[` starts, first: names never contain either, and reporting the opening
/// `[[` then points at the real mistake.
fn closing(bytes: &[u8], from: usize) -> Option<usize> {
    let mut j = from;
    while j < bytes.len() {
        match (bytes[j], bytes.get(j + 1).copied()) {
            (b']', Some(b']')) => return Some(j),
            (b'[', Some(b'[')) | (b'\n', _) => return None,
            _ => j += 1,
        }
    }
    None
}

fn find(bytes: &[u8], from: usize, needle: &[u8]) -> Option<usize> {
    bytes
        .get(from..)?
        .windows(needle.len())
        .position(|window| window == needle)
        .map(|at| from + at)
}

/// `//` is a comment at the start of the text or of a line, or after white space; so `://` in a
/// URL (or `a//b`) is text.
fn starts_line_comment(text: &str, at: usize) -> bool {
    text[..at]
        .chars()
        .next_back()
        .is_none_or(char::is_whitespace)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn literal_text(text: &str) -> String {
        parse(text, Field::Template)
            .unwrap()
            .into_iter()
            .map(|piece| match piece {
                Piece::Literal { start, end } | Piece::Placeholder { start, end } => {
                    &text[start..end]
                }
            })
            .collect()
    }

    #[test]
    fn pieces_of_a_simple_text() {
        let text = "Hi [[name]], /* x */bye";
        assert_eq!(
            parse(text, Field::Template).unwrap(),
            vec![
                Piece::Literal { start: 0, end: 3 },
                Piece::Placeholder { start: 3, end: 11 },
                Piece::Literal { start: 11, end: 13 },
                Piece::Literal { start: 20, end: 23 },
            ]
        );
    }

    #[test]
    fn runs_of_brackets() {
        assert_eq!(literal_text("[[[x]]]"), "[[[x]]]");
        let pieces = parse("[[[x]]]", Field::Template).unwrap();
        assert_eq!(pieces[1], Piece::Placeholder { start: 1, end: 6 });
        assert_eq!(literal_text("a [ b ] c ]] d"), "a [ b ] c ]] d");
    }

    #[test]
    fn names() {
        for good in ["a", "a_b", "x9", "_", "0"] {
            assert!(validate_name(good), "{good}");
        }
        for bad in ["", "A", "a-b", "a b", "é", "a.b"] {
            assert!(!validate_name(bad), "{bad}");
        }
    }
}
