//! Text retention (SPEC.md "Tenant settings"): which runs keep their prompt and answer text,
//! and what of a stored event is text. Cost, model and status are always kept.

use serde_json::Value;

/// Event payload fields that carry prompt, answer, argument or result text.
const TEXT_FIELDS: &[&str] = &[
    "text",
    "textResponse",
    "arguments",
    "parameters",
    "resultPreview",
    "result",
];

/// Whether a request keeps its text under `sample_rate` (0 to 1). The decision is a stable
/// hash of the root request id, so a whole agent tree is kept or dropped together, and every
/// instance decides the same. Debug runs always keep text.
pub fn keeps_text(root_id: &str, sample_rate: f64, is_debug: bool) -> bool {
    if is_debug || sample_rate >= 1.0 {
        return true;
    }
    if sample_rate <= 0.0 || sample_rate.is_nan() {
        return false;
    }
    // FNV-1a: stable across releases and platforms (std's hasher is neither).
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in root_id.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    // The top 53 bits as a fraction in [0, 1).
    let fraction = (hash >> 11) as f64 / (1u64 << 53) as f64;
    fraction < sample_rate
}

/// Blanks the text fields of an event payload, at any depth; the rest (types, ids, counts,
/// costs, durations) stays. Returns whether anything changed.
pub fn strip_event_text(payload: &mut Value) -> bool {
    match payload {
        Value::Object(map) => {
            let mut changed = false;
            for (key, value) in map.iter_mut() {
                if TEXT_FIELDS.contains(&key.as_str()) {
                    if !value.is_null() {
                        *value = Value::Null;
                        changed = true;
                    }
                } else {
                    changed |= strip_event_text(value);
                }
            }
            changed
        }
        Value::Array(items) => items
            .iter_mut()
            .fold(false, |changed, item| strip_event_text(item) | changed),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn sampling_is_stable_and_close_to_the_rate() {
        let ids: Vec<String> = (0..10_000)
            .map(|i| format!("0193a1b2-{i:04}-7abc-9def-{i:012}"))
            .collect();
        let kept = ids.iter().filter(|id| keeps_text(id, 0.25, false)).count();
        assert!((2000..3000).contains(&kept), "kept {kept} of 10000 at 25%");
        assert!(ids.iter().all(|id| keeps_text(id, 1.0, false)));
        assert!(ids.iter().all(|id| !keeps_text(id, 0.0, false)));
        assert!(
            ids.iter().all(|id| keeps_text(id, 0.0, true)),
            "debug runs keep text"
        );
        let first: Vec<bool> = ids.iter().map(|id| keeps_text(id, 0.5, false)).collect();
        let again: Vec<bool> = ids.iter().map(|id| keeps_text(id, 0.5, false)).collect();
        assert_eq!(first, again);
    }

    #[test]
    fn event_text_is_blanked_and_the_rest_kept() {
        let mut event = json!({"type": "requestCompleted", "data": {
            "totalCreditsUsed": 42, "result": {"textResponse": "secret answer"},
            "toolCalls": [{"arguments": {"q": "secret"}, "durationMs": 3}]}});
        assert!(strip_event_text(&mut event));
        assert_eq!(
            event,
            json!({"type": "requestCompleted", "data": {
                "totalCreditsUsed": 42, "result": null,
                "toolCalls": [{"arguments": null, "durationMs": 3}]}})
        );
        assert!(!strip_event_text(&mut event), "already stripped");
    }
}
