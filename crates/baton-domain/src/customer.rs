//! End customers of a tenant, the people or accounts cost is attributed to.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{DomainError, DomainResult, Timestamp};

const MAX_EXTERNAL_ID_LEN: usize = 256;
const MAX_TEXT_LEN: usize = 320;
const MAX_METADATA_BYTES: usize = 16 * 1024;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct Customer {
    pub id: String,
    /// The tenant's own id for the customer; unique within the tenant.
    pub external_id: String,
    pub name: Option<String>,
    pub email: Option<String>,
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub metadata: Value,
    /// `false` excludes the customer from usage reports.
    pub is_active: bool,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NewCustomer {
    pub external_id: String,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub email: Option<String>,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub metadata: Option<Value>,
    #[serde(default)]
    pub is_active: Option<bool>,
}

/// Only fields given (non-null) change.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CustomerPatch {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub email: Option<String>,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub metadata: Option<Value>,
    #[serde(default)]
    pub is_active: Option<bool>,
}

pub fn validate_external_id(raw: &str, param: &str) -> DomainResult<String> {
    let id = raw.trim();
    if id.is_empty() {
        return Err(DomainError::validation(
            param,
            format!("{param} must not be empty"),
        ));
    }
    if id.len() > MAX_EXTERNAL_ID_LEN {
        return Err(DomainError::validation(
            param,
            format!("{param} must be at most {MAX_EXTERNAL_ID_LEN} bytes"),
        ));
    }
    if id.chars().any(char::is_control) {
        return Err(DomainError::validation(
            param,
            format!("{param} must not contain control characters"),
        ));
    }
    Ok(id.to_string())
}

fn validate_text(value: Option<String>, param: &str) -> DomainResult<Option<String>> {
    match value {
        Some(text) if text.len() > MAX_TEXT_LEN => Err(DomainError::validation(
            param,
            format!("{param} must be at most {MAX_TEXT_LEN} bytes"),
        )),
        Some(text) if text.chars().any(char::is_control) => Err(DomainError::validation(
            param,
            format!("{param} must not contain control characters"),
        )),
        other => Ok(other),
    }
}

fn validate_email(value: Option<String>) -> DomainResult<Option<String>> {
    let value = validate_text(value, "email")?;
    if let Some(email) = &value {
        let valid = email.split_once('@').is_some_and(|(local, domain)| {
            !local.is_empty() && domain.contains('.') && !email.contains(' ')
        });
        if !valid {
            return Err(DomainError::validation(
                "email",
                "email must be an address like name@example.com",
            ));
        }
    }
    Ok(value)
}

fn validate_metadata(value: Option<Value>) -> DomainResult<Option<Value>> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(map)) => {
            let size = serde_json::to_vec(&map)
                .map(|v| v.len())
                .unwrap_or(usize::MAX);
            if size > MAX_METADATA_BYTES {
                return Err(DomainError::validation(
                    "metadata",
                    format!("metadata must be at most {MAX_METADATA_BYTES} bytes of JSON"),
                ));
            }
            Ok(Some(Value::Object(map)))
        }
        Some(_) => Err(DomainError::validation(
            "metadata",
            "metadata must be a JSON object",
        )),
    }
}

impl NewCustomer {
    /// Checks every field; returns the customer as it would be stored.
    pub fn validate(self) -> DomainResult<NewCustomer> {
        Ok(NewCustomer {
            external_id: validate_external_id(&self.external_id, "externalId")?,
            name: validate_text(self.name, "name")?,
            email: validate_email(self.email)?,
            metadata: validate_metadata(self.metadata)?,
            is_active: self.is_active,
        })
    }
}

impl CustomerPatch {
    pub fn validate(self) -> DomainResult<CustomerPatch> {
        Ok(CustomerPatch {
            name: validate_text(self.name, "name")?,
            email: validate_email(self.email)?,
            metadata: validate_metadata(self.metadata)?,
            is_active: self.is_active,
        })
    }
}

