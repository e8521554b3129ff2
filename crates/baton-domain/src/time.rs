use std::fmt;

use chrono::{DateTime, Datelike, SecondsFormat, Timelike, Utc};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A UTC instant written as ISO 8601 with milliseconds (`2026-11-22T10:00:00.000Z`), the one
/// time format of Baton's wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema), schema(value_type = String, format = DateTime))]
pub struct Timestamp(pub DateTime<Utc>);

impl Timestamp {
    pub fn now() -> Self {
        // Stored precision is milliseconds; truncating here keeps round trips equal.
        let now = Utc::now();
        Self(DateTime::from_timestamp_millis(now.timestamp_millis()).unwrap_or(now))
    }
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ`: the length of a formatted [`Timestamp`] in years 0-9999.
const ISO_MILLIS_LEN: usize = 24;

impl Timestamp {
    /// The wire form written into `buf` with integer arithmetic: several times an event's
    /// stored and streamed envelopes, so chrono's general formatter (a `String` per call) was
    /// ~1k instructions a timestamp. `None` for years outside 0-9999, which chrono writes with
    /// a sign and more digits.
    fn format_into(self, buf: &mut [u8; ISO_MILLIS_LEN]) -> Option<&str> {
        let year = u32::try_from(self.0.year()).ok().filter(|y| *y <= 9999)?;
        let mut put = |at: usize, value: u32, digits: usize| {
            let mut value = value;
            for slot in buf[at..at + digits].iter_mut().rev() {
                *slot = b'0' + (value % 10) as u8;
                value /= 10;
            }
        };
        put(0, year, 4);
        put(5, self.0.month(), 2);
        put(8, self.0.day(), 2);
        put(11, self.0.hour(), 2);
        put(14, self.0.minute(), 2);
        // A leap second (nanoseconds past 1e9) shows as second 60, as chrono writes it.
        let nanos = self.0.nanosecond();
        put(17, self.0.second() + nanos / 1_000_000_000, 2);
        put(20, (nanos % 1_000_000_000) / 1_000_000, 3);
        for (at, separator) in [
            (4, b'-'),
            (7, b'-'),
            (10, b'T'),
            (13, b':'),
            (16, b':'),
            (19, b'.'),
            (23, b'Z'),
        ] {
            buf[at] = separator;
        }
        std::str::from_utf8(buf).ok()
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut buf = [0u8; ISO_MILLIS_LEN];
        match self.format_into(&mut buf) {
            Some(text) => f.write_str(text),
            None => f.write_str(&self.0.to_rfc3339_opts(SecondsFormat::Millis, true)),
        }
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut buf = [0u8; ISO_MILLIS_LEN];
        match self.format_into(&mut buf) {
            Some(text) => serializer.serialize_str(text),
            None => serializer.collect_str(self),
        }
    }
}

impl Timestamp {
    /// A time as clients write one: RFC 3339 (`2026-11-22T10:00:00Z`), or a bare date
    /// (`2026-11-22`), which is that day's UTC midnight. Every `from`/`to` reads this way.
    pub fn parse_input(raw: &str) -> Option<Timestamp> {
        let raw = raw.trim();
        if let Ok(t) = DateTime::parse_from_rfc3339(raw) {
            return Some(Self(t.with_timezone(&Utc)));
        }
        chrono::NaiveDate::parse_from_str(raw, "%Y-%m-%d")
            .ok()
            .and_then(|d| d.and_hms_opt(0, 0, 0))
            .map(|midnight| Self(midnight.and_utc()))
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(deserializer)?;
        Timestamp::parse_input(&raw).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "'{raw}' is not an ISO 8601 time such as 2026-11-22T10:00:00Z or a date such as 2026-11-22"
            ))
        })
    }
}

impl From<DateTime<Utc>> for Timestamp {
    fn from(value: DateTime<Utc>) -> Self {
        Self(value)
    }
}

const MS_PER_SECOND: i64 = 1_000;
const MS_PER_MINUTE: i64 = 60 * MS_PER_SECOND;
const MS_PER_HOUR: i64 = 60 * MS_PER_MINUTE;
pub const MS_PER_DAY: i64 = 24 * MS_PER_HOUR;
/// The longest span accepted anywhere (ten years): bounds the arithmetic, not a product limit.
pub(crate) const MAX_SPAN_MS: i64 = 3_650 * MS_PER_DAY;

/// Parses a time span in milliseconds: the spec's `d.hh:mm:ss` (`7.00:00:00`, also `hh:mm:ss`)
/// or a count with a unit (`7d`, `24h`, `30m`, `2w`). Must be positive; `param` names the field
/// in the error.
pub fn parse_span(raw: &str, param: &str) -> crate::DomainResult<i64> {
    let invalid = || {
        crate::DomainError::validation(
            param,
            format!(
                "'{raw}' is not a time span: use d.hh:mm:ss (7.00:00:00) or a count with a unit (7d, 24h, 30m, 2w)"
            ),
        )
    };
    let text = raw.trim();
    let ms = if text.contains(':') {
        let (days, clock) = match text.split_once('.') {
            Some((days, clock)) => (parse_count(days).ok_or_else(invalid)?, clock),
            None => (0, text),
        };
        let parts: Vec<&str> = clock.split(':').collect();
        let [h, m, s] = parts.as_slice() else {
            return Err(invalid());
        };
        let (h, m, s) = (
            parse_count(h).ok_or_else(invalid)?,
            parse_count(m).ok_or_else(invalid)?,
            parse_count(s).ok_or_else(invalid)?,
        );
        if h > 23 || m > 59 || s > 59 {
            return Err(invalid());
        }
        days.checked_mul(MS_PER_DAY)
            .and_then(|d| d.checked_add(h * MS_PER_HOUR + m * MS_PER_MINUTE + s * MS_PER_SECOND))
            .ok_or_else(invalid)?
    } else {
        // The unit is the last character, which may be several bytes long in odd input.
        let (unit_at, _) = text.char_indices().next_back().ok_or_else(invalid)?;
        let (count, unit) = text.split_at(unit_at);
        let per = match unit {
            "w" => 7 * MS_PER_DAY,
            "d" => MS_PER_DAY,
            "h" => MS_PER_HOUR,
            "m" => MS_PER_MINUTE,
            "s" => MS_PER_SECOND,
            _ => return Err(invalid()),
        };
        parse_count(count)
            .and_then(|c| c.checked_mul(per))
            .ok_or_else(invalid)?
    };
    if ms <= 0 {
        return Err(crate::DomainError::validation(
            param,
            "the time span must be longer than zero",
        ));
    }
    if ms > MAX_SPAN_MS {
        return Err(crate::DomainError::validation(
            param,
            "the time span must be at most 3650 days",
        ));
    }
    Ok(ms)
}

/// Decimal digits only (no sign, no spaces), at most 9 of them.
fn parse_count(text: &str) -> Option<i64> {
    if text.is_empty() || text.len() > 9 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_written_as_chrono_writes_them() {
        let chrono_form = |t: DateTime<Utc>| t.to_rfc3339_opts(SecondsFormat::Millis, true);
        let mut ms: i64 = -62_167_219_200_000; // 0000-01-01T00:00:00.000Z
        let step = 7_919_993_017; // about three months, odd so every field moves
        while ms < 253_402_300_800_000 {
            let at = DateTime::from_timestamp_millis(ms).unwrap();
            assert_eq!(Timestamp(at).to_string(), chrono_form(at), "{ms}");
            ms += step;
        }
        // Sub-millisecond digits are cut, as chrono cuts them; years past 9999 fall back.
        let precise = DateTime::from_timestamp(1_764_000_000, 123_987_654).unwrap();
        assert_eq!(Timestamp(precise).to_string(), "2025-11-24T16:00:00.123Z");
        let far = DateTime::from_timestamp_millis(253_402_300_800_000).unwrap();
        assert_eq!(Timestamp(far).to_string(), chrono_form(far));
        let leap = chrono::NaiveDate::from_ymd_opt(2016, 12, 31)
            .unwrap()
            .and_hms_milli_opt(23, 59, 59, 1_500)
            .unwrap()
            .and_utc();
        assert_eq!(Timestamp(leap).to_string(), chrono_form(leap));
        assert_eq!(
            serde_json::to_string(&Timestamp(precise)).unwrap(),
            "\"2025-11-24T16:00:00.123Z\""
        );
    }

    #[test]
    fn inputs_are_rfc_3339_or_a_bare_date() {
        let at = |raw: &str| Timestamp::parse_input(raw).map(|t| t.to_string());
        assert_eq!(
            at(" 2026-11-22T10:00:00+02:00 ").as_deref(),
            Some("2026-11-22T08:00:00.000Z")
        );
        assert_eq!(
            at("2026-11-22").as_deref(),
            Some("2026-11-22T00:00:00.000Z")
        );
        for bad in ["2026-13-01", "22/11/2026", "yesterday", ""] {
            assert_eq!(at(bad), None, "{bad}");
        }
        let read: Timestamp = serde_json::from_str("\"2026-11-22\"").unwrap();
        assert_eq!(read.to_string(), "2026-11-22T00:00:00.000Z");
    }

    #[test]
    fn spans() {
        assert_eq!(parse_span("7.00:00:00", "period").unwrap(), 7 * MS_PER_DAY);
        assert_eq!(
            parse_span("1.02:03:04", "period").unwrap(),
            MS_PER_DAY + 2 * MS_PER_HOUR + 3 * MS_PER_MINUTE + 4_000
        );
        assert_eq!(
            parse_span("01:30:00", "period").unwrap(),
            90 * MS_PER_MINUTE
        );
        assert_eq!(parse_span("7d", "period").unwrap(), 7 * MS_PER_DAY);
        assert_eq!(parse_span("24h", "period").unwrap(), MS_PER_DAY);
        assert_eq!(parse_span("2w", "period").unwrap(), 14 * MS_PER_DAY);
        for bad in [
            "",
            "d",
            "7",
            "-7d",
            "7x",
            "0d",
            "00:00:00",
            "1.24:00:00",
            "1:2",
            "abc",
            "1.5d",
            "99999d",
            // Multi-byte last characters once split inside a character and panicked.
            "î",
            "7é",
            "Uz\u{72ca9}a\u{d1}",
            "é",
            "1✓",
        ] {
            let err = parse_span(bad, "period").unwrap_err();
            assert!(
                matches!(err, crate::DomainError::Validation { ref param, .. } if param == "period"),
                "{bad}"
            );
        }
    }

    #[test]
    fn writes_utc_with_milliseconds() {
        let t = Timestamp(DateTime::from_timestamp_millis(1_763_800_000_123).unwrap());
        assert_eq!(
            serde_json::to_string(&t).unwrap(),
            "\"2025-11-22T08:26:40.123Z\""
        );
        let back: Timestamp = serde_json::from_str("\"2025-11-22T08:26:40.123Z\"").unwrap();
        assert_eq!(back, t);
    }
}
