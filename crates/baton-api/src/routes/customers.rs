//! `/api/v1/customers`: end customers that cost is attributed to.

use axum::extract::State;
use axum::http::StatusCode;
use baton_domain::Timestamp;
use baton_domain::customer::{
    Customer, CustomerPatch, CustomerUsage, CustomersUsage, DEFAULT_USAGE_DAYS, NewCustomer,
};
use serde::Deserialize;
use utoipa::IntoParams;

use crate::auth::Principal;
use crate::error::{ApiError, ApiResult, ErrorResponse};
use crate::extract::{Json, NoBody, PathParam, Query};
use crate::state::AppState;

const DEFAULT_PAGE: u64 = 100;
const MAX_PAGE: u64 = 1000;

#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListCustomers {
    /// Page size, 1 to 1000 (default 100).
    pub limit: Option<u64>,
    /// Rows to skip.
    pub offset: Option<u64>,
}

#[utoipa::path(get, path = "/api/v1/customers", tag = "customers", params(ListCustomers),
    responses(
        (status = 200, description = "Customers in creation order", body = [Customer]),
        (status = 400, description = "Invalid paging", body = ErrorResponse),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
    ))]
pub async fn list_customers(
    State(state): State<AppState>,
    principal: Principal,
    Query(query): Query<ListCustomers>,
) -> ApiResult<axum::Json<Vec<Customer>>> {
    let limit = query.limit.unwrap_or(DEFAULT_PAGE);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(ApiError::validation(
            "limit",
            format!("limit must be between 1 and {MAX_PAGE}"),
        ));
    }
    let offset = query.offset.unwrap_or(0);
    if offset > i64::MAX as u64 {
        return Err(ApiError::validation("offset", "offset is too large"));
    }
    Ok(axum::Json(
        state
            .store
            .list_customers(&principal.tenant, limit, offset)
            .await?,
    ))
}

#[utoipa::path(post, path = "/api/v1/customers", tag = "customers", request_body = NewCustomer,
    responses(
        (status = 201, description = "Created", body = Customer),
        (status = 400, description = "Invalid field", body = ErrorResponse),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
        (status = 409, description = "A customer with this externalId exists", body = ErrorResponse),
    ))]
pub async fn create_customer(
    State(state): State<AppState>,
    principal: Principal,
    Json(body): Json<NewCustomer>,
) -> ApiResult<(StatusCode, axum::Json<Customer>)> {
    let customer = state
        .store
        .create_customer(&principal.tenant, &body.validate()?)
        .await?;
    Ok((StatusCode::CREATED, axum::Json(customer)))
}

#[utoipa::path(get, path = "/api/v1/customers/{externalId}", tag = "customers",
    params(("externalId" = String, Path, description = "The tenant's id for the customer")),
    responses(
        (status = 200, description = "The customer", body = Customer),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
        (status = 404, description = "No such customer", body = ErrorResponse),
    ))]
pub async fn get_customer(
    State(state): State<AppState>,
    principal: Principal,
    PathParam(external_id): PathParam,
) -> ApiResult<axum::Json<Customer>> {
    Ok(axum::Json(
        state
            .store
            .get_customer(&principal.tenant, &external_id)
            .await?,
    ))
}

/// Changes only the fields given (non-null).
#[utoipa::path(put, path = "/api/v1/customers/{externalId}", tag = "customers", request_body = CustomerPatch,
    params(("externalId" = String, Path, description = "The tenant's id for the customer")),
    responses(
        (status = 200, description = "The customer after the change", body = Customer),
        (status = 400, description = "Invalid field", body = ErrorResponse),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
        (status = 404, description = "No such customer", body = ErrorResponse),
    ))]
pub async fn update_customer(
    State(state): State<AppState>,
    principal: Principal,
    PathParam(external_id): PathParam,
    Json(patch): Json<CustomerPatch>,
) -> ApiResult<axum::Json<Customer>> {
    let patch = patch.validate()?;
    Ok(axum::Json(
        state
            .store
            .update_customer(&principal.tenant, &external_id, &patch)
            .await?,
    ))
}

