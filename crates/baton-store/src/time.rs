use baton_domain::Timestamp;
use chrono::DateTime;

/// Timestamps are stored as epoch milliseconds (see the migrations crate).
pub(crate) fn to_millis(t: Timestamp) -> i64 {
    t.0.timestamp_millis()
}

pub(crate) fn from_millis(ms: i64) -> Timestamp {
    Timestamp(DateTime::from_timestamp_millis(ms).unwrap_or_default())
}
