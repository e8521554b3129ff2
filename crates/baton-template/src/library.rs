//! A compiled set of templates: parsed once, checked for cycles, rendered many times.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use serde::Serialize;

use crate::error::{Field, TemplateError};
use crate::parse::{Piece, parse};

/// Nested inclusions one render may go through. Cycles are rejected by [`Library::compile`];
/// this bounds the work of a long legitimate chain.
pub const MAX_DEPTH: usize = 16;

/// The most text one render may produce. Inclusion multiplies: a template that includes another
/// ten times, nested a few levels, would otherwise make a prompt of terabytes from kilobytes of
/// stored text (and the reserved capacity would abort the process).
pub const MAX_RENDERED_BYTES: usize = 16 * 1024 * 1024;

/// The most placeholders one render may go through, included templates counted each time they
/// are included: bounds the work of inclusions that produce little or no text.
pub const MAX_EXPANSIONS: usize = 100_000;

/// One template of a set, as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TemplateSource<'a> {
    pub name: &'a str,
    /// System prompt text.
    pub template: &'a str,
    pub user_template: Option<&'a str>,
}

/// The output of [`Library::render`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rendered {
    /// The entry template's `template`, rendered.
    pub system: String,
    /// The entry template's `user_template`, rendered.
    pub user: Option<String>,
    /// Names left as `[[name]]` in the output, once each, in the order first met (system first).
    pub unresolved: Vec<String>,
}

/// A parameter a caller can supply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Parameter {
    pub token: String,
    pub source: ParameterSource,
    /// The template this token includes when no value is supplied for it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_template: Option<String>,
}

/// Where a parameter appears.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum ParameterSource {
    #[serde(rename = "template")]
    Template,
    #[serde(rename = "userTemplate")]
    UserTemplate,
    #[serde(rename = "toolUrl")]
    ToolUrl,
}

impl ParameterSource {
    fn field(self) -> Field {
        match self {
            ParameterSource::Template => Field::Template,
            ParameterSource::UserTemplate => Field::UserTemplate,
            ParameterSource::ToolUrl => Field::ToolUrl,
        }
    }
}

/// Checks the syntax of one text (names, closed placeholders); says nothing about composition.
pub fn validate_text(text: &str, field: Field) -> Result<(), TemplateError> {
    parse(text, field).map(drop)
}

/// The placeholders of an arbitrary text (a tool URL, say), once each in first-appearance order,
/// comments ignored. `prompt_template` is always `None`: a lone text knows no templates.
pub fn discover(text: &str, source: ParameterSource) -> Result<Vec<Parameter>, TemplateError> {
    let mut parameters: Vec<Parameter> = Vec::new();
    for piece in parse(text, source.field())? {
        if let Some(name) = piece.name(text)
            && !parameters.iter().any(|parameter| parameter.token == name)
        {
            parameters.push(Parameter {
                token: name.to_owned(),
                source,
                prompt_template: None,
            });
        }
    }
    Ok(parameters)
}

/// A compiled set of templates (one version). Cheap to clone: the compiled data is shared.
#[derive(Debug, Clone)]
pub struct Library {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    templates: Vec<Compiled>,
    by_name: HashMap<String, usize>,
}

#[derive(Debug)]
struct Compiled {
    name: String,
    system: Text,
    user: Option<Text>,
}

#[derive(Debug)]
struct Text {
    source: String,
    segments: Vec<Segment>,
    /// Output length when every placeholder that names a template is expanded and every other
    /// one has an empty value: the fixed part of the capacity a render reserves.
    fixed_len: usize,
    /// Placeholders a render goes through at most (included templates' own counted per
    /// inclusion).
    expansions: usize,
}

#[derive(Debug, Clone, Copy)]
enum Segment {
    Literal {
        start: usize,
        end: usize,
    },
    /// `[[name]]` at `source[start..end]`; `include` is the template of that name, if any.
    Placeholder {
        start: usize,
        end: usize,
        include: Option<usize>,
    },
}

