//! Budgets (DESIGN.md paths: `/api/v1/budgets`): a spend limit per calendar period for the
//! whole tenant, or for one customer or one tag, with alert thresholds sent to a webhook and an
//! optional hard limit that refuses requests once it is reached.

use serde::{Deserialize, Serialize};

use crate::tags::validate_tags;
use crate::{DomainError, DomainResult, Timestamp};

const MAX_NAME_LEN: usize = 200;
const MAX_THRESHOLDS: usize = 10;
/// Thresholds past 100% warn about overspend of a soft budget.
const MAX_THRESHOLD_PERCENT: u32 = 1000;
const MAX_URL_LEN: usize = 2048;
/// Alerts at half, most and all of the limit unless the budget says otherwise.
pub const DEFAULT_THRESHOLDS: [u32; 3] = [50, 80, 100];

/// The calendar period a budget's spend is counted over, in UTC (weeks start on Monday).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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
    pub fn parse(raw: &str, param: &str) -> DomainResult<BudgetPeriod> {
        match raw.trim().to_ascii_lowercase().as_str() {
            "day" => Ok(BudgetPeriod::Day),
            "week" => Ok(BudgetPeriod::Week),
            "month" => Ok(BudgetPeriod::Month),
            _ => Err(DomainError::validation(
                param,
                format!("unknown period '{raw}': use Day, Week or Month"),
            )),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct Budget {
    pub id: String,
    pub name: String,
    pub period: BudgetPeriod,
    /// Spend allowed per period, in credits (1,000,000 = 1 USD).
    pub limit_credits: i64,
    /// Percentages of the limit at which the webhook is told, once per period each.
    pub alert_thresholds_percent: Vec<u32>,
    pub webhook_url: Option<String>,
    /// Refuse requests (402 `BUDGET_EXCEEDED`) once the period's spend reaches the limit.
    pub hard_limit: bool,
    /// Only requests of this customer (external id) count; `null`: every request.
    pub customer_id: Option<String>,
    /// Only requests carrying this tag count; `null`: every request.
    pub tag: Option<String>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

impl Budget {
    /// Whether a request of `customer` with `tags` counts against this budget.
    pub fn applies_to(&self, customer: Option<&str>, tags: &[String]) -> bool {
        let customer_matches = match &self.customer_id {
            Some(wanted) => customer == Some(wanted.as_str()),
            None => true,
        };
        let tag_matches = match &self.tag {
            Some(wanted) => tags.iter().any(|t| t == wanted),
            None => true,
        };
        customer_matches && tag_matches
    }
}

/// The body of a create or a full replace.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BudgetInput {
    pub name: String,
    /// `Day`, `Week` or `Month`, any case.
    pub period: String,
    pub limit_credits: i64,
    /// Default `[50, 80, 100]`; each 1 to 1000.
    #[serde(default)]
    pub alert_thresholds_percent: Option<Vec<u32>>,
    #[serde(default)]
    pub webhook_url: Option<String>,
    #[serde(default)]
    pub hard_limit: bool,
    #[serde(default)]
    pub customer_id: Option<String>,
    #[serde(default)]
    pub tag: Option<String>,
}

/// A budget input whose every field is checked.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidBudget {
    pub name: String,
    pub period: BudgetPeriod,
    pub limit_credits: i64,
    pub alert_thresholds_percent: Vec<u32>,
    pub webhook_url: Option<String>,
    pub hard_limit: bool,
    pub customer_id: Option<String>,
    pub tag: Option<String>,
}

impl BudgetInput {
    pub fn validate(self) -> DomainResult<ValidBudget> {
        let name = self.name.trim().to_string();
        if name.is_empty() || name.len() > MAX_NAME_LEN || name.chars().any(char::is_control) {
            return Err(DomainError::validation(
                "name",
                format!("name must be 1 to {MAX_NAME_LEN} bytes without control characters"),
            ));
        }
        let period = BudgetPeriod::parse(&self.period, "period")?;
        if self.limit_credits < 1 {
            return Err(DomainError::validation(
                "limitCredits",
                "limitCredits must be at least 1",
            ));
        }
        let mut thresholds = self
            .alert_thresholds_percent
            .unwrap_or_else(|| DEFAULT_THRESHOLDS.to_vec());
        if thresholds.len() > MAX_THRESHOLDS
            || thresholds
                .iter()
                .any(|&p| p == 0 || p > MAX_THRESHOLD_PERCENT)
        {
            return Err(DomainError::validation(
                "alertThresholdsPercent",
                format!(
                    "alertThresholdsPercent takes at most {MAX_THRESHOLDS} values, each 1 to {MAX_THRESHOLD_PERCENT}"
                ),
            ));
        }
        thresholds.sort_unstable();
        thresholds.dedup();
        let webhook_url = self
            .webhook_url
            .map(|raw| raw.trim().to_string())
            .filter(|u| !u.is_empty())
            .map(|raw| {
                let parsed = url::Url::parse(&raw).ok().filter(|u| {
                    matches!(u.scheme(), "http" | "https")
                        && u.host().is_some()
                        && u.username().is_empty()
                        && u.password().is_none()
                });
                match parsed {
                    Some(_) if raw.len() <= MAX_URL_LEN => Ok(raw),
                    _ => Err(DomainError::validation(
                        "webhookUrl",
                        "webhookUrl must be an absolute http(s) URL without credentials",
                    )),
                }
            })
            .transpose()?;
        let customer_id = self
            .customer_id
            .map(|id| crate::customer::validate_external_id(&id, "customerId"))
            .transpose()?;
        let tag = match self.tag {
            Some(tag) => validate_tags(vec![tag], "tag")?.into_iter().next(),
            None => None,
        };
        Ok(ValidBudget {
            name,
            period,
            limit_credits: self.limit_credits,
            alert_thresholds_percent: thresholds,
            webhook_url,
            hard_limit: self.hard_limit,
            customer_id,
            tag,
        })
    }
}

/// Credits held against a budget's period while a request runs, released when its root run is
/// logged (the run's own spend is counted in the same write). Stored with the run's row so
/// that a run its process never finished can give them back (`baton-store`'s `abandoned`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BudgetHold {
    pub budget_id: String,
    /// Start of the period, epoch milliseconds.
    pub window_start_ms: i64,
    pub credits: i64,
}

