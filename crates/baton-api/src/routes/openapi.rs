//! The OpenAPI 3.1 document, generated from the code and served at `/api/v1/openapi.json`.

use std::sync::Arc;

use axum::Extension;
use axum::http::header;
use axum::response::IntoResponse;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::error::{ErrorDetail, ErrorResponse};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Baton",
        description = "Multi-tenant LLM orchestration: one API over seven providers, versioned prompt flows, tool-calling and agent trees, routing and cost tracking.",
    ),
    modifiers(&BearerAuth, &OverloadedResponse),
    security(("bearer" = [])),
    components(schemas(ErrorResponse, ErrorDetail)),
    tags(
        (name = "auth", description = "Login for session tokens"),
        (name = "api-keys", description = "API keys (session tokens only)"),
        (name = "users", description = "Users who log in (session tokens only)"),
        (name = "environments", description = "Named environments"),
        (name = "settings", description = "Tenant settings"),
        (name = "customers", description = "End customers"),
        (name = "models", description = "Model catalogue and providers"),
        (name = "chat", description = "OpenAI-compatible chat completions"),
        (name = "routing", description = "Routing rules: aliases over model chains"),
        (name = "flows", description = "Flows, versions, templates, activation and runs"),
        (name = "runs", description = "Run details"),
        (name = "statistics", description = "Cost, volume and latency reports"),
        (name = "health", description = "Probes"),
    )
)]
pub struct ApiDoc;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                Http::builder()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "An API key (baton_...) or a session token from /api/v1/auth/login",
                    ))
                    .build(),
            ),
        );
    }
}

/// Where every authenticated operation's 503 points.
pub(crate) const OVERLOADED_RESPONSE_REF: &str = "#/components/responses/Overloaded";

/// Load shedding's answer (`overload.rs`), shared by every authenticated operation.
struct OverloadedResponse;

impl Modify for OverloadedResponse {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::schema::{Object, Type};
        use utoipa::openapi::{Content, Header, Ref, ResponseBuilder};

        let response = ResponseBuilder::new()
            .description(
                "Overloaded (`OVERLOADED`): refused before anything ran; retry after `Retry-After` seconds",
            )
            .content(
                "application/json",
                Content::new(Some(Ref::from_schema_name("ErrorResponse"))),
            )
            .header("Retry-After", Header::new(Object::with_type(Type::Integer)))
            .build();
        let components = openapi.components.get_or_insert_with(Default::default);
        components
            .responses
            .insert("Overloaded".into(), response.into());
    }
}

/// The rendered document, made once at start-up.
#[derive(Clone)]
pub struct OpenApiJson(pub Arc<str>);

#[utoipa::path(get, path = "/api/v1/openapi.json", tag = "health", security(()),
    responses((status = 200, description = "This document", content_type = "application/json")))]
pub async fn openapi_json(Extension(doc): Extension<OpenApiJson>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "application/json")],
        doc.0.to_string(),
    )
}
