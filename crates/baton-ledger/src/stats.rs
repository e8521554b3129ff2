//! Statistics maths: exact nearest-rank percentiles, fixed-edge histograms, distributions of
//! small integers, and the time buckets of series. Pure functions over values the store fetched,
//! so SQLite and PostgreSQL give the same numbers.

use serde::Serialize;

/// The percentiles every distribution reports.
pub const PERCENTILES: [u32; 4] = [50, 90, 95, 99];

/// Upper edges (exclusive) of the latency histogram buckets, in milliseconds; the first bucket
/// starts at 0 and the last one is unbounded.
pub const LATENCY_EDGES_MS: [i64; 10] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 30_000, 60_000, 120_000,
];

/// Nearest-rank percentile of ascending `sorted` values: the value at rank `ceil(p/100 * n)`
/// (1-based), so the smallest value with at least `p`% of the values at or below it. `p` is
/// clamped to 1..=100; `None` for no values.
pub fn nearest_rank(sorted: &[i64], p: u32) -> Option<i64> {
    let n = sorted.len();
    if n == 0 {
        return None;
    }
    let p = u128::from(p.clamp(1, 100));
    // Integer ceiling, so p95 of 20 values is exactly rank 19 (no float rounding).
    let rank = (p * n as u128).div_ceil(100);
    let index = usize::try_from(rank).unwrap_or(n).clamp(1, n) - 1;
    sorted.get(index).copied()
}

/// Count, extremes, mean and percentiles of a set of values (milliseconds, credits, ...).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct Distribution {
    pub count: u64,
    pub min: i64,
    pub max: i64,
    /// Arithmetic mean (0 without values).
    pub avg: f64,
    pub p50: i64,
    pub p90: i64,
    pub p95: i64,
    pub p99: i64,
}

impl Distribution {
    pub fn of(mut values: Vec<i64>) -> Distribution {
        values.sort_unstable();
        let at = |p| nearest_rank(&values, p).unwrap_or(0);
        let sum: i128 = values.iter().map(|&v| i128::from(v)).sum();
        Distribution {
            count: values.len() as u64,
            min: values.first().copied().unwrap_or(0),
            max: values.last().copied().unwrap_or(0),
            avg: mean(sum, values.len() as u64),
            p50: at(PERCENTILES[0]),
            p90: at(PERCENTILES[1]),
            p95: at(PERCENTILES[2]),
            p99: at(PERCENTILES[3]),
        }
    }
}

/// `sum / count` as a float for display; 0 when there is nothing to average.
pub fn mean(sum: i128, count: u64) -> f64 {
    if count == 0 {
        0.0
    } else {
        sum as f64 / count as f64
    }
}

/// One histogram bucket: values in `[lower, upper)`; `upper` is absent for the last bucket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct HistogramBucket {
    pub lower: i64,
    pub upper: Option<i64>,
    pub count: u64,
}

/// Counts `values` into the buckets `[0, e0), [e0, e1), ..., [e_last, ∞)` of ascending `edges`.
/// Negative values (none are expected) count in the first bucket.
pub fn histogram(values: &[i64], edges: &[i64]) -> Vec<HistogramBucket> {
    let mut buckets: Vec<HistogramBucket> = std::iter::once(0)
        .chain(edges.iter().copied())
        .zip(edges.iter().copied().map(Some).chain(std::iter::once(None)))
        .map(|(lower, upper)| HistogramBucket {
            lower,
            upper,
            count: 0,
        })
        .collect();
    for &value in values {
        let index = edges.partition_point(|&edge| edge <= value);
        if let Some(bucket) = buckets.get_mut(index) {
            bucket.count += 1;
        }
    }
    buckets
}

/// How often each value occurs (depths, agent counts), ascending by value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct ValueCount {
    pub value: i64,
    pub count: u64,
}

pub fn value_counts(values: &[i64]) -> Vec<ValueCount> {
    let mut counts = std::collections::BTreeMap::<i64, u64>::new();
    for &value in values {
        *counts.entry(value).or_default() += 1;
    }
    counts
        .into_iter()
        .map(|(value, count)| ValueCount { value, count })
        .collect()
}

/// `part` as a percentage of `total` (0 when the total is 0).
pub fn share_percent(part: i64, total: i64) -> f64 {
    if total == 0 {
        0.0
    } else {
        part as f64 * 100.0 / total as f64
    }
}

/// Change from `previous` to `current` in percent; `None` when there was nothing before.
pub fn change_percent(current: i64, previous: i64) -> Option<f64> {
    (previous != 0).then(|| (current - previous) as f64 * 100.0 / previous as f64)
}

