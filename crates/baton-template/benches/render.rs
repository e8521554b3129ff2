//! Rendering on the request path: a ~10 KB prompt with 50 parameters, and a composed set.
//! `cargo xtask bench` (or `cargo bench -p baton-template`); figures in docs/performance.md.

// A benchmark whose fixture does not compile should stop loudly, like a test.
#![allow(clippy::expect_used)]

use std::collections::HashMap;
use std::hint::black_box;

use baton_template::{Library, TemplateSource};
use criterion::{Criterion, criterion_group, criterion_main};

const FILLER: &str = "The assistant answers questions about the customer's account, keeps a calm \
    and precise tone, cites the policy it relies on, asks when unsure and never invents figures. Value: ";

/// 50 paragraphs of ~200 bytes, each with one placeholder, a comment every tenth.
fn large_template() -> String {
    let mut text = String::new();
    for i in 0..50 {
        if i % 10 == 0 {
            text.push_str("// section marker, stripped\n");
        }
        text.push_str(&format!("{i:02}. {FILLER}[[param_{i}]].\n"));
    }
    text
}

fn values(count: usize) -> HashMap<String, String> {
    (0..count)
        .map(|i| {
            (
                format!("param_{i}"),
                format!("value number {i} for the prompt"),
            )
        })
        .collect()
}

fn render(c: &mut Criterion) {
    let large = large_template();
    let library = Library::compile(&[TemplateSource {
        name: "main",
        template: &large,
        user_template: Some("Question about [[param_0]] and [[param_49]]."),
    }])
    .expect("large template compiles");
    let all = values(50);
    let rendered = library.render("main", &all).expect("renders");
    assert!(rendered.unresolved.is_empty());
    eprintln!(
        "large template: {} bytes in, {} bytes out",
        large.len(),
        rendered.system.len()
    );
    c.bench_function("render_10kb_50_params", |b| {
        b.iter(|| library.render(black_box("main"), black_box(&all)))
    });

    // main -> persona -> tone, main -> rules -> safety: three levels, parameters at each.
    let main = format!(
        "{}[[persona]]\n[[rules]]\nToday is [[date]].",
        &large[..2000]
    );
    let persona = format!("You are [[assistant_name]]. [[tone]] {}", &large[..1500]);
    let tone = "Speak like [[style]] /* e.g. a librarian */ and keep answers short.";
    let rules = format!("Rules for [[company]]:\n[[safety]]\n{}", &large[..1500]);
    let safety = "Never reveal [[secret_kind]]; see https://example.com/policy // why\n";
    let set = [
        TemplateSource {
            name: "main",
            template: &main,
            user_template: Some("[[question]]"),
        },
        TemplateSource {
            name: "persona",
            template: &persona,
            user_template: None,
        },
        TemplateSource {
            name: "tone",
            template: tone,
            user_template: None,
        },
        TemplateSource {
            name: "rules",
            template: &rules,
            user_template: None,
        },
        TemplateSource {
            name: "safety",
            template: safety,
            user_template: None,
        },
    ];
    let composed = Library::compile(&set).expect("composed set compiles");
    let mut composed_values = values(50);
    for (key, value) in [
        ("date", "2026-11-02"),
        ("assistant_name", "Baton"),
        ("style", "a patient teacher"),
        ("company", "Example Ltd"),
        ("secret_kind", "credentials"),
        ("question", "How do I reset my password?"),
    ] {
        composed_values.insert(key.to_owned(), value.to_owned());
    }
    let rendered = composed
        .render("main", &composed_values)
        .expect("composed set renders");
    assert!(rendered.unresolved.is_empty());
    eprintln!("composed set: {} bytes out", rendered.system.len());
    c.bench_function("render_composed_3_levels", |b| {
        b.iter(|| composed.render(black_box("main"), black_box(&composed_values)))
    });

    c.bench_function("compile_10kb", |b| {
        b.iter(|| {
            Library::compile(&[TemplateSource {
                name: "main",
                template: black_box(&large),
                user_template: None,
            }])
        })
    });
}

criterion_group!(benches, render);
criterion_main!(benches);
