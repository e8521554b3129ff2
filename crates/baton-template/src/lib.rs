//! Baton's prompt templates: parsing, comment stripping, composition, rendering and parameter
//! discovery. No I/O.
//!
//! # The language
//!
//! - `[[name]]` is a placeholder; a name is `[a-z0-9_]+`. Anything else between `[[` and `]]`
//!   (`[[Bad-Name]]`, `[[a b]]`, `[[]]`) is [`TemplateError::InvalidName`], and a `[[` with no
//!   `]]` before the end of its line (or before another `[[`) is [`TemplateError::Unclosed`].
//!   Positions are byte offset, line and column (in characters) in the text as written, comments
//!   included.
//! - A lone `[`, a lone `]` and `]]` are plain text. In a run of `[`, only the last two open a
//!   placeholder, so `[[[x]]]` is `[` + `[[x]]` + `]`.
//! - `/* ... */` is a comment anywhere and may span lines; an unclosed `/*` runs to the end of
//!   the text (nothing after it is sent). `*/` alone is text.
//! - `//` starts a comment at the start of a line or after white space, never otherwise (so
//!   `https://example.com` and `a//b` are text); it runs to the end of the line, and the newline
//!   stays.
//! - Placeholders inside comments are ignored: neither errors nor parameters.
//! - Rendering removes comments and nothing else: no trimming, so a line that held only a comment
//!   leaves an empty line, and a text without `[[`, `/*` or `//` renders byte for byte as written.
//!   (Models are indifferent to a stray blank line; a renderer that edits white space would make
//!   prompts harder to predict.)
//!
//! # Composition
//!
//! A [`Library`] is one version's set of templates. In any of its texts, `[[x]]` resolves to (1)
//! the caller's value for `x`, inserted verbatim (never parsed); else (2) the `template` text of
//! the template named `x`, rendered with the same values; else (3) stays `[[x]]` and `x` is listed
//! in [`Rendered::unresolved`]. A template whose `template` includes itself, directly or through
//! others, fails [`Library::compile`] with [`TemplateError::Cycle`]; a `user_template` may include
//! its own template's `template` (that cannot recurse). Rendering stops at [`MAX_DEPTH`] nested
//! inclusions as a second guard. Since inclusion multiplies, a set whose fully expanded text
//! would exceed [`MAX_RENDERED_BYTES`], or go through more than [`MAX_EXPANSIONS`] placeholders,
//! fails to compile with [`TemplateError::TooLarge`], and so does a render whose values push the
//! output past [`MAX_RENDERED_BYTES`].

mod error;
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzz;
mod library;
mod parse;

pub use error::{Field, Position, TemplateError};
pub use library::{
    Library, MAX_DEPTH, MAX_EXPANSIONS, MAX_RENDERED_BYTES, Parameter, ParameterSource, Rendered,
    TemplateSource, discover, validate_text,
};
pub use parse::validate_name;