const MINUTE_MS: i64 = 60_000;
const HOUR_MS: i64 = 60 * MINUTE_MS;
const DAY_MS: i64 = 24 * HOUR_MS;
const WEEK_MS: i64 = 7 * DAY_MS;
/// 1970-01-01 was a Thursday; weeks start on Monday, four days later.
const WEEK_ORIGIN_MS: i64 = 4 * DAY_MS;

/// Most buckets one series may have, so a fine resolution over a long period is refused
/// rather than answered with an enormous document.
pub const MAX_BUCKETS: i64 = 2_000;

/// Width of a time-series bucket (SPEC.md "Statistics" `resolution`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum Resolution {
    Minutes5,
    Minutes15,
    Hour,
    Day,
    Week,
}

impl Resolution {
    pub const ALL: [Resolution; 5] = [
        Resolution::Minutes5,
        Resolution::Minutes15,
        Resolution::Hour,
        Resolution::Day,
        Resolution::Week,
    ];

    /// Any capitalisation of the spec's names.
    pub fn parse(raw: &str) -> Option<Resolution> {
        Self::ALL
            .into_iter()
            .find(|r| r.as_str().eq_ignore_ascii_case(raw.trim()))
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Resolution::Minutes5 => "Minutes5",
            Resolution::Minutes15 => "Minutes15",
            Resolution::Hour => "Hour",
            Resolution::Day => "Day",
            Resolution::Week => "Week",
        }
    }

    pub fn width_ms(self) -> i64 {
        match self {
            Resolution::Minutes5 => 5 * MINUTE_MS,
            Resolution::Minutes15 => 15 * MINUTE_MS,
            Resolution::Hour => HOUR_MS,
            Resolution::Day => DAY_MS,
            Resolution::Week => WEEK_MS,
        }
    }

    /// The start of the bucket holding `ms`: UTC clock boundaries, weeks from Monday 00:00.
    pub fn align_down(self, ms: i64) -> i64 {
        let origin = if self == Resolution::Week {
            WEEK_ORIGIN_MS
        } else {
            0
        };
        let width = self.width_ms();
        (ms - origin).div_euclid(width) * width + origin
    }

    /// The bucket for a report over `period_ms` when the client does not choose one: hours up
    /// to two days, days up to 90 days, weeks beyond.
    pub fn for_period(period_ms: i64) -> Resolution {
        if period_ms <= 2 * DAY_MS {
            Resolution::Hour
        } else if period_ms <= 90 * DAY_MS {
            Resolution::Day
        } else {
            Resolution::Week
        }
    }
}

/// The buckets covering `[from, to)`: the first starts at `from` aligned down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Buckets {
    pub origin: i64,
    pub width: i64,
    pub count: usize,
}

impl Buckets {
    /// `None` when the range would need more than [`MAX_BUCKETS`] buckets.
    pub fn new(from: i64, to: i64, resolution: Resolution) -> Option<Buckets> {
        let origin = resolution.align_down(from);
        let width = resolution.width_ms();
        let count = (to.max(from) - origin).div_euclid(width)
            + i64::from((to.max(from) - origin).rem_euclid(width) != 0);
        (count <= MAX_BUCKETS).then(|| Buckets {
            origin,
            width,
            count: usize::try_from(count.max(1)).unwrap_or(1),
        })
    }

    /// The bucket of an instant inside the range (the same integer division the store's SQL
    /// does, `(t - origin) / width`).
    pub fn index_of(&self, ms: i64) -> Option<usize> {
        let index = usize::try_from((ms - self.origin).div_euclid(self.width)).ok()?;
        (index < self.count).then_some(index)
    }

    pub fn start(&self, index: usize) -> i64 {
        self.origin + self.width * index as i64
    }

    pub fn starts(&self) -> impl Iterator<Item = i64> + '_ {
        (0..self.count).map(|i| self.start(i))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The textbook definition, written differently: the smallest value `x` of the list such
    /// that at least p% of the values are <= x.
    fn reference(values: &[i64], p: u32) -> i64 {
        let mut sorted = values.to_vec();
        sorted.sort();
        let n = sorted.len() as u64;
        *sorted
            .iter()
            .find(|&&x| sorted.iter().filter(|&&v| v <= x).count() as u64 * 100 >= u64::from(p) * n)
            .unwrap()
    }

