//! Table tests: one per rule of the language, composition and discovery.

use std::collections::HashMap;

use baton_template::{
    Field, Library, MAX_DEPTH, MAX_EXPANSIONS, MAX_RENDERED_BYTES, Parameter, ParameterSource,
    Position, Rendered, TemplateError, TemplateSource, discover, validate_name, validate_text,
};

fn values(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
        .collect()
}

fn source<'a>(name: &'a str, template: &'a str) -> TemplateSource<'a> {
    TemplateSource {
        name,
        template,
        user_template: None,
    }
}

/// Renders one template alone.
fn render_one(text: &str, pairs: &[(&str, &str)]) -> Result<Rendered, TemplateError> {
    let library = Library::compile(&[source("main", text)]).map_err(|(_, error)| error)?;
    library.render("main", &values(pairs))
}

fn param(token: &str, source: ParameterSource, prompt_template: Option<&str>) -> Parameter {
    Parameter {
        token: token.to_owned(),
        source,
        prompt_template: prompt_template.map(str::to_owned),
    }
}

fn at(offset: usize, line: usize, column: usize) -> Position {
    Position {
        offset,
        line,
        column,
    }
}

#[test]
fn syntax_errors_name_the_token_and_its_position() {
    let cases: &[(&str, TemplateError)] = &[
        (
            "Hello [[Bad-Name]]!",
            TemplateError::InvalidName {
                token: "[[Bad-Name]]".into(),
                position: at(6, 1, 7),
                field: Field::Template,
            },
        ),
        (
            "[[a b]]",
            TemplateError::InvalidName {
                token: "[[a b]]".into(),
                position: at(0, 1, 1),
                field: Field::Template,
            },
        ),
        (
            "x [[]] y",
            TemplateError::InvalidName {
                token: "[[]]".into(),
                position: at(2, 1, 3),
                field: Field::Template,
            },
        ),
        (
            "[[Name]]",
            TemplateError::InvalidName {
                token: "[[Name]]".into(),
                position: at(0, 1, 1),
                field: Field::Template,
            },
        ),
        (
            "ok [[fine]]\nthen [[open",
            TemplateError::Unclosed {
                position: at(17, 2, 6),
                field: Field::Template,
            },
        ),
        // A name never spans lines, so the `]]` on the next line does not close it.
        (
            "[[open\n]]",
            TemplateError::Unclosed {
                position: at(0, 1, 1),
                field: Field::Template,
            },
        ),
        // A second `[[` before any `]]`: the first one is the mistake.
        (
            "[[a [[b]]",
            TemplateError::Unclosed {
                position: at(0, 1, 1),
                field: Field::Template,
            },
        ),
        // Multi-byte characters before the token: offset in bytes, column in characters.
        (
            "Grüße\nzürich ✓ [[X]]",
            TemplateError::InvalidName {
                token: "[[X]]".into(),
                position: at(20, 2, 10),
                field: Field::Template,
            },
        ),
        // Positions count the comments that rendering strips.
        (
            "/* a\n comment */ // more\n  [[Bad]]",
            TemplateError::InvalidName {
                token: "[[Bad]]".into(),
                position: at(27, 3, 3),
                field: Field::Template,
            },
        ),
    ];
    for (text, expected) in cases {
        assert_eq!(
            validate_text(text, Field::Template).as_ref(),
            Err(expected),
            "{text:?}"
        );
        assert_eq!(
            Library::compile(&[source("main", text)]).err(),
            Some(("main".to_owned(), expected.clone())),
            "{text:?}"
        );
    }
}

#[test]
fn error_messages() {
    let error = validate_text("Hello [[Bad-Name]]", Field::Template).unwrap_err();
    assert_eq!(
        error.to_string(),
        "invalid parameter name '[[Bad-Name]]' at line 1, column 7: use lowercase letters, digits and _"
    );
    let error = validate_text("a\n [[x", Field::Template).unwrap_err();
    assert_eq!(
        error.to_string(),
        "unclosed '[[' at line 2, column 2: close the parameter with ']]'"
    );
    let cycle = TemplateError::Cycle {
        path: vec!["a".into(), "b".into(), "a".into()],
    };
    assert_eq!(
        cycle.to_string(),
        "template 'a' includes itself: a -> b -> a"
    );
}