/// A budget's current period.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct BudgetStatus {
    #[serde(flatten)]
    pub budget: Budget,
    pub current_period: BudgetWindow,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct BudgetWindow {
    pub start: Timestamp,
    pub end: Timestamp,
    pub spent_credits: i64,
    pub spent_usd: f64,
    /// Held by requests still running.
    pub reserved_credits: i64,
    pub remaining_credits: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input() -> BudgetInput {
        BudgetInput {
            name: "Monthly".into(),
            period: "month".into(),
            limit_credits: 1000,
            alert_thresholds_percent: Some(vec![100, 50, 50]),
            webhook_url: Some("https://hooks.example.com/b".into()),
            hard_limit: true,
            customer_id: None,
            tag: Some("Team:search".into()),
        }
    }

    #[test]
    fn validation_names_the_field() {
        let valid = input().validate().unwrap();
        assert_eq!(valid.period, BudgetPeriod::Month);
        assert_eq!(valid.alert_thresholds_percent, [50, 100]);
        let param = |b: BudgetInput| match b.validate() {
            Err(DomainError::Validation { param, .. }) => param,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            param(BudgetInput {
                period: "year".into(),
                ..input()
            }),
            "period"
        );
        assert_eq!(
            param(BudgetInput {
                limit_credits: 0,
                ..input()
            }),
            "limitCredits"
        );
        assert_eq!(
            param(BudgetInput {
                alert_thresholds_percent: Some(vec![0]),
                ..input()
            }),
            "alertThresholdsPercent"
        );
        assert_eq!(
            param(BudgetInput {
                webhook_url: Some("ftp://x".into()),
                ..input()
            }),
            "webhookUrl"
        );
        assert_eq!(
            param(BudgetInput {
                webhook_url: Some("https://u:p@x.example.com".into()),
                ..input()
            }),
            "webhookUrl"
        );
        assert_eq!(
            param(BudgetInput {
                name: " ".into(),
                ..input()
            }),
            "name"
        );
    }

    #[test]
    fn scope_matches_customer_and_tag() {
        let budget = |customer: Option<&str>, tag: Option<&str>| Budget {
            id: "b".into(),
            name: "b".into(),
            period: BudgetPeriod::Day,
            limit_credits: 1,
            alert_thresholds_percent: vec![],
            webhook_url: None,
            hard_limit: false,
            customer_id: customer.map(str::to_string),
            tag: tag.map(str::to_string),
            created_at: Timestamp::now(),
            updated_at: Timestamp::now(),
        };
        let tags = vec!["Team:search".to_string()];
        assert!(budget(None, None).applies_to(None, &[]));
        assert!(budget(Some("c1"), None).applies_to(Some("c1"), &[]));
        assert!(!budget(Some("c1"), None).applies_to(Some("c2"), &tags));
        assert!(budget(None, Some("Team:search")).applies_to(None, &tags));
        assert!(!budget(None, Some("Team:ads")).applies_to(None, &tags));
        assert!(!budget(Some("c1"), Some("Team:search")).applies_to(Some("c1"), &[]));
    }
}
