//! Baton's money. Everything is integer credits (1,000,000 = 1 USD); intermediate products use
//! `i128` so no realistic token count overflows, and each inference is rounded once, half up.

pub mod budget;
pub mod stats;
pub mod tree;

pub use budget::{budget_window, crossed_thresholds, reached_thresholds};
pub use tree::{TreeRun, TreeTotals};

use baton_domain::chat::Usage;
use baton_domain::credits::Credits;
use baton_domain::model::ModelDescriptor;
use serde::{Deserialize, Serialize};

/// Prices of one model, in credits per million tokens, plus per-call fees.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Price {
    pub input_per_million: i64,
    pub output_per_million: i64,
    /// Cache reads; falls back to the input price when the provider has none.
    pub cached_input_per_million: Option<i64>,
    /// Fee for each provider-run web search.
    pub web_search_per_call: i64,
}

impl Price {
    pub fn of(descriptor: &ModelDescriptor, web_search_per_call: i64) -> Price {
        Price {
            input_per_million: descriptor.input_credits_per_million,
            output_per_million: descriptor.output_credits_per_million,
            cached_input_per_million: descriptor.cached_input_credits_per_million,
            web_search_per_call,
        }
    }
}

/// The cost of one inference: raw (catalogue price) and billed (with the tenant's markup).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Cost {
    pub raw: Credits,
    pub billed: Credits,
    /// The served model was not in the catalogue, so it was priced 0.
    pub pricing_uncertain: bool,
}

impl Cost {
    pub fn uncertain() -> Cost {
        Cost {
            pricing_uncertain: true,
            ..Cost::default()
        }
    }

    /// The cost of two inferences together (a request of several model calls).
    pub fn plus(self, other: Cost) -> Cost {
        Cost {
            raw: self.raw.saturating_add(other.raw),
            billed: self.billed.saturating_add(other.billed),
            pricing_uncertain: self.pricing_uncertain || other.pricing_uncertain,
        }
    }
}

/// `round_half_up(n / d)` for non-negative `n` and positive `d`.
fn div_round_half_up(n: i128, d: i128) -> i128 {
    n / d + i128::from(n % d >= (d + 1) / 2)
}

fn clamp(value: i128) -> i64 {
    value.clamp(0, i128::from(i64::MAX)) as i64
}

/// Prices one inference. `markup_percent` (e.g. 12.5) is applied to the raw cost.
pub fn price_inference(usage: &Usage, price: &Price, markup_percent: f64) -> Cost {
    let cached = usage.cached_tokens.min(usage.tokens_in);
    let uncached = usage.tokens_in - cached;
    let cached_price = price
        .cached_input_per_million
        .unwrap_or(price.input_per_million);
    // Saturating: absurd inputs clamp at i64::MAX credits instead of wrapping.
    let term = |tokens: u64, per_million: i64| {
        i128::from(tokens).saturating_mul(i128::from(per_million.max(0)))
    };
    let micro = term(uncached, price.input_per_million)
        .saturating_add(term(cached, cached_price))
        .saturating_add(term(usage.tokens_out, price.output_per_million));
    let raw = div_round_half_up(micro, 1_000_000)
        .saturating_add(term(usage.web_search_calls, price.web_search_per_call));
    Cost {
        raw: Credits(clamp(raw)),
        billed: Credits(clamp(apply_markup(raw, markup_percent))),
        pricing_uncertain: false,
    }
}

/// Markup is given in percent with up to four decimals; it is applied as an integer ratio.
fn apply_markup(raw: i128, markup_percent: f64) -> i128 {
    if !markup_percent.is_finite() || markup_percent <= 0.0 {
        return raw;
    }
    let basis = (markup_percent * 10_000.0).round() as i128; // 1% = 10_000
    raw.saturating_add(div_round_half_up(raw.saturating_mul(basis), 1_000_000))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const GPT4O_MINI: Price = Price {
        input_per_million: 150_000,
        output_per_million: 600_000,
        cached_input_per_million: Some(75_000),
        web_search_per_call: 0,
    };

    fn usage(tokens_in: u64, tokens_out: u64) -> Usage {
        Usage {
            tokens_in,
            tokens_out,
            ..Usage::default()
        }
    }

    #[test]
    fn prices_are_exact_integers_rounded_half_up() {
        // 1000 in * 0.15 + 500 out * 0.6 = 150 + 300 credits.
        assert_eq!(
            price_inference(&usage(1000, 500), &GPT4O_MINI, 0.0).raw,
            Credits(450)
        );
        // 3 in * 0.15 = 0.45 -> 0; 4 in -> 0.6 -> 1.
        assert_eq!(
            price_inference(&usage(3, 0), &GPT4O_MINI, 0.0).raw,
            Credits(0)
        );
        assert_eq!(
            price_inference(&usage(4, 0), &GPT4O_MINI, 0.0).raw,
            Credits(1)
        );
        // Cached tokens are billed at the cache price.
        let cached = Usage {
            tokens_in: 1000,
            cached_tokens: 1000,
            ..Usage::default()
        };
        assert_eq!(price_inference(&cached, &GPT4O_MINI, 0.0).raw, Credits(75));
        // Markup 10% on 450 -> 495; web search calls add their fee.
        assert_eq!(
            price_inference(&usage(1000, 500), &GPT4O_MINI, 10.0).billed,
            Credits(495)
        );
        let search = Usage {
            web_search_calls: 2,
            ..Usage::default()
        };
        let with_fee = Price {
            web_search_per_call: 10_000,
            ..GPT4O_MINI
        };
        assert_eq!(
            price_inference(&search, &with_fee, 0.0).raw,
            Credits(20_000)
        );
    }

    proptest! {
        #[test]
        fn cost_never_decreases_as_tokens_grow(a in 0u64..10_000_000_000, b in 0u64..10_000_000_000, extra in 0u64..1_000_000) {
            let base = price_inference(&usage(a, b), &GPT4O_MINI, 7.5);
            let more_in = price_inference(&usage(a + extra, b), &GPT4O_MINI, 7.5);
            let more_out = price_inference(&usage(a, b + extra), &GPT4O_MINI, 7.5);
            prop_assert!(more_in.raw >= base.raw && more_out.raw >= base.raw);
            prop_assert!(base.billed >= base.raw);
        }

        #[test]
        fn a_requests_total_is_the_exact_sum_of_its_inferences(
            calls in prop::collection::vec((0u64..5_000_000, 0u64..500_000, 0u64..3), 1..40),
            markup in 0.0f64..200.0,
        ) {
            let costs: Vec<Cost> = calls
                .iter()
                .map(|&(i, o, s)| price_inference(&Usage { tokens_in: i, tokens_out: o, web_search_calls: s, ..Usage::default() }, &GPT4O_MINI, markup))
                .collect();
            let total = costs.iter().fold(Cost::default(), |sum, c| sum.plus(*c));
            prop_assert_eq!(total.raw.0, costs.iter().map(|c| c.raw.0).sum::<i64>());
            prop_assert_eq!(total.billed.0, costs.iter().map(|c| c.billed.0).sum::<i64>());
            prop_assert!(total.billed >= total.raw);
        }

        #[test]
        fn never_overflows(a in any::<u64>(), b in any::<u64>(), p in any::<i64>()) {
            let price = Price { input_per_million: p, output_per_million: p, cached_input_per_million: None, web_search_per_call: p };
            let cost = price_inference(&Usage { tokens_in: a, tokens_out: b, web_search_calls: a, ..Usage::default() }, &price, 1000.0);
            prop_assert!(cost.raw.0 >= 0 && cost.billed.0 >= 0);
        }
    }
}
