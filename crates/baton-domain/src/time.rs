use std::fmt;

use chrono::{DateTime, SecondsFormat, Utc};
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

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.to_rfc3339_opts(SecondsFormat::Millis, true))
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(deserializer)?;
        DateTime::parse_from_rfc3339(&raw)
            .map(|t| Self(t.with_timezone(&Utc)))
            .map_err(serde::de::Error::custom)
    }
}

impl From<DateTime<Utc>> for Timestamp {
    fn from(value: DateTime<Utc>) -> Self {
        Self(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
