//! The template language's invariants, shared by the fuzz targets (`fuzz/`) and the property
//! tests. Not an API: compiled for tests and with the `fuzzing` feature only. A check returns the
//! invariant it found broken.

use std::collections::HashMap;

use crate::{
    Field, Library, ParameterSource, TemplateError, TemplateSource, discover, validate_name,
    validate_text,
};

pub type Check = Result<(), String>;

macro_rules! ensure {
    ($cond:expr, $($arg:tt)*) => {
        if !$cond {
            return Err(format!($($arg)*));
        }
    };
}

/// A syntax error points at the text it is about.
fn syntax_error(text: &str, error: &TemplateError) -> Check {
    match error {
        TemplateError::InvalidName {
            token, position, ..
        } => {
            let at = text.get(position.offset..).unwrap_or_default();
            ensure!(
                at.starts_with(token.as_str()),
                "{text:?}: {error:?} is not at its token"
            );
            ensure!(
                token.starts_with("[[") && token.ends_with("]]"),
                "{text:?}: token {token:?}"
            );
        }
        TemplateError::Unclosed { position, .. } => {
            let at = text.get(position.offset..).unwrap_or_default();
            ensure!(at.starts_with("[["), "{text:?}: {error:?} is not at a '[['");
        }
        other => return Err(format!("{text:?}: unexpected syntax error {other:?}")),
    }
    let before = text.get(..error_offset(error)).unwrap_or_default();
    let position = match error {
        TemplateError::InvalidName { position, .. } | TemplateError::Unclosed { position, .. } => {
            *position
        }
        _ => return Ok(()),
    };
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    ensure!(
        (position.line, position.column) == (line, column),
        "{text:?}: {error:?} should be at line {line}, column {column}"
    );
    ensure!(!error.to_string().is_empty(), "{text:?}: empty message");
    Ok(())
}

fn error_offset(error: &TemplateError) -> usize {
    match error {
        TemplateError::InvalidName { position, .. } | TemplateError::Unclosed { position, .. } => {
            position.offset
        }
        _ => 0,
    }
}

/// The documented comment rules, written independently of the parser: `/* ... */` anywhere
/// (unclosed runs to the end), `//` at a line start or after white space up to the newline.
/// Placeholders are left as written.
pub fn strip_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    let mut previous: Option<char> = None;
    while let Some(c) = rest.chars().next() {
        if rest.starts_with("[[") && !rest.starts_with("[[[") {
            // A valid placeholder (the caller checked the syntax) is copied whole, so nothing
            // inside it is taken for a comment.
            if let Some(end) = rest.find("]]") {
                out.push_str(&rest[..end + 2]);
                previous = Some(']');
                rest = &rest[end + 2..];
                continue;
            }
        }
        if let Some(after) = rest.strip_prefix("/*") {
            rest = after.find("*/").map_or("", |end| &after[end + 2..]);
            previous = Some('/');
            continue;
        }
        if rest.starts_with("//") && previous.is_none_or(char::is_whitespace) {
            let end = rest.find('\n').unwrap_or(rest.len());
            rest = &rest[end..];
            previous = Some('/');
            continue;
        }
        out.push(c);
        previous = Some(c);
        rest = &rest[c.len_utf8()..];
    }
    out
}

/// One text: syntax errors point at their token with the right line and column; discovered
/// parameters are valid names, once each; a text that parses renders, without values, to its
/// comment-stripped self (so a text with no `[[`, `/*` or `//` renders byte for byte), and with
/// a value for every parameter leaves nothing unresolved.
pub fn text(text: &str) -> Check {
    let checked = validate_text(text, Field::Template);
    let found = discover(text, ParameterSource::Template);
    ensure!(
        checked.as_ref().err() == found.as_ref().err(),
        "{text:?}: validate_text and discover disagree"
    );
    let parameters = match found {
        Ok(parameters) => parameters,
        Err(error) => return syntax_error(text, &error),
    };
    for (index, parameter) in parameters.iter().enumerate() {
        ensure!(
            validate_name(&parameter.token),
            "{text:?}: parameter {parameter:?}"
        );
        ensure!(
            parameters[..index]
                .iter()
                .all(|p| p.token != parameter.token),
            "{text:?}: {} twice",
            parameter.token
        );
    }
    // A name no placeholder can spell, so the text cannot include itself.
    let library = Library::compile(&[TemplateSource {
        name: "Entry",
        template: text,
        user_template: Some(text),
    }])
    .map_err(|(_, error)| format!("{text:?}: valid text does not compile: {error}"))?;
    let rendered = library
        .render("Entry", &HashMap::new())
        .map_err(|error| format!("{text:?}: {error}"))?;
    let expected = strip_comments(text);
    ensure!(
        rendered.system == expected,
        "{text:?} renders as {:?}, not {expected:?}",
        rendered.system
    );
    ensure!(
        rendered.user.as_deref() == Some(expected.as_str()),
        "{text:?}: user text differs"
    );
    let names: Vec<&str> = parameters.iter().map(|p| p.token.as_str()).collect();
    ensure!(
        rendered.unresolved == names,
        "{text:?}: unresolved {:?}, parameters {names:?}",
        rendered.unresolved
    );
    if !text.contains("[[") && !text.contains("/*") && !text.contains("//") {
        ensure!(rendered.system == text, "{text:?}: plain text changed");
    }
    let values: HashMap<String, String> = names
        .iter()
        .map(|name| ((*name).to_owned(), format!("<{name}>")))
        .collect();
    let filled = library
        .render("Entry", &values)
        .map_err(|error| format!("{text:?}: {error}"))?;
    ensure!(
        filled.unresolved.is_empty(),
        "{text:?}: {:?} left",
        filled.unresolved
    );
    Ok(())
}

