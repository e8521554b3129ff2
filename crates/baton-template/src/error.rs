//! The crate's one error type and the positions it reports.

use serde::Serialize;

/// Where something is in the original text (before comments were stripped).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct Position {
    /// Byte offset from the start of the text.
    pub offset: usize,
    /// 1-based line.
    pub line: usize,
    /// 1-based column, counted in characters (Unicode scalar values), not bytes.
    pub column: usize,
}

impl Position {
    /// The position of byte `offset` of `text`. `offset` must be a character boundary (the parser
    /// only reports ASCII delimiters, which always are); anything else is clamped to one.
    pub fn of(text: &str, offset: usize) -> Position {
        let mut offset = offset.min(text.len());
        while !text.is_char_boundary(offset) {
            offset -= 1;
        }
        let before = &text[..offset];
        let line_start = before.rfind('\n').map_or(0, |newline| newline + 1);
        Position {
            offset,
            line: before.bytes().filter(|&byte| byte == b'\n').count() + 1,
            column: before[line_start..].chars().count() + 1,
        }
    }
}

/// Which text an error is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum Field {
    /// A template's `template` (system prompt).
    #[serde(rename = "template")]
    Template,
    /// A template's `userTemplate`.
    #[serde(rename = "userTemplate")]
    UserTemplate,
    /// A tool URL checked through [`crate::discover`].
    #[serde(rename = "toolUrl")]
    ToolUrl,
}

impl Field {
    /// The field's name as the API spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Field::Template => "template",
            Field::UserTemplate => "userTemplate",
            Field::ToolUrl => "toolUrl",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// Something between `[[` and `]]` that is not `[a-z0-9_]+`. `token` is the text as written,
    /// brackets included (`[[Bad-Name]]`).
    #[error(
        "invalid parameter name '{token}' at line {}, column {}: use lowercase letters, digits and _",
        .position.line,
        .position.column
    )]
    InvalidName {
        token: String,
        position: Position,
        field: Field,
    },
    /// A `[[` with no `]]` on the same line (names never span lines).
    #[error(
        "unclosed '[[' at line {}, column {}: close the parameter with ']]'",
        .position.line,
        .position.column
    )]
    Unclosed { position: Position, field: Field },
    /// A template includes itself; `path` is the chain, first and last the same (`a -> b -> a`).
    #[error("template '{}' includes itself: {}", .path.first().map_or("", String::as_str), .path.join(" -> "))]
    Cycle { path: Vec<String> },
    /// Rendering went through more nested templates than allowed.
    #[error("templates are nested more than {limit} levels deep")]
    TooDeep { limit: usize },
    /// Rendering would produce too much text or go through too many placeholders (templates
    /// included many times over, or large values repeated).
    #[error(
        "the rendered prompt would exceed {limit}: templates include each other too many times or values are too large"
    )]
    TooLarge { limit: String },
    /// No template of that name in the set.
    #[error("unknown template '{0}'")]
    UnknownTemplate(String),
    /// Two templates of one set share a name, so `[[name]]` would be ambiguous.
    #[error("two templates are named '{0}'")]
    DuplicateTemplate(String),
}
