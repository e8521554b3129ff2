//! Property tests: no input makes the engine panic, and plain text passes through untouched.

use std::collections::HashMap;

use baton_template::{
    Field, Library, ParameterSource, TemplateError, TemplateSource, discover, validate_text,
};
use proptest::prelude::*;

/// Text made mostly of the language's own delimiters, so the interesting paths are reached far
/// more often than with uniform random strings.
fn template_text() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just("[[".to_owned()),
        Just("]]".to_owned()),
        Just("[".to_owned()),
        Just("]".to_owned()),
        Just("/*".to_owned()),
        Just("*/".to_owned()),
        Just("//".to_owned()),
        Just("://".to_owned()),
        Just("\n".to_owned()),
        Just(" ".to_owned()),
        Just("[[a]]".to_owned()),
        Just("[[b]]".to_owned()),
        Just("[[main]]".to_owned()),
        Just("[[x_1]]".to_owned()),
        "[a-zA-Z0-9_ é✓\t-]{0,4}",
        any::<String>(),
    ];
    prop::collection::vec(piece, 0..24).prop_map(|pieces| pieces.concat())
}

/// Arbitrary bytes, made into text the way a careless client would.
fn lossy_text() -> impl Strategy<Value = String> {
    prop::collection::vec(any::<u8>(), 0..200)
        .prop_map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
}

fn any_text() -> impl Strategy<Value = String> {
    prop_oneof![template_text(), lossy_text(), any::<String>()]
}

/// Checks the invariants of a syntax error against the text it came from.
fn check_error(text: &str, error: &TemplateError) -> Result<(), TestCaseError> {
    match error {
        TemplateError::InvalidName {
            token, position, ..
        } => {
            prop_assert!(text[position.offset..].starts_with(token.as_str()));
            prop_assert!(token.starts_with("[[") && token.ends_with("]]"));
        }
        TemplateError::Unclosed { position, .. } => {
            prop_assert!(text[position.offset..].starts_with("[["));
        }
        other => prop_assert!(false, "unexpected syntax error {other:?}"),
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn validate_text_never_panics(text in any_text()) {
        if let Err(error) = validate_text(&text, Field::Template) {
            check_error(&text, &error)?;
            // The message is always printable.
            prop_assert!(!error.to_string().is_empty());
        }
    }

    #[test]
    fn discover_never_panics(text in any_text()) {
        match discover(&text, ParameterSource::ToolUrl) {
            Ok(parameters) => {
                for parameter in &parameters {
                    prop_assert!(baton_template::validate_name(&parameter.token));
                }
                let mut tokens: Vec<_> = parameters.iter().map(|p| &p.token).collect();
                tokens.dedup();
                prop_assert_eq!(tokens.len(), parameters.len());
            }
            Err(error) => check_error(&text, &error)?,
        }
    }

    #[test]
    fn compile_render_and_parameters_never_panic(
        texts in prop::collection::vec((any_text(), proptest::option::of(any_text())), 1..5),
        names in prop::collection::vec(prop_oneof![Just("main"), Just("a"), Just("b"), Just("x_1"), Just("Bad")], 1..5),
        value in any_text(),
    ) {
        let sources: Vec<TemplateSource<'_>> = texts
            .iter()
            .zip(&names)
            .map(|((template, user), name)| TemplateSource {
                name,
                template,
                user_template: user.as_deref(),
            })
            .collect();
        let Ok(library) = Library::compile(&sources) else {
            return Ok(());
        };
        let values: HashMap<String, String> = [("a".to_owned(), value)].into_iter().collect();
        for name in library.names() {
            let rendered = library.render(name, &values)?;
            for unresolved in &rendered.unresolved {
                let written = format!("[[{unresolved}]]");
                let in_user = rendered.user.as_deref().is_some_and(|user| user.contains(&written));
                prop_assert!(rendered.system.contains(&written) || in_user);
            }
            let parameters = library.parameters(name)?;
            // Supplying every discovered parameter leaves nothing unresolved.
            let everything: HashMap<String, String> = parameters
                .iter()
                .map(|parameter| (parameter.token.clone(), "v".to_owned()))
                .collect();
            prop_assert!(library.render(name, &everything)?.unresolved.is_empty());
        }
        library.all_parameters();
    }

    #[test]
    fn plain_text_renders_unchanged(text in prop_oneof![any::<String>(), lossy_text(), "[a-z \\[\\]/*:\n]{0,60}"]) {
        prop_assume!(!text.contains("[[") && !text.contains("/*") && !text.contains("//"));
        let library = Library::compile(&[TemplateSource { name: "main", template: &text, user_template: Some(&text) }])
            .map_err(|(_, error)| TestCaseError::fail(error.to_string()))?;
        let rendered = library.render("main", &HashMap::new())?;
        prop_assert_eq!(&rendered.system, &text);
        prop_assert_eq!(rendered.user.as_deref(), Some(text.as_str()));
        prop_assert!(rendered.unresolved.is_empty());
    }
}
