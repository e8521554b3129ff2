//! `/api/v1/budgets`: spend limits per calendar period for the tenant, a customer or a tag, with
//! webhook alerts and optional hard limits (see `crate::budgets` for enforcement and delivery).

use axum::extract::State;
use axum::http::StatusCode;
use baton_domain::budget::{Budget, BudgetInput, BudgetStatus};
use baton_domain::{TenantId, Timestamp};
use serde::Serialize;
use utoipa::ToSchema;

use crate::auth::Principal;
use crate::error::{ApiError, ApiResult, ErrorResponse};
use crate::extract::{Json, PathParam};
use crate::state::AppState;

/// A created budget, with the key its webhook signatures are made with (shown this once).
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CreatedBudget {
    #[serde(flatten)]
    pub budget: BudgetStatus,
    /// HMAC-SHA256 key of `X-Baton-Signature` (`t=<unix>,v1=<hex of HMAC("<t>.<body>")>`).
    pub webhook_secret: String,
}

async fn status(state: &AppState, tenant: &TenantId, budget: Budget) -> ApiResult<BudgetStatus> {
    let (start, end) = baton_ledger::budget_window(budget.period, Timestamp::now().0);
    let window = state
        .store
        .budget_window(tenant, &budget, Timestamp(start), Timestamp(end))
        .await?;
    Ok(BudgetStatus {
        budget,
        current_period: window,
    })
}

fn new_secret() -> ApiResult<String> {
    let mut bytes = [0u8; 32];
    baton_domain::apikey::random_bytes(&mut bytes)
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    Ok(format!("whsec_{}", hex::encode(bytes)))
}

#[utoipa::path(get, path = "/api/v1/budgets", tag = "budgets",
    responses(
        (status = 200, description = "The tenant's budgets with their current period", body = [BudgetStatus]),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
    ))]
pub async fn list_budgets(
    State(state): State<AppState>,
    principal: Principal,
) -> ApiResult<axum::Json<Vec<BudgetStatus>>> {
    let budgets = state.store.list_budgets(&principal.tenant).await?;
    let mut out = Vec::with_capacity(budgets.len());
    for budget in budgets {
        out.push(status(&state, &principal.tenant, budget).await?);
    }
    Ok(axum::Json(out))
}

#[utoipa::path(post, path = "/api/v1/budgets", tag = "budgets", request_body = BudgetInput,
    responses(
        (status = 201, description = "Created; the webhook secret is shown this once", body = CreatedBudget),
        (status = 400, description = "Invalid field", body = ErrorResponse),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
        (status = 409, description = "A budget with this name exists", body = ErrorResponse),
    ))]
pub async fn create_budget(
    State(state): State<AppState>,
    principal: Principal,
    Json(body): Json<BudgetInput>,
) -> ApiResult<(StatusCode, axum::Json<CreatedBudget>)> {
    let valid = body.validate()?;
    let secret = new_secret()?;
    let budget = state
        .store
        .create_budget(&principal.tenant, &valid, &secret)
        .await?;
    state.forget_budgets(&principal.tenant).await;
    let budget = status(&state, &principal.tenant, budget).await?;
    Ok((
        StatusCode::CREATED,
        axum::Json(CreatedBudget {
            budget,
            webhook_secret: secret,
        }),
    ))
}

#[utoipa::path(get, path = "/api/v1/budgets/{id}", tag = "budgets",
    params(("id" = String, Path, description = "Budget id")),
    responses(
        (status = 200, description = "The budget with its current period", body = BudgetStatus),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
        (status = 404, description = "No such budget", body = ErrorResponse),
    ))]
pub async fn get_budget(
    State(state): State<AppState>,
    principal: Principal,
    PathParam(id): PathParam,
) -> ApiResult<axum::Json<BudgetStatus>> {
    let budget = state.store.get_budget(&principal.tenant, &id).await?;
    Ok(axum::Json(status(&state, &principal.tenant, budget).await?))
}

/// Replaces every field; the spend of the current period is kept.
#[utoipa::path(put, path = "/api/v1/budgets/{id}", tag = "budgets", request_body = BudgetInput,
    params(("id" = String, Path, description = "Budget id")),
    responses(
        (status = 200, description = "The budget after the change", body = BudgetStatus),
        (status = 400, description = "Invalid field", body = ErrorResponse),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
        (status = 404, description = "No such budget", body = ErrorResponse),
        (status = 409, description = "A budget with this name exists", body = ErrorResponse),
    ))]
pub async fn update_budget(
    State(state): State<AppState>,
    principal: Principal,
    PathParam(id): PathParam,
    Json(body): Json<BudgetInput>,
) -> ApiResult<axum::Json<BudgetStatus>> {
    let valid = body.validate()?;
    let budget = state
        .store
        .update_budget(&principal.tenant, &id, &valid)
        .await?;
    state.forget_budgets(&principal.tenant).await;
    Ok(axum::Json(status(&state, &principal.tenant, budget).await?))
}

#[utoipa::path(delete, path = "/api/v1/budgets/{id}", tag = "budgets",
    params(("id" = String, Path, description = "Budget id")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
        (status = 404, description = "No such budget", body = ErrorResponse),
    ))]
pub async fn delete_budget(
    State(state): State<AppState>,
    principal: Principal,
    PathParam(id): PathParam,
) -> ApiResult<StatusCode> {
    state.store.delete_budget(&principal.tenant, &id).await?;
    state.forget_budgets(&principal.tenant).await;
    Ok(StatusCode::NO_CONTENT)
}