#[utoipa::path(delete, path = "/api/v1/customers/{externalId}", tag = "customers",
    params(("externalId" = String, Path, description = "The tenant's id for the customer")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
        (status = 404, description = "No such customer", body = ErrorResponse),
    ))]
pub async fn delete_customer(
    State(state): State<AppState>,
    principal: Principal,
    PathParam(external_id): PathParam,
) -> ApiResult<StatusCode> {
    state
        .store
        .delete_customer(&principal.tenant, &external_id)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Sets `isActive` to false, which excludes the customer from usage reports.
#[utoipa::path(post, path = "/api/v1/customers/{externalId}/deactivate", tag = "customers",
    params(("externalId" = String, Path, description = "The tenant's id for the customer")),
    responses(
        (status = 400, description = "A body other than none, {} or null (the operation takes none)", body = ErrorResponse),
        (status = 200, description = "The deactivated customer", body = Customer),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
        (status = 404, description = "No such customer", body = ErrorResponse),
    ))]
pub async fn deactivate_customer(
    State(state): State<AppState>,
    principal: Principal,
    PathParam(external_id): PathParam,
    _: NoBody,
) -> ApiResult<axum::Json<Customer>> {
    let patch = CustomerPatch {
        is_active: Some(false),
        ..CustomerPatch::default()
    };
    Ok(axum::Json(
        state
            .store
            .update_customer(&principal.tenant, &external_id, &patch)
            .await?,
    ))
}

/// The period of a usage report: `[from, to)`, by default the 30 days before now.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct UsagePeriod {
    /// Start (inclusive), ISO 8601; default `to` minus 30 days.
    #[param(value_type = Option<String>, format = DateTime)]
    pub from: Option<Timestamp>,
    /// End (exclusive), ISO 8601; default now.
    #[param(value_type = Option<String>, format = DateTime)]
    pub to: Option<Timestamp>,
}

impl UsagePeriod {
    fn resolve(self) -> ApiResult<(Timestamp, Timestamp)> {
        let to = self.to.unwrap_or_else(Timestamp::now);
        let from = self
            .from
            .unwrap_or(Timestamp(to.0 - chrono::Duration::days(DEFAULT_USAGE_DAYS)));
        if from >= to {
            return Err(ApiError::validation("from", "from must be before to"));
        }
        Ok((from, to))
    }
}

/// Credits, request count and cost of one customer in a period (default the last 30 days).
#[utoipa::path(get, path = "/api/v1/customers/{externalId}/usage", tag = "customers",
    params(("externalId" = String, Path, description = "The tenant's id for the customer"), UsagePeriod),
    responses(
        (status = 200, description = "The customer's usage in the period", body = CustomerUsage),
        (status = 400, description = "Invalid period", body = ErrorResponse),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
        (status = 404, description = "No such customer", body = ErrorResponse),
    ))]
pub async fn customer_usage(
    State(state): State<AppState>,
    principal: Principal,
    PathParam(external_id): PathParam,
    Query(period): Query<UsagePeriod>,
) -> ApiResult<axum::Json<CustomerUsage>> {
    let (from, to) = period.resolve()?;
    Ok(axum::Json(
        state
            .store
            .customer_usage(&principal.tenant, &external_id, from, to)
            .await?,
    ))
}

/// Usage of every active customer with requests in a period, most credits first; deactivated
/// customers are left out.
#[utoipa::path(get, path = "/api/v1/customers/usage", tag = "customers", params(UsagePeriod),
    responses(
        (status = 200, description = "Usage per active customer and totals", body = CustomersUsage),
        (status = 400, description = "Invalid period", body = ErrorResponse),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
    ))]
pub async fn customers_usage(
    State(state): State<AppState>,
    principal: Principal,
    Query(period): Query<UsagePeriod>,
) -> ApiResult<axum::Json<CustomersUsage>> {
    let (from, to) = period.resolve()?;
    Ok(axum::Json(
        state
            .store
            .customers_usage(&principal.tenant, from, to)
            .await?,
    ))
}
