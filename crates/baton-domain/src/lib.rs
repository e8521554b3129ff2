//! Baton's domain model.
//!
//! Types every other crate shares: tenant-scoped ids, validated inputs, settings, credits and the
//! secrets format of API keys. Nothing here does I/O, so every rule is unit-testable.

pub mod apikey;
pub mod budget;
pub mod chat;
pub mod credits;
pub mod customer;
pub mod environment;
pub mod error;
pub mod flow;
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzz;
pub mod ids;
pub mod lifecycle;
pub mod logs;
pub mod model;
pub mod origin;
pub mod retention;
pub mod routing;
pub mod run;
pub mod settings;
pub mod tags;
pub mod time;
pub mod tool;
pub mod user;

pub use error::{DomainError, DomainResult};
pub use ids::{TenantId, new_id};
pub use time::Timestamp;
