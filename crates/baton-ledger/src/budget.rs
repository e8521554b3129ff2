//! Budget arithmetic (DESIGN.md paths: `/budgets` with `period: Day/Week/Month`): the window a
//! moment falls in, and which alert thresholds a spend crosses. Windows are UTC calendar periods
//! (weeks start on Monday), so every instance agrees on them without coordination.

use baton_domain::budget::BudgetPeriod;
use chrono::{DateTime, Datelike, Duration, NaiveDate, TimeZone, Utc};

/// `[start, end)` of the window of `period` holding `at`.
pub fn budget_window(period: BudgetPeriod, at: DateTime<Utc>) -> (DateTime<Utc>, DateTime<Utc>) {
    let day = at.date_naive();
    let (start, end) = match period {
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

/// The thresholds (percent of `limit`) that `spent` has reached.
pub fn reached_thresholds(limit: i64, spent: i64, thresholds: &[u32]) -> Vec<u32> {
    if spent < 0 {
        return Vec::new();
    }
    crossed_thresholds(limit, -1, spent, thresholds)
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
            budget_window(BudgetPeriod::Day, t),
            (at("2026-11-25T00:00:00Z"), at("2026-11-26T00:00:00Z"))
        );
        assert_eq!(
            budget_window(BudgetPeriod::Week, t),
            (at("2026-11-23T00:00:00Z"), at("2026-11-30T00:00:00Z"))
        );
        assert_eq!(
            budget_window(BudgetPeriod::Month, t),
            (at("2026-11-01T00:00:00Z"), at("2026-12-01T00:00:00Z"))
        );
        assert_eq!(
            budget_window(BudgetPeriod::Month, at("2026-12-31T23:59:59Z")).1,
            at("2027-01-01T00:00:00Z")
        );
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
        assert_eq!(reached_thresholds(1000, 800, &[100, 50, 80]), [50, 80]);
        assert!(reached_thresholds(1000, 0, &[50]).is_empty());
    }

    proptest! {
        #[test]
        fn a_moment_lies_in_its_window(secs in 0i64..4_000_000_000) {
            let t = DateTime::from_timestamp(secs, 0).unwrap();
            for period in [BudgetPeriod::Day, BudgetPeriod::Week, BudgetPeriod::Month] {
                let (start, end) = budget_window(period, t);
                prop_assert!(start <= t && t < end);
                // The next window starts where this one ends.
                prop_assert_eq!(budget_window(period, end).0, end);
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