impl Text {
    fn new(source: &str, pieces: Vec<Piece>, by_name: &HashMap<String, usize>) -> Text {
        let segments = pieces
            .into_iter()
            .map(|piece| match piece {
                Piece::Literal { start, end } => Segment::Literal { start, end },
                Piece::Placeholder { start, end } => Segment::Placeholder {
                    start,
                    end,
                    include: piece
                        .name(source)
                        .and_then(|name| by_name.get(name).copied()),
                },
            })
            .collect();
        Text {
            source: source.to_owned(),
            segments,
            fixed_len: 0,
            expansions: 0,
        }
    }

    fn includes(&self) -> impl Iterator<Item = usize> + '_ {
        self.segments.iter().filter_map(|segment| match segment {
            Segment::Placeholder { include, .. } => *include,
            Segment::Literal { .. } => None,
        })
    }

    /// Literal length plus the expanded lengths of included templates, and the placeholder
    /// count likewise (`expanded[i]`, already computed because templates are visited children
    /// first). Saturating: the totals are compared with the limits, never allocated.
    fn compute_sizes(&mut self, expanded: &[(usize, usize)]) {
        let (mut len, mut expansions) = (0usize, 0usize);
        for segment in &self.segments {
            match *segment {
                Segment::Literal { start, end } => len = len.saturating_add(end - start),
                Segment::Placeholder { include, .. } => {
                    let (more_len, more) = include
                        .and_then(|index| expanded.get(index).copied())
                        .unwrap_or((0, 0));
                    len = len.saturating_add(more_len);
                    expansions = expansions.saturating_add(1).saturating_add(more);
                }
            }
        }
        self.fixed_len = len;
        self.expansions = expansions;
    }

    fn check_sizes(&self) -> Result<(), TemplateError> {
        if self.fixed_len > MAX_RENDERED_BYTES {
            return Err(TemplateError::TooLarge {
                limit: format!("{MAX_RENDERED_BYTES} bytes"),
            });
        }
        if self.expansions > MAX_EXPANSIONS {
            return Err(TemplateError::TooLarge {
                limit: format!("{MAX_EXPANSIONS} placeholders"),
            });
        }
        Ok(())
    }
}