/// A set of templates: compiling never panics; every template renders (or stops at a limit)
/// with each unresolved name present as written; supplying every parameter leaves nothing
/// unresolved; parameters are reported once per source.
pub fn library(sources: &[(String, String, Option<String>)], value: &str) -> Check {
    let templates: Vec<TemplateSource<'_>> = sources
        .iter()
        .map(|(name, template, user)| TemplateSource {
            name,
            template,
            user_template: user.as_deref(),
        })
        .collect();
    let library = match Library::compile(&templates) {
        Ok(library) => library,
        Err((name, error)) => {
            ensure!(
                sources.iter().any(|(n, ..)| *n == name),
                "error names {name:?}, not in the set"
            );
            ensure!(!error.to_string().is_empty(), "empty message for {error:?}");
            return Ok(());
        }
    };
    let values: HashMap<String, String> = sources
        .iter()
        .filter_map(|(name, ..)| name.strip_prefix('v'))
        .map(|name| (name.to_owned(), value.to_owned()))
        .collect();
    let names: Vec<String> = library.names().map(str::to_owned).collect();
    for name in &names {
        let rendered = match library.render(name, &values) {
            Ok(rendered) => rendered,
            Err(TemplateError::TooDeep { .. } | TemplateError::TooLarge { .. }) => continue,
            Err(error) => return Err(format!("{name}: {error}")),
        };
        let user_len = rendered.user.as_ref().map_or(0, String::len);
        ensure!(
            rendered.system.len() <= crate::MAX_RENDERED_BYTES
                && user_len <= crate::MAX_RENDERED_BYTES,
            "{name}: rendered {} + {user_len} bytes",
            rendered.system.len()
        );
        for unresolved in &rendered.unresolved {
            let written = format!("[[{unresolved}]]");
            let in_user = rendered
                .user
                .as_deref()
                .is_some_and(|u| u.contains(&written));
            ensure!(
                rendered.system.contains(&written) || in_user,
                "{name}: unresolved {unresolved} is not in the output"
            );
        }
        let parameters = library
            .parameters(name)
            .map_err(|error| format!("{name}: {error}"))?;
        for (index, parameter) in parameters.iter().enumerate() {
            ensure!(
                parameters[..index]
                    .iter()
                    .all(|p| (&p.token, p.source) != (&parameter.token, parameter.source)),
                "{name}: parameter {} twice",
                parameter.token
            );
        }
        let everything: HashMap<String, String> = parameters
            .iter()
            .map(|parameter| (parameter.token.clone(), "v".to_owned()))
            .collect();
        match library.render(name, &everything) {
            Ok(filled) => {
                ensure!(
                    filled.unresolved.is_empty(),
                    "{name}: {:?} left",
                    filled.unresolved
                );
            }
            Err(TemplateError::TooLarge { .. }) => {}
            Err(error) => return Err(format!("{name}: {error}")),
        }
    }
    library.all_parameters();
    Ok(())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn pass(check: Check) -> Result<(), TestCaseError> {
        check.map_err(TestCaseError::fail)
    }

    /// Text made mostly of the language's delimiters, so the parser's branches are reached far
    /// more often than with uniform strings.
    fn template_text() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            Just("[[".to_owned()),
            Just("]]".to_owned()),
            Just("[".to_owned()),
            Just("/*".to_owned()),
            Just("*/".to_owned()),
            Just("//".to_owned()),
            Just("://".to_owned()),
            Just("\n".to_owned()),
            Just(" ".to_owned()),
            Just("[[va]]".to_owned()),
            Just("[[b]]".to_owned()),
            Just("[[c]]".to_owned()),
            "[a-z0-9_ é✓\t-]{0,4}",
            any::<String>(),
        ];
        prop::collection::vec(piece, 0..24).prop_map(|pieces| pieces.concat())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        #[test]
        fn texts_hold_their_invariants(text in prop_oneof![template_text(), any::<String>()]) {
            pass(super::text(&text))?;
        }

        #[test]
        fn libraries_hold_their_invariants(
            sources in prop::collection::vec(
                (
                    prop::sample::select(vec!["va", "b", "c", "main", "Bad"]),
                    template_text(),
                    proptest::option::of(template_text()),
                ),
                1..5,
            ),
            value in template_text(),
        ) {
            let sources: Vec<(String, String, Option<String>)> = sources
                .into_iter()
                .map(|(name, template, user)| (name.to_owned(), template, user))
                .collect();
            pass(library(&sources, &value))?;
        }
    }
}
