//! Request tags: `Key:value` strings, at most [`MAX_TAGS`] per request.

use crate::{DomainError, DomainResult};

pub const MAX_TAGS: usize = 20;
pub const MAX_TAG_LEN: usize = 200;

/// Parses the comma-separated `X-Baton-Tags` header.
pub fn parse_tag_header(header: &str) -> DomainResult<Vec<String>> {
    let tags: Vec<String> = header
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(str::to_string)
        .collect();
    validate_tags(tags, "X-Baton-Tags")
}

/// Checks tags (trimmed, deduplicated, in order) and the limit.
pub fn validate_tags(tags: Vec<String>, param: &str) -> DomainResult<Vec<String>> {
    let mut out: Vec<String> = Vec::with_capacity(tags.len());
    for tag in tags {
        let tag = tag.trim().to_string();
        let valid = !tag.is_empty()
            // Characters, as the message says: a tag in a non-Latin script is not held to a third.
            && tag.chars().count() <= MAX_TAG_LEN
            && !tag.chars().any(char::is_control)
            && tag.split_once(':').is_none_or(|(key, _)| !key.is_empty());
        if !valid {
            return Err(DomainError::validation(
                param,
                format!(
                    "invalid tag '{tag}': tags are 'Key:value' strings of at most {MAX_TAG_LEN} characters"
                ),
            ));
        }
        // Tags travel comma-separated (`X-Baton-Tags`, the log's `tags` filter): a comma in one
        // would make it two, and a run carrying it could never be found by it.
        if tag.contains(',') {
            return Err(DomainError::validation(
                param,
                format!("invalid tag '{tag}': a tag cannot contain a comma"),
            ));
        }
        if !out.contains(&tag) {
            out.push(tag);
        }
    }
    if out.len() > MAX_TAGS {
        return Err(DomainError::validation(
            param,
            format!("at most {MAX_TAGS} tags per request, got {}", out.len()),
        ));
    }
    Ok(out)
}

/// Merges body tags and header tags (body first), re-checking the limit.
pub fn merge_tags(body: Vec<String>, header: Vec<String>) -> DomainResult<Vec<String>> {
    let mut all = body;
    all.extend(header);
    validate_tags(all, "tags")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_length_limit_counts_characters_not_bytes() {
        let accented = format!("Team:{}", "é".repeat(MAX_TAG_LEN - 5));
        assert!(accented.len() > MAX_TAG_LEN);
        assert_eq!(
            validate_tags(vec![accented.clone()], "tags").unwrap(),
            [accented]
        );
        let over = format!("Team:{}", "é".repeat(MAX_TAG_LEN - 4));
        assert!(validate_tags(vec![over], "tags").is_err());
    }

    #[test]
    fn header_parsing_and_limits() {
        assert_eq!(
            parse_tag_header(" Team:search , Env:prod,,Team:search").unwrap(),
            ["Team:search", "Env:prod"]
        );
        let twenty: Vec<String> = (0..20).map(|i| format!("K:{i}")).collect();
        assert!(parse_tag_header(&twenty.join(",")).is_ok());
        let twenty_one: Vec<String> = (0..21).map(|i| format!("K:{i}")).collect();
        assert!(parse_tag_header(&twenty_one.join(",")).is_err());
        assert!(parse_tag_header(":nokey").is_err());
        assert!(merge_tags(twenty, vec!["Extra:1".into()]).is_err());
        // A body tag with a comma could never be found by the log's comma-separated filter.
        assert!(validate_tags(vec!["Team:a,b".into()], "tags").is_err());
    }
}