/// Default window of a customer usage report (SPEC.md "Limits": 30 days).
pub const DEFAULT_USAGE_DAYS: i64 = 30;

/// What one customer used in a period. Requests are root requests (a sub-agent is part of its
/// root's request); credits and tokens include every run of their trees.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct CustomerUsage {
    pub external_id: String,
    pub name: Option<String>,
    pub is_active: bool,
    pub from: Timestamp,
    pub to: Timestamp,
    /// Billed credits (with the tenant's markup).
    pub credits_used: i64,
    pub cost_usd: f64,
    /// Catalogue price, in credits.
    pub raw_credits_used: i64,
    pub request_count: i64,
    /// Model calls, sub-agents' included.
    pub inference_count: i64,
    pub tokens_in: i64,
    pub tokens_out: i64,
}

/// Usage of every active customer with requests in the period, most credits first.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct CustomersUsage {
    pub from: Timestamp,
    pub to: Timestamp,
    pub customers: Vec<CustomerUsage>,
    pub total_credits_used: i64,
    pub total_cost_usd: f64,
    pub total_requests: i64,
}

/// One customer's sums, as the store aggregates them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UsageTotals {
    pub credits: i64,
    pub raw_credits: i64,
    pub requests: i64,
    pub inferences: i64,
    pub tokens_in: i64,
    pub tokens_out: i64,
}

impl CustomerUsage {
    pub fn new(customer: &Customer, from: Timestamp, to: Timestamp, totals: UsageTotals) -> Self {
        CustomerUsage {
            external_id: customer.external_id.clone(),
            name: customer.name.clone(),
            is_active: customer.is_active,
            from,
            to,
            credits_used: totals.credits,
            cost_usd: crate::credits::Credits(totals.credits).to_usd(),
            raw_credits_used: totals.raw_credits,
            request_count: totals.requests,
            inference_count: totals.inferences,
            tokens_in: totals.tokens_in,
            tokens_out: totals.tokens_out,
        }
    }
}

impl CustomersUsage {
    /// Ranks the rows (most credits first, then by id for a stable order) and totals them.
    pub fn new(from: Timestamp, to: Timestamp, mut customers: Vec<CustomerUsage>) -> Self {
        customers.sort_by(|a, b| {
            b.credits_used
                .cmp(&a.credits_used)
                .then_with(|| a.external_id.cmp(&b.external_id))
        });
        let total_credits_used = customers
            .iter()
            .fold(0i64, |sum, c| sum.saturating_add(c.credits_used));
        let total_requests = customers
            .iter()
            .fold(0i64, |sum, c| sum.saturating_add(c.request_count));
        CustomersUsage {
            from,
            to,
            customers,
            total_credits_used,
            total_cost_usd: crate::credits::Credits(total_credits_used).to_usd(),
            total_requests,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn new(value: Value) -> DomainResult<NewCustomer> {
        serde_json::from_value::<NewCustomer>(value)
            .unwrap()
            .validate()
    }

    fn param_of(result: DomainResult<NewCustomer>) -> String {
        let DomainError::Validation { param, .. } = result.unwrap_err();
        param
    }

    #[test]
    fn validation_names_fields() {
        assert!(
            new(json!({"externalId": "cus_1", "email": "a@b.co", "metadata": {"plan": "pro"}}))
                .is_ok()
        );
        assert_eq!(param_of(new(json!({"externalId": "  "}))), "externalId");
        assert_eq!(
            param_of(new(json!({"externalId": "x", "email": "nope"}))),
            "email"
        );
        assert_eq!(
            param_of(new(json!({"externalId": "x", "metadata": [1]}))),
            "metadata"
        );
        assert_eq!(
            param_of(new(json!({"externalId": "x".repeat(300)}))),
            "externalId"
        );
    }

    #[test]
    fn external_id_is_trimmed() {
        assert_eq!(
            new(json!({"externalId": " cus_1 "})).unwrap().external_id,
            "cus_1"
        );
    }
}
