//! The packed form of a stored event page (`run_event_pages.packed`): the page's JSON as an LZ4
//! block behind its length (little-endian `u32`). A one-call request's page is ~2 KB of JSON,
//! just over half a 4 KB SQLite page, so unpacked every run took a database page of its own;
//! packed it is ~0.8 KB. Kept with the schema because the migration that added the column
//! unpacks pages on its way down.

/// Largest page an unpacked length may claim: a damaged length must not allocate gigabytes.
pub const MAX_UNPACKED_LEN: usize = 64 * 1024 * 1024;

/// A page's JSON, packed.
pub fn pack(json: &[u8]) -> Vec<u8> {
    lz4_flex::block::compress_prepend_size(json)
}

/// The JSON of a packed page; the reason when the bytes are not a packed page.
pub fn unpack(packed: &[u8]) -> Result<Vec<u8>, String> {
    let (length, block) = packed
        .split_first_chunk::<4>()
        .ok_or_else(|| "packed page shorter than its length".to_string())?;
    let length = usize::try_from(u32::from_le_bytes(*length)).unwrap_or(usize::MAX);
    if length > MAX_UNPACKED_LEN {
        return Err(format!(
            "packed page claims {length} bytes (at most {MAX_UNPACKED_LEN})"
        ));
    }
    lz4_flex::block::decompress(block, length).map_err(|error| error.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_round_trip_and_damage_is_refused() {
        let json =
            br#"[{"id":"a","seq":0,"type":"requestStarted","payload":{"type":"requestStarted"}}]"#;
        let packed = pack(json);
        assert_eq!(unpack(&packed).unwrap(), json);
        assert!(unpack(&packed[..3]).is_err(), "no length");
        let mut huge = packed.clone();
        huge[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(unpack(&huge).unwrap_err().contains("at most"));
        let mut truncated = packed.clone();
        truncated.truncate(packed.len() - 5);
        assert!(unpack(&truncated).is_err(), "a cut block");
        assert!(unpack(b"\x10\0\0\0not lz4 at all").is_err());
    }
}
