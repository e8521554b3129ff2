//! The packed form of a stored event page (`run_event_pages.packed`): the page's JSON as an LZ4
//! block behind a little-endian `u32` header. The header's low 28 bits are the JSON's length;
//! its high 4 bits name the dictionary the block was compressed against (0: none, the first
//! packed pages; 1: [`DICTIONARY_V1`]). Kept with the schema because the migration that added
//! the column unpacks pages on its way down.
//!
//! A one-call request's page is ~2 KB of JSON, just over half a 4 KB SQLite page: unpacked every
//! run took a database page of its own; plain LZ4 made it ~0.8 KB. Its keys, event types and
//! envelope are the same in every page, so against a dictionary holding such a page it is
//! ~0.33 KB, and faster to pack (less output to emit), docs/performance.md "Event pages against
//! a dictionary".

use baton_domain::run::RawJson;
use serde::Serialize;

/// One event of a page's JSON, as written (borrowed: nothing copied to serialise it); `at` is
/// epoch milliseconds. A page is a JSON array of them in `seq` order.
#[derive(Serialize)]
pub struct PagedEventRef<'a> {
    pub id: &'a str,
    pub seq: u32,
    #[serde(rename = "type")]
    pub event_type: &'a str,
    pub at: i64,
    pub payload: &'a RawJson,
}

/// Largest page an unpacked length may claim: a damaged length must not allocate gigabytes.
pub const MAX_UNPACKED_LEN: usize = 64 * 1024 * 1024;

/// What pages are packed against now: a tool call's two events and a plain chat completion's
/// lifecycle, as pages hold them. Frozen: pages packed with it need these exact bytes to be
/// read, so a better dictionary is a new one with its own number, never an edit of this one.
pub const DICTIONARY_V1: &[u8] = include_bytes!("packed_pages_v1.dict");

/// The header number of bytes that are not a packed page but a one-call request's lifecycle
/// (`baton_domain::lifecycle::CallLifecycle`) as plain JSON, which only `runs.event_page`
/// holds: the run's four events are rebuilt from it and the run's row when read.
const LIFECYCLE: u32 = 15;

const LENGTH_BITS: u32 = 28;
const LENGTH_MASK: u32 = (1 << LENGTH_BITS) - 1;
/// The dictionary [`pack`] uses.
const CURRENT_DICTIONARY: u32 = 1;

fn dictionary(number: u32) -> Option<&'static [u8]> {
    match number {
        0 => Some(&[]),
        1 => Some(DICTIONARY_V1),
        _ => None,
    }
}

/// A page's JSON, packed against the current dictionary.
pub fn pack(json: &[u8]) -> Vec<u8> {
    // A page is far below 256 MB (the writer's items are bounded long before); were one not,
    // its header claims more than `MAX_UNPACKED_LEN`, so readers refuse the page instead of
    // misreading it.
    let length = u32::try_from(json.len())
        .ok()
        .filter(|length| *length <= LENGTH_MASK)
        .unwrap_or(LENGTH_MASK);
    let mut packed = lz4_flex::block::compress_prepend_size_with_dict(json, DICTIONARY_V1);
    // The prepended size becomes the header: the length, and which dictionary.
    packed[..4].copy_from_slice(&(CURRENT_DICTIONARY << LENGTH_BITS | length).to_le_bytes());
    packed
}

/// A one-call request's lifecycle JSON as `runs.event_page` keeps it: behind the header that
/// says so ([`LIFECYCLE`]), not compressed (~0.5 KB, nothing a page's envelopes repeat).
pub fn wrap_lifecycle(mut json: Vec<u8>) -> Vec<u8> {
    let length = u32::try_from(json.len())
        .ok()
        .filter(|length| *length <= LENGTH_MASK)
        .unwrap_or(LENGTH_MASK);
    let header = (LIFECYCLE << LENGTH_BITS | length).to_le_bytes();
    json.splice(0..0, header);
    json
}

/// The lifecycle JSON in `bytes` when they hold one ([`wrap_lifecycle`]) rather than a page.
pub fn lifecycle(bytes: &[u8]) -> Option<&[u8]> {
    let (header, json) = bytes.split_first_chunk::<4>()?;
    (u32::from_le_bytes(*header) >> LENGTH_BITS == LIFECYCLE).then_some(json)
}

