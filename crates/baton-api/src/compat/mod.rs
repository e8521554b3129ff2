//! The OpenAI-compatible wire format of `POST /api/v1/chat/completions`: request parsing and
//! validation into canonical types, and the response and chunk shapes. Field names are the
//! snake_case ones of the OpenAI API, so unmodified OpenAI SDKs work.

pub mod request;
pub mod response;