impl Library {
    /// Parses every text, links `[[name]]` to the templates of the set and rejects cycles. The
    /// error names the template it is about.
    pub fn compile(templates: &[TemplateSource<'_>]) -> Result<Library, (String, TemplateError)> {
        let mut by_name = HashMap::with_capacity(templates.len());
        for (index, source) in templates.iter().enumerate() {
            if by_name.insert(source.name.to_owned(), index).is_some() {
                return Err((
                    source.name.to_owned(),
                    TemplateError::DuplicateTemplate(source.name.to_owned()),
                ));
            }
        }
        let mut compiled = Vec::with_capacity(templates.len());
        for source in templates {
            let named = |error| (source.name.to_owned(), error);
            let system = parse(source.template, Field::Template).map_err(named)?;
            let user = source
                .user_template
                .map(|text| parse(text, Field::UserTemplate).map(|pieces| (text, pieces)))
                .transpose()
                .map_err(named)?;
            compiled.push(Compiled {
                name: source.name.to_owned(),
                system: Text::new(source.template, system, &by_name),
                user: user.map(|(text, pieces)| Text::new(text, pieces, &by_name)),
            });
        }

        let order = children_first(&compiled)?;
        let mut expanded = vec![(0, 0); compiled.len()];
        // How deep each template's includes go (0: it includes none).
        let mut nesting = vec![0usize; compiled.len()];
        for index in order {
            let template = &mut compiled[index];
            template.system.compute_sizes(&expanded);
            expanded[index] = (template.system.fixed_len, template.system.expansions);
            nesting[index] = template
                .system
                .includes()
                .map(|child| nesting[child].saturating_add(1))
                .max()
                .unwrap_or(0);
        }
        // A set nested deeper than rendering goes is refused when saved, not at every run.
        for template in &compiled {
            let deepest = template
                .system
                .includes()
                .chain(template.user.iter().flat_map(Text::includes))
                .map(|child| nesting[child].saturating_add(1))
                .max()
                .unwrap_or(0);
            if deepest > MAX_DEPTH {
                return Err((
                    template.name.clone(),
                    TemplateError::TooDeep { limit: MAX_DEPTH },
                ));
            }
        }
        for template in &mut compiled {
            if let Some(user) = &mut template.user {
                user.compute_sizes(&expanded);
            }
        }
        // A set whose worst case is too large is refused when saved, not when run.
        for template in &compiled {
            let named = |error| (template.name.clone(), error);
            template.system.check_sizes().map_err(named)?;
            if let Some(user) = &template.user {
                user.check_sizes().map_err(named)?;
            }
        }

        Ok(Library {
            inner: Arc::new(Inner {
                templates: compiled,
                by_name,
            }),
        })
    }

    /// Renders template `name`: caller values first, then other templates of the set (rendered
    /// with the same values), else the placeholder stays as written and is reported.
    pub fn render(
        &self,
        name: &str,
        values: &HashMap<String, String>,
    ) -> Result<Rendered, TemplateError> {
        let template = self.get(name)?;
        // Reserving for every value once avoids regrowth in the common case without a second
        // pass over the placeholders.
        let values_len = values
            .values()
            .map(String::len)
            .fold(0, usize::saturating_add);
        let capacity = |fixed: usize| fixed.saturating_add(values_len).min(MAX_RENDERED_BYTES);
        let mut unresolved = Vec::new();
        let mut system = String::with_capacity(capacity(template.system.fixed_len));
        self.render_text(&template.system, values, &mut system, &mut unresolved, 0)?;
        let user = match &template.user {
            Some(text) => {
                let mut user = String::with_capacity(capacity(text.fixed_len));
                self.render_text(text, values, &mut user, &mut unresolved, 0)?;
                Some(user)
            }
            None => None,
        };
        Ok(Rendered {
            system,
            user,
            unresolved,
        })
    }

    fn render_text(
        &self,
        text: &Text,
        values: &HashMap<String, String>,
        out: &mut String,
        unresolved: &mut Vec<String>,
        depth: usize,
    ) -> Result<(), TemplateError> {
        for segment in &text.segments {
            match *segment {
                Segment::Literal { start, end } => out.push_str(&text.source[start..end]),
                Segment::Placeholder {
                    start,
                    end,
                    include,
                } => {
                    let written = &text.source[start..end];
                    let name = &written[2..written.len() - 2];
                    if let Some(value) = values.get(name) {
                        // Values repeat with their placeholders: the total is checked as it grows.
                        if out.len().saturating_add(value.len()) > MAX_RENDERED_BYTES {
                            return Err(TemplateError::TooLarge {
                                limit: format!("{MAX_RENDERED_BYTES} bytes"),
                            });
                        }
                        out.push_str(value);
                    } else if let Some(index) = include {
                        if depth >= MAX_DEPTH {
                            return Err(TemplateError::TooDeep { limit: MAX_DEPTH });
                        }
                        let included = &self.inner.templates[index].system;
                        self.render_text(included, values, out, unresolved, depth + 1)?;
                    } else {
                        out.push_str(written);
                        if !unresolved.iter().any(|seen| seen == name) {
                            unresolved.push(name.to_owned());
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// The parameters of template `name`: its `template`, then its `user_template`, each
    /// placeholder once per source in first-appearance order. A token naming another template
    /// carries `prompt_template` and is followed by that template's own parameters, with the
    /// source of the text that includes it (that is where their values end up).
    pub fn parameters(&self, name: &str) -> Result<Vec<Parameter>, TemplateError> {
        let template = self.get(name)?;
        let mut found = Found::default();
        self.discover_in(&template.system, ParameterSource::Template, &mut found);
        if let Some(user) = &template.user {
            self.discover_in(user, ParameterSource::UserTemplate, &mut found);
        }
        Ok(found.parameters)
    }

    /// The parameters of every template of the set, in set order, deduplicated by token and
    /// source as in [`Library::parameters`].
    pub fn all_parameters(&self) -> Vec<Parameter> {
        let mut found = Found::default();
        for template in &self.inner.templates {
            self.discover_in(&template.system, ParameterSource::Template, &mut found);
            if let Some(user) = &template.user {
                self.discover_in(user, ParameterSource::UserTemplate, &mut found);
            }
        }
        found.parameters
    }

    fn discover_in<'s>(&'s self, text: &'s Text, source: ParameterSource, found: &mut Found<'s>) {
        for segment in &text.segments {
            let Segment::Placeholder {
                start,
                end,
                include,
            } = *segment
            else {
                continue;
            };
            let name = &text.source[start + 2..end - 2];
            // A token seen before with this source had its template expanded then, so the set
            // also ends the recursion (cycles cannot exist after compile anyway).
            if !found.seen.insert((name, source)) {
                continue;
            }
            let included = include.map(|index| &self.inner.templates[index]);
            found.parameters.push(Parameter {
                token: name.to_owned(),
                source,
                prompt_template: included.map(|template| template.name.clone()),
            });
            if let Some(template) = included {
                self.discover_in(&template.system, source, found);
            }
        }
    }

    /// Template names, in the order given to [`Library::compile`].
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.inner
            .templates
            .iter()
            .map(|template| template.name.as_str())
    }

    pub fn contains(&self, name: &str) -> bool {
        self.inner.by_name.contains_key(name)
    }

    fn get(&self, name: &str) -> Result<&Compiled, TemplateError> {
        self.inner
            .by_name
            .get(name)
            .map(|&index| &self.inner.templates[index])
            .ok_or_else(|| TemplateError::UnknownTemplate(name.to_owned()))
    }
}

#[derive(Default)]
struct Found<'s> {
    parameters: Vec<Parameter>,
    seen: HashSet<(&'s str, ParameterSource)>,
}

/// Template indices ordered so every template comes after those its `template` includes, or the
/// first cycle met (as the template it starts at and the path). Iterative, so a long chain of
/// templates cannot overflow the stack.
fn children_first(templates: &[Compiled]) -> Result<Vec<usize>, (String, TemplateError)> {
    #[derive(Clone, Copy, PartialEq)]
    enum State {
        New,
        OnPath,
        Done,
    }
    let edges: Vec<Vec<usize>> = templates
        .iter()
        .map(|template| template.system.includes().collect())
        .collect();
    let mut state = vec![State::New; templates.len()];
    let mut order = Vec::with_capacity(templates.len());
    for root in 0..templates.len() {
        if state[root] != State::New {
            continue;
        }
        state[root] = State::OnPath;
        // (template, next edge to follow)
        let mut path = vec![(root, 0)];
        while let Some((node, next)) = path.last_mut() {
            let node = *node;
            match edges[node].get(*next).copied() {
                Some(child) => {
                    *next += 1;
                    match state[child] {
                        State::New => {
                            state[child] = State::OnPath;
                            path.push((child, 0));
                        }
                        State::OnPath => {
                            let from = path.iter().position(|&(on, _)| on == child).unwrap_or(0);
                            let cycle: Vec<String> = path[from..]
                                .iter()
                                .map(|&(on, _)| templates[on].name.clone())
                                .chain(std::iter::once(templates[child].name.clone()))
                                .collect();
                            return Err((
                                templates[child].name.clone(),
                                TemplateError::Cycle { path: cycle },
                            ));
                        }
                        State::Done => {}
                    }
                }
                None => {
                    state[node] = State::Done;
                    order.push(node);
                    path.pop();
                }
            }
        }
    }
    Ok(order)
}