#[test]
fn errors_in_the_user_template_say_so() {
    let set = [TemplateSource {
        name: "main",
        template: "fine",
        user_template: Some("ask [[Q]]"),
    }];
    assert_eq!(
        Library::compile(&set).err(),
        Some((
            "main".to_owned(),
            TemplateError::InvalidName {
                token: "[[Q]]".into(),
                position: at(4, 1, 5),
                field: Field::UserTemplate,
            }
        ))
    );
}

#[test]
fn plain_text_rules() {
    // (template, rendered with x = "X")
    let cases = [
        ("a [ b ] c", "a [ b ] c"),
        ("closing ]] alone", "closing ]] alone"),
        ("[x] and [ [x] ]", "[x] and [ [x] ]"),
        ("[[[x]]]", "[X]"),
        ("[[x]]]]", "X]]"),
        ("end with [", "end with ["),
        ("stray */ closer", "stray */ closer"),
        ("", ""),
    ];
    for (text, expected) in cases {
        let rendered = render_one(text, &[("x", "X")]).unwrap();
        assert_eq!(rendered.system, expected, "{text:?}");
    }
}

#[test]
fn comments() {
    let cases = [
        // URLs survive: `//` after `:` is not a comment.
        (
            "See https://example.com/docs and ftp://x.org",
            "See https://example.com/docs and ftp://x.org",
        ),
        ("a//b stays", "a//b stays"),
        // At the start of a line (the newline stays) and after a space.
        ("// header\nbody", "\nbody"),
        ("line one\n// note\nline two", "line one\n\nline two"),
        ("code; // trailing note\nnext", "code; \nnext"),
        ("tab\t// note", "tab\t"),
        ("  // indented\nx", "  \nx"),
        // Block comments anywhere, spanning lines.
        ("a/* inline */b", "ab"),
        ("before\n/* one\ntwo\nthree */\nafter", "before\n\nafter"),
        ("x /* never closed\nmore\n", "x "),
        // A `//` comment hides a `/*`, and a block comment hides a `//`.
        ("a // b /* c\nd */ e", "a \nd */ e"),
        ("a /* // */ b", "a  b"),
        // Comment markers glued to text after a comment are judged on the original text.
        ("/* c *///d", "//d"),
        // Windows line endings: `\r` is white space, so `//` after it is a comment.
        ("one\r\n// two\r\nthree", "one\r\n\nthree"),
    ];
    for (text, expected) in cases {
        let rendered = render_one(text, &[]).unwrap();
        assert_eq!(rendered.system, expected, "{text:?}");
        assert!(rendered.unresolved.is_empty());
    }
}

#[test]
fn placeholders_in_comments_are_ignored() {
    let text = "Hi [[name]] /* [[Bad-Name]] [[hidden]] */ // [[Also Bad]] [[hidden2]]\n[[ok]] /* [[unclosed";
    assert_eq!(validate_text(text, Field::Template), Ok(()));
    let rendered = render_one(text, &[("name", "Ann")]).unwrap();
    assert_eq!(rendered.system, "Hi Ann  \n[[ok]] ");
    assert_eq!(rendered.unresolved, vec!["ok"]);
    assert_eq!(
        discover(text, ParameterSource::Template).unwrap(),
        vec![
            param("name", ParameterSource::Template, None),
            param("ok", ParameterSource::Template, None),
        ]
    );
}

#[test]
fn unresolved_placeholders_stay_and_are_reported_once() {
    let set = [TemplateSource {
        name: "main",
        template: "[[b]] [[a]] [[given]] [[b]]",
        user_template: Some("[[c]] [[a]]"),
    }];
    let library = Library::compile(&set).unwrap();
    let rendered = library.render("main", &values(&[("given", "G")])).unwrap();
    assert_eq!(
        rendered,
        Rendered {
            system: "[[b]] [[a]] G [[b]]".into(),
            user: Some("[[c]] [[a]]".into()),
            unresolved: vec!["b".into(), "a".into(), "c".into()],
        }
    );
}