/// The JSON of a packed page; the reason when the bytes are not a packed page.
pub fn unpack(packed: &[u8]) -> Result<Vec<u8>, String> {
    let (header, block) = packed
        .split_first_chunk::<4>()
        .ok_or_else(|| "packed page shorter than its length".to_string())?;
    let header = u32::from_le_bytes(*header);
    let number = header >> LENGTH_BITS;
    let dictionary = dictionary(number)
        .ok_or_else(|| format!("packed page names an unknown dictionary ({number})"))?;
    let length = usize::try_from(header & LENGTH_MASK).unwrap_or(usize::MAX);
    if length > MAX_UNPACKED_LEN {
        return Err(format!(
            "packed page claims {length} bytes (at most {MAX_UNPACKED_LEN})"
        ));
    }
    lz4_flex::block::decompress_with_dict(block, length, dictionary)
        .map_err(|error| error.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &[u8] =
        br#"[{"id":"a","seq":0,"type":"requestStarted","at":1,"payload":{"type":"requestStarted"}}]"#;

    #[test]
    fn pages_round_trip_and_damage_is_refused() {
        let packed = pack(PAGE);
        assert_eq!(unpack(&packed).unwrap(), PAGE);
        assert!(unpack(&packed[..3]).is_err(), "no length");
        let mut huge = packed.clone();
        huge[..4].copy_from_slice(&(1u32 << 28 | LENGTH_MASK).to_le_bytes());
        assert!(unpack(&huge).unwrap_err().contains("at most"));
        let mut unknown = packed.clone();
        unknown[3] |= 0xf0;
        assert!(unpack(&unknown).unwrap_err().contains("unknown dictionary"));
        let mut truncated = packed.clone();
        truncated.truncate(packed.len() - 5);
        assert!(unpack(&truncated).is_err(), "a cut block");
        assert!(unpack(b"\x10\0\0\0not lz4 at all").is_err());
    }

    #[test]
    fn a_lifecycle_is_told_from_a_page() {
        let json = br#"{"stamps":[]}"#;
        let wrapped = wrap_lifecycle(json.to_vec());
        assert_eq!(lifecycle(&wrapped), Some(&json[..]));
        assert!(unpack(&wrapped).is_err(), "not a page");
        assert_eq!(lifecycle(&pack(PAGE)), None, "a page is no lifecycle");
        assert_eq!(lifecycle(b"\0\0"), None);
    }

    #[test]
    fn pages_packed_without_a_dictionary_still_read() {
        // What the first packed pages hold: the plain length, then a block of its own.
        let old = lz4_flex::block::compress_prepend_size(PAGE);
        assert_eq!(unpack(&old).unwrap(), PAGE);
    }

    #[test]
    fn a_plain_chat_page_packs_to_under_half_of_plain_lz4() {
        // The dictionary's last page with other ids, times and text stands for a one-call
        // request's.
        let start = DICTIONARY_V1
            .windows(2)
            .rposition(|pair| pair == b"][")
            .map_or(0, |at| at + 1);
        let page = String::from_utf8_lossy(&DICTIONARY_V1[start..])
            .replace("01a20f67-fa", "01b3c4d5-e9")
            .replace("2026-11-24T21:13", "2027-02-03T04:05")
            .replace("Hello", "Good morning, how can I help?")
            .into_bytes();
        let page = page.as_slice();
        let plain = lz4_flex::block::compress(page).len();
        let packed = pack(page);
        assert!(
            packed.len() * 2 < plain,
            "{} bytes against {plain}",
            packed.len()
        );
        assert_eq!(unpack(&packed).unwrap(), page);
    }

    #[test]
    fn the_first_dictionary_never_changes() {
        // Pages on disk were packed against these bytes: editing them makes those unreadable.
        let checksum = DICTIONARY_V1
            .iter()
            .fold(0xcbf2_9ce4_8422_2325u64, |hash, byte| {
                (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3)
            });
        assert_eq!(
            (DICTIONARY_V1.len(), checksum),
            (2979, 16_517_939_606_899_409_349)
        );
    }
}
