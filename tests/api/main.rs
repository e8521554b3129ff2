//! Integration tests: the real server on a random port, spoken to over HTTP. One binary with
//! modules, to link once. The database is SQLite unless `BATON_TEST_DATABASE_URL` names a
//! PostgreSQL server, in which case every test gets a database of its own.

// The whole binary is test code: panicking on a broken expectation is the point.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod helpers;

mod agents;
mod auth;
mod budgets;
mod chat;
mod cli;
mod conformance;
mod cross_tenant;
mod customers;
mod environments;
mod faults;
mod flows;
mod health;
mod limits;
mod llm_logs;
mod mcp_server;
mod openapi;
mod overload;
mod python_mcp;
mod python_sdk;
mod refusals;
mod retention;
mod routing;
mod secrets;
mod serving;
mod settings;
mod statistics;
mod tools;
mod users;
mod validation;
mod vendor_tools;