#[test]
fn values_are_inserted_verbatim() {
    let rendered = render_one(
        "[[x]]|[[y]]",
        &[("x", "[[y]] /* not a comment */"), ("y", "")],
    )
    .unwrap();
    assert_eq!(rendered.system, "[[y]] /* not a comment */|");
    assert!(rendered.unresolved.is_empty());
}

fn nested_set() -> [TemplateSource<'static>; 4] {
    [
        TemplateSource {
            name: "main",
            template: "M([[persona]]) [[topic]]",
            user_template: Some("U([[rules]]) [[question]]"),
        },
        source("persona", "P([[tone]] [[name]])"),
        source("tone", "T([[style]]) // tone note"),
        source("rules", "R([[tone]])"),
    ]
}

#[test]
fn composition_three_levels_deep() {
    let library = Library::compile(&nested_set()).unwrap();
    let rendered = library
        .render(
            "main",
            &values(&[
                ("style", "calm"),
                ("name", "Ann"),
                ("topic", "tax"),
                ("question", "why?"),
            ]),
        )
        .unwrap();
    assert_eq!(rendered.system, "M(P(T(calm)  Ann)) tax");
    assert_eq!(rendered.user.as_deref(), Some("U(R(T(calm) )) why?"));
    assert!(rendered.unresolved.is_empty());

    // Unresolved names deep inside included templates are reported too.
    let rendered = library.render("main", &HashMap::new()).unwrap();
    assert_eq!(rendered.system, "M(P(T([[style]])  [[name]])) [[topic]]");
    assert_eq!(rendered.unresolved, ["style", "name", "topic", "question"]);

    // Any template of the set can be the entry.
    let rendered = library
        .render("persona", &values(&[("style", "s")]))
        .unwrap();
    assert_eq!(rendered.system, "P(T(s)  [[name]])");
    assert_eq!(rendered.user, None);
}

#[test]
fn a_caller_value_beats_a_template_of_the_same_name() {
    let library = Library::compile(&nested_set()).unwrap();
    let rendered = library
        .render(
            "main",
            &values(&[("persona", "custom persona"), ("topic", "t")]),
        )
        .unwrap();
    assert_eq!(rendered.system, "M(custom persona) t");
    // The persona's own placeholders were never reached, so they are not unresolved.
    assert_eq!(rendered.unresolved, ["style", "question"]);
}

#[test]
fn cycles_are_rejected_at_compile_time() {
    let direct = [source("a", "x [[a]] y")];
    assert_eq!(
        Library::compile(&direct).err(),
        Some((
            "a".to_owned(),
            TemplateError::Cycle {
                path: vec!["a".into(), "a".into()]
            }
        ))
    );

    let indirect = [
        source("main", "[[a]]"),
        source("a", "[[b]]"),
        source("b", "[[c]] /* [[a]] in a comment does not count */"),
        source("c", "[[ok]] [[a]]"),
    ];
    let (name, error) = Library::compile(&indirect).unwrap_err();
    assert_eq!(name, "a");
    assert_eq!(
        error,
        TemplateError::Cycle {
            path: vec!["a".into(), "b".into(), "c".into(), "a".into()]
        }
    );
    assert_eq!(
        error.to_string(),
        "template 'a' includes itself: a -> b -> c -> a"
    );

    // A user template including its own template's text cannot recurse: allowed.
    let own = [TemplateSource {
        name: "main",
        template: "system [[x]]",
        user_template: Some("again: [[main]]"),
    }];
    let rendered = Library::compile(&own)
        .unwrap()
        .render("main", &values(&[("x", "1")]))
        .unwrap();
    assert_eq!(rendered.user.as_deref(), Some("again: system 1"));

    // Sharing a template between two branches is not a cycle.
    let diamond = [
        source("top", "[[left]][[right]]"),
        source("left", "L[[base]]"),
        source("right", "R[[base]]"),
        source("base", "B"),
    ];
    let rendered = Library::compile(&diamond)
        .unwrap()
        .render("top", &HashMap::new())
        .unwrap();
    assert_eq!(rendered.system, "LBRB");
}

