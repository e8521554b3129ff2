//! Budget arithmetic (DESIGN.md paths: `/budgets` with `period: Day/Week/Month`): the window a
//! moment falls in, and which alert thresholds a spend crosses. Windows are UTC calendar periods
//! (weeks start on Monday), so every instance agrees on them without coordination.

use chrono::{DateTime, Datelike, Duration, NaiveDate, TimeZone, Utc};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum BudgetPeriod {
    Day,
    Week,
    Month,
}

impl BudgetPeriod {
    pub fn as_str(self) -> &'static str {
        match self {
            BudgetPeriod::Day => "Day",
            BudgetPeriod::Week => "Week",
            BudgetPeriod::Month => "Month",
        }
    }

    /// Any letter case, as DESIGN.md asks of enum values.
    pub fn parse(raw: &str) -> Option<BudgetPeriod> {
        match raw.to_ascii_lowercase().as_str() {
            "day" => Some(BudgetPeriod::Day),
            "week" => Some(BudgetPeriod::Week),
            "month" => Some(BudgetPeriod::Month),
            _ => None,
        }
    }

    /// `[start, end)` of the window holding `at`.
    pub fn window(self, at: DateTime<Utc>) -> (DateTime<Utc>, DateTime<Utc>) {
        let day = at.date_naive();
        let (start, end) = match self {
            BudgetPeriod::Day => (day, day + Duration::days(1)),
            BudgetPeriod::Week => {
                let monday = day - Duration::days(i64::from(day.weekday().num_days_from_monday()));
                (monday, monday + Duration::days(7))
            }
            BudgetPeriod::Month => {
                let first = first_of_month(day.year(), day.month());
                let next = if day.month() == 12 {
                    first_of_month(day.year() + 1, 1)
                } else {
                    first_of_month(day.year(), day.month() + 1)
                };
                (first, next)
            }
        };
        (midnight(start), midnight(end))
    }
}

fn first_of_month(year: i32, month: u32) -> NaiveDate {
    NaiveDate::from_ymd_opt(year, month, 1).unwrap_or(NaiveDate::MIN)
}

fn midnight(day: NaiveDate) -> DateTime<Utc> {
    Utc.from_utc_datetime(&day.and_time(chrono::NaiveTime::MIN))
}

/// The thresholds (percent of `limit`) that spend crossed going from `before` to `after`: at or
/// above the threshold now, below it before. Each is reported once per window by the caller.
pub fn crossed_thresholds(limit: i64, before: i64, after: i64, thresholds: &[u32]) -> Vec<u32> {
    if limit <= 0 {
        return Vec::new();
    }
    // `spend * 100 >= limit * pct` in i128: exact, no float rounding at the boundary.
    let reached =
        |spend: i64, pct: u32| i128::from(spend) * 100 >= i128::from(limit) * i128::from(pct);
    let mut crossed: Vec<u32> = thresholds
        .iter()
        .copied()
        .filter(|&pct| reached(after, pct) && !reached(before, pct))
        .collect();
    crossed.sort_unstable();
    crossed.dedup();
    crossed
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn at(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text)
            .unwrap()
            .with_timezone(&Utc)
    }

    #[test]
    fn windows_are_utc_calendar_periods() {
        let t = at("2026-11-25T15:30:00Z"); // a Wednesday
        assert_eq!(
            BudgetPeriod::Day.window(t),
            (at("2026-11-25T00:00:00Z"), at("2026-11-26T00:00:00Z"))
        );
        assert_eq!(
            BudgetPeriod::Week.window(t),
            (at("2026-11-23T00:00:00Z"), at("2026-11-30T00:00:00Z"))
        );
        assert_eq!(
            BudgetPeriod::Month.window(t),
            (at("2026-11-01T00:00:00Z"), at("2026-12-01T00:00:00Z"))
        );
        assert_eq!(
            BudgetPeriod::Month.window(at("2026-12-31T23:59:59Z")).1,
            at("2027-01-01T00:00:00Z")
        );
        assert_eq!(BudgetPeriod::parse("WEEK"), Some(BudgetPeriod::Week));
        assert_eq!(BudgetPeriod::parse("fortnight"), None);
    }

    #[test]
    fn thresholds_are_crossed_once() {
        assert_eq!(crossed_thresholds(1000, 0, 500, &[50, 80, 100]), [50]);
        assert_eq!(
            crossed_thresholds(1000, 500, 1200, &[50, 80, 100]),
            [80, 100]
        );
        assert!(crossed_thresholds(1000, 800, 900, &[50, 80, 100]).is_empty());
        assert_eq!(crossed_thresholds(3, 1, 2, &[50]), [50], "2/3 is past 50%");
        assert!(crossed_thresholds(0, 0, 10, &[50]).is_empty());
    }

    proptest! {
        #[test]
        fn a_moment_lies_in_its_window(secs in 0i64..4_000_000_000) {
            let t = DateTime::from_timestamp(secs, 0).unwrap();
            for period in [BudgetPeriod::Day, BudgetPeriod::Week, BudgetPeriod::Month] {
                let (start, end) = period.window(t);
                prop_assert!(start <= t && t < end);
                // The next window starts where this one ends.
                prop_assert_eq!(period.window(end).0, end);
            }
        }

        #[test]
        fn spending_in_steps_crosses_each_threshold_exactly_once(
            limit in 1i64..1_000_000_000,
            steps in prop::collection::vec(0i64..100_000_000, 1..30),
        ) {
            let thresholds = [25, 50, 80, 100, 150];
            let mut spent = 0i64;
            let mut seen = Vec::new();
            for step in steps {
                seen.extend(crossed_thresholds(limit, spent, spent + step, &thresholds));
                spent += step;
            }
            let expected: Vec<u32> = thresholds
                .iter()
                .copied()
                .filter(|&p| i128::from(spent) * 100 >= i128::from(limit) * i128::from(p))
                .collect();
            prop_assert_eq!(seen, expected);
        }
    }
}
