//! The HTTP side of a flow run with tools: the caller's callback headers. The run itself is
//! `baton_executor::toolrun`.

use axum::http::HeaderMap;

pub use baton_executor::Callback;

use crate::error::{ApiError, ApiResult};

/// Reads a [`Callback`] from the request headers (SPEC.md "Custom request headers").
pub trait CallbackHeaders: Sized {
    fn from_headers(headers: &HeaderMap) -> ApiResult<Self>;
}

impl CallbackHeaders for Callback {
    fn from_headers(headers: &HeaderMap) -> ApiResult<Callback> {
        let text = |name: &'static str| -> ApiResult<Option<String>> {
            headers
                .get(name)
                .map(|v| {
                    v.to_str().map(|s| s.trim().to_string()).map_err(|_| {
                        ApiError::validation(name, format!("{name} must be ASCII text"))
                    })
                })
                .transpose()
        };
        let callback_url = text("X-Baton-Callback-Url")?;
        let debug_url = text("X-Baton-Debug-Url")?;
        let token = text("X-Baton-Callback-Token")?;
        Ok(Callback::from_values(callback_url, debug_url, token)?)
    }
}