#[test]
fn rendering_depth_is_bounded() {
    // t0 -> t1 -> ... -> tN: N nested inclusions.
    let chain = |inclusions: usize| -> Vec<(String, String)> {
        (0..=inclusions)
            .map(|i| {
                let text = if i < inclusions {
                    format!("{i}[[t{}]]", i + 1)
                } else {
                    "end".to_owned()
                };
                (format!("t{i}"), text)
            })
            .collect()
    };
    let compile = |templates: &[(String, String)]| {
        let sources: Vec<TemplateSource<'_>> = templates
            .iter()
            .map(|(name, text)| source(name, text))
            .collect();
        Library::compile(&sources).unwrap()
    };

    let deepest = compile(&chain(MAX_DEPTH));
    let rendered = deepest.render("t0", &HashMap::new()).unwrap();
    assert!(rendered.system.ends_with("15end"), "{}", rendered.system);

    // A caller value cuts the chain short.
    let cut = deepest.render("t0", &values(&[("t5", "cut")])).unwrap();
    assert!(cut.system.ends_with("4cut"), "{}", cut.system);

    // One level more could never render without such a value: refused when compiled (saved),
    // naming the template at the top of the chain.
    let too_deep = chain(MAX_DEPTH + 1);
    let sources: Vec<TemplateSource<'_>> = too_deep
        .iter()
        .map(|(name, text)| source(name, text))
        .collect();
    assert_eq!(
        Library::compile(&sources).err(),
        Some(("t0".to_owned(), TemplateError::TooDeep { limit: MAX_DEPTH }))
    );
}

#[test]
fn unknown_and_duplicate_templates() {
    let library = Library::compile(&[source("main", "x")]).unwrap();
    assert_eq!(
        library.render("other", &HashMap::new()),
        Err(TemplateError::UnknownTemplate("other".into()))
    );
    assert_eq!(
        library.parameters("other"),
        Err(TemplateError::UnknownTemplate("other".into()))
    );
    assert_eq!(
        Library::compile(&[source("a", "1"), source("a", "2")]).err(),
        Some(("a".to_owned(), TemplateError::DuplicateTemplate("a".into())))
    );
}

#[test]
fn discovery_with_sources_and_prompt_templates() {
    let library = Library::compile(&nested_set()).unwrap();
    let t = ParameterSource::Template;
    let u = ParameterSource::UserTemplate;
    assert_eq!(
        library.parameters("main").unwrap(),
        vec![
            param("persona", t, Some("persona")),
            param("tone", t, Some("tone")),
            param("style", t, None),
            param("name", t, None),
            param("topic", t, None),
            param("rules", u, Some("rules")),
            param("tone", u, Some("tone")),
            param("style", u, None),
            param("question", u, None),
        ]
    );
    assert_eq!(
        library.parameters("tone").unwrap(),
        vec![param("style", t, None)]
    );
    // The whole set: every template's own texts, deduplicated across them, so a template not
    // reachable from `main` still contributes.
    let mut with_extra = nested_set().to_vec();
    with_extra.push(source("extra", "[[tone]] [[extra_only]]"));
    assert_eq!(
        Library::compile(&with_extra).unwrap().all_parameters(),
        vec![
            param("persona", t, Some("persona")),
            param("tone", t, Some("tone")),
            param("style", t, None),
            param("name", t, None),
            param("topic", t, None),
            param("rules", u, Some("rules")),
            param("tone", u, Some("tone")),
            param("style", u, None),
            param("question", u, None),
            param("extra_only", t, None),
        ]
    );
    assert_eq!(
        library.names().collect::<Vec<_>>(),
        ["main", "persona", "tone", "rules"]
    );
    assert!(library.contains("tone") && !library.contains("style"));
}

#[test]
fn discovery_deduplicates_and_keeps_first_appearance() {
    let library = Library::compile(&[
        source("main", "[[b]] [[a]] [[b]] [[shared]] [[shared]] [[a]]"),
        source("shared", "[[a]] [[c]]"),
    ])
    .unwrap();
    assert_eq!(
        library.parameters("main").unwrap(),
        vec![
            param("b", ParameterSource::Template, None),
            param("a", ParameterSource::Template, None),
            param("shared", ParameterSource::Template, Some("shared")),
            param("c", ParameterSource::Template, None),
        ]
    );
}

