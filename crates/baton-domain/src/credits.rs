use serde::{Deserialize, Serialize};

/// Credits per US dollar. Every cost in Baton is an integer number of credits.
pub const CREDITS_PER_USD: i64 = 1_000_000;

/// An amount of money in credits (1,000,000 = 1 USD). Integer, so sums are exact.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Credits(pub i64);

impl Credits {
    /// USD for display only; never feed it back into arithmetic.
    pub fn to_usd(self) -> f64 {
        self.0 as f64 / CREDITS_PER_USD as f64
    }

    pub fn saturating_add(self, other: Credits) -> Credits {
        Credits(self.0.saturating_add(other.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usd_conversion() {
        assert_eq!(Credits(1_500_000).to_usd(), 1.5);
        assert_eq!(
            Credits(i64::MAX).saturating_add(Credits(1)),
            Credits(i64::MAX)
        );
    }
}