    #[test]
    fn known_percentiles() {
        let values: Vec<i64> = (1..=20).collect();
        assert_eq!(nearest_rank(&values, 50), Some(10));
        assert_eq!(nearest_rank(&values, 90), Some(18));
        assert_eq!(nearest_rank(&values, 95), Some(19));
        assert_eq!(nearest_rank(&values, 99), Some(20));
        assert_eq!(nearest_rank(&[7], 50), Some(7));
        assert_eq!(nearest_rank(&[], 50), None);
        let d = Distribution::of(vec![15, 20, 35, 40, 50]);
        assert_eq!((d.p50, d.p90, d.min, d.max, d.count), (35, 50, 15, 50, 5));
        assert_eq!(d.avg, 32.0);
    }

    #[test]
    fn histogram_edges_are_lower_inclusive() {
        let h = histogram(&[0, 99, 100, 250, 120_000, 5_000_000], &LATENCY_EDGES_MS);
        assert_eq!(h.len(), LATENCY_EDGES_MS.len() + 1);
        assert_eq!((h[0].lower, h[0].upper, h[0].count), (0, Some(100), 2));
        assert_eq!((h[1].lower, h[1].count), (100, 1));
        assert_eq!((h[2].lower, h[2].count), (250, 1));
        assert_eq!((h[10].lower, h[10].upper, h[10].count), (120_000, None, 2));
    }

    #[test]
    fn buckets_align_to_clock_and_monday() {
        // 2026-11-25 (a Wednesday) 13:47:00 UTC.
        let t = 1_795_614_420_000;
        assert_eq!(Resolution::Hour.align_down(t) % HOUR_MS, 0);
        assert_eq!(Resolution::Day.align_down(t), 1_795_564_800_000);
        // Monday 2026-11-23.
        assert_eq!(Resolution::Week.align_down(t), 1_795_392_000_000);
        let b = Buckets::new(t - 7 * DAY_MS, t, Resolution::Day).unwrap();
        assert_eq!(b.count, 8);
        assert_eq!(b.index_of(t - 7 * DAY_MS), Some(0));
        assert_eq!(b.index_of(t - 1), Some(7));
        assert!(Buckets::new(0, 365 * DAY_MS, Resolution::Minutes5).is_none());
        assert_eq!(Resolution::parse("minutes15"), Some(Resolution::Minutes15));
        assert_eq!(Resolution::parse("HOUR"), Some(Resolution::Hour));
        assert_eq!(Resolution::parse("month"), None);
    }

    proptest! {
        #[test]
        fn percentile_matches_the_sorted_list_definition(values in prop::collection::vec(-1_000i64..1_000_000, 1..200), p in 1u32..=100) {
            let mut sorted = values.clone();
            sorted.sort();
            prop_assert_eq!(nearest_rank(&sorted, p), Some(reference(&values, p)));
        }

        #[test]
        fn percentile_is_monotone_and_within_range(values in prop::collection::vec(0i64..100_000, 1..200), p in 1u32..100) {
            let mut sorted = values.clone();
            sorted.sort();
            let (lo, hi) = (nearest_rank(&sorted, p).unwrap(), nearest_rank(&sorted, p + 1).unwrap());
            prop_assert!(lo <= hi);
            prop_assert!(sorted[0] <= lo && hi <= sorted[sorted.len() - 1]);
            let d = Distribution::of(values);
            prop_assert!(d.min <= d.p50 && d.p50 <= d.p90 && d.p90 <= d.p95 && d.p95 <= d.p99 && d.p99 <= d.max);
            prop_assert!(d.min as f64 <= d.avg && d.avg <= d.max as f64);
        }

        #[test]
        fn histogram_counts_every_value_in_its_bucket(values in prop::collection::vec(0i64..500_000, 0..200)) {
            let h = histogram(&values, &LATENCY_EDGES_MS);
            prop_assert_eq!(h.iter().map(|b| b.count).sum::<u64>(), values.len() as u64);
            for bucket in &h {
                let inside = values.iter().filter(|&&v| v >= bucket.lower && bucket.upper.is_none_or(|u| v < u)).count() as u64;
                prop_assert_eq!(bucket.count, inside);
            }
        }

        #[test]
        fn every_instant_of_the_range_has_its_bucket(from in 0i64..4_000_000_000_000, len in 1i64..(30 * DAY_MS), at in 0.0f64..1.0, r in 0usize..5) {
            let resolution = Resolution::ALL[r];
            let to = from + len;
            if let Some(b) = Buckets::new(from, to, resolution) {
                let t = from + ((len - 1) as f64 * at) as i64;
                let i = b.index_of(t).unwrap();
                prop_assert!(b.start(i) <= t && t < b.start(i) + b.width);
                prop_assert_eq!(b.start(i), resolution.align_down(t));
                prop_assert!(b.start(b.count - 1) < to);
            }
        }
    }
}