#[test]
fn discovery_in_any_text() {
    assert_eq!(
        discover(
            "https://api.example.com/[[tenant]]/items/[[item_id]]?q=[[tenant]]",
            ParameterSource::ToolUrl
        )
        .unwrap(),
        vec![
            param("tenant", ParameterSource::ToolUrl, None),
            param("item_id", ParameterSource::ToolUrl, None),
        ]
    );
    assert_eq!(
        discover("https://x.org/[[Id]]", ParameterSource::ToolUrl),
        Err(TemplateError::InvalidName {
            token: "[[Id]]".into(),
            position: at(14, 1, 15),
            field: Field::ToolUrl,
        })
    );
}

#[test]
fn parameters_serialise_as_the_api_spells_them() {
    let parameters = [
        param("persona", ParameterSource::Template, Some("persona")),
        param("q", ParameterSource::UserTemplate, None),
        param("id", ParameterSource::ToolUrl, None),
    ];
    assert_eq!(
        serde_json::to_value(parameters).unwrap(),
        serde_json::json!([
            {"token": "persona", "source": "template", "promptTemplate": "persona"},
            {"token": "q", "source": "userTemplate"},
            {"token": "id", "source": "toolUrl"},
        ])
    );
    for field in [Field::Template, Field::UserTemplate, Field::ToolUrl] {
        assert_eq!(serde_json::to_value(field).unwrap(), field.as_str());
    }
}

#[test]
fn template_names() {
    assert!(validate_name("main"));
    assert!(validate_name("step_2"));
    assert!(!validate_name("Main"));
    assert!(!validate_name("my-template"));
    assert!(!validate_name(""));
}

#[test]
fn library_is_shareable() {
    fn assert_traits<T: Send + Sync + Clone + 'static>() {}
    assert_traits::<Library>();
}

/// Found by fuzzing: inclusion multiplies, so a few kilobytes of templates that include each
/// other ten times over, a few levels deep, rendered to terabytes (and reserving that capacity
/// aborted the process). Such a set no longer compiles.
#[test]
fn sets_that_expand_beyond_the_limits_do_not_compile() {
    let fan_out = |leaf: &str| -> Vec<(String, String)> {
        (0..8)
            .map(|i| {
                let text = if i < 7 {
                    format!("[[t{}]]", i + 1).repeat(10)
                } else {
                    leaf.to_owned()
                };
                (format!("t{i}"), text)
            })
            .collect()
    };
    let compile = |templates: &[(String, String)]| {
        let sources: Vec<TemplateSource<'_>> = templates
            .iter()
            .map(|(name, text)| source(name, text))
            .collect();
        Library::compile(&sources)
    };
    // 10^7 copies of one kilobyte.
    let (name, error) = compile(&fan_out(&"x".repeat(1024))).unwrap_err();
    assert_eq!(name, "t0");
    assert_eq!(
        error,
        TemplateError::TooLarge {
            limit: format!("{MAX_RENDERED_BYTES} bytes")
        }
    );
    // 10^7 inclusions of nothing: no text, but the work is bounded too.
    let (_, error) = compile(&fan_out("")).unwrap_err();
    assert_eq!(
        error,
        TemplateError::TooLarge {
            limit: format!("{MAX_EXPANSIONS} placeholders")
        }
    );
    // Below the limits the same shape compiles and renders.
    let mut small = fan_out("x");
    small.truncate(4);
    small[3].1 = "x".to_owned();
    let library = compile(&small).unwrap();
    assert_eq!(
        library.render("t0", &HashMap::new()).unwrap().system.len(),
        1000
    );
}

/// A value repeated by many placeholders is bounded at render time.
#[test]
fn values_repeated_beyond_the_limit_fail_the_render() {
    let text = "[[x]]".repeat(40_000);
    let library = Library::compile(&[source("main", &text)]).unwrap();
    let big = "y".repeat(1024);
    assert_eq!(
        library.render("main", &values(&[("x", &big)])),
        Err(TemplateError::TooLarge {
            limit: format!("{MAX_RENDERED_BYTES} bytes")
        })
    );
    let fine = library.render("main", &values(&[("x", "y")])).unwrap();
    assert_eq!(fine.system.len(), 40_000);
}
