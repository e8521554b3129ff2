//! How the fuzz targets read libFuzzer's bytes. The invariants themselves live next to the code
//! they are about (`baton_*::fuzz`), where the property tests use them too.

/// The bytes as text, the way a careless client would send them.
pub fn text(data: &[u8]) -> String {
    String::from_utf8_lossy(data).into_owned()
}

/// Fails the run on a broken invariant, naming it.
pub fn check(result: Result<(), String>) {
    if let Err(broken) = result {
        panic!("{broken}");
    }
}

/// A stream case: the first byte holds the structured-output flag (bit 7) and a count of cuts
/// (low 3 bits); two bytes per cut follow (big-endian offsets), then the body.
pub struct StreamCase<'a> {
    pub structured: bool,
    pub cuts: Vec<usize>,
    pub body: &'a [u8],
}

impl<'a> StreamCase<'a> {
    pub fn read(data: &'a [u8]) -> StreamCase<'a> {
        let Some((&head, rest)) = data.split_first() else {
            return StreamCase {
                structured: false,
                cuts: Vec::new(),
                body: data,
            };
        };
        let count = usize::from(head & 0x07).min(rest.len() / 2);
        let (cuts, body) = rest.split_at(count * 2);
        StreamCase {
            structured: head & 0x80 != 0,
            cuts: cuts
                .chunks_exact(2)
                .map(|pair| usize::from(u16::from_be_bytes([pair[0], pair[1]])))
                .collect(),
            body,
        }
    }
}

/// Template sets: sections separated by NUL; a section's first byte picks its name, the rest is
/// `template`, then optionally SOH and `user_template`. The last section is the value given to
/// the parameters of names starting with `v`.
pub fn library(data: &[u8]) -> (Vec<(String, String, Option<String>)>, String) {
    const NAMES: [&str; 6] = ["main", "va", "b", "c", "vd", "Bad-Name"];
    let mut sections: Vec<&[u8]> = data.split(|&byte| byte == 0).collect();
    let value = if sections.len() > 1 {
        sections.pop().map(text).unwrap_or_default()
    } else {
        String::new()
    };
    let sources = sections
        .into_iter()
        .take(8)
        .filter_map(|section| {
            let (&pick, rest) = section.split_first()?;
            let name = NAMES[usize::from(pick) % NAMES.len()].to_owned();
            let mut parts = rest.splitn(2, |&byte| byte == 1);
            let template = text(parts.next().unwrap_or_default());
            let user = parts.next().map(text);
            Some((name, template, user))
        })
        .collect();
    (sources, value)
}
