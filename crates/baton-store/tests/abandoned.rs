//! The abandoned-run sweep against a real database (SQLite by default; PostgreSQL with
//! `BATON_TEST_DATABASE_URL=postgres://...`).

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use baton_domain::budget::{Budget, BudgetHold};
use baton_domain::run::{RunKind, RunRecord, RunStatus};
use baton_domain::{TenantId, Timestamp};
use baton_store::Store;
use baton_store::abandoned::RUN_ABANDONED;

mod support;
use support::{database, monthly_budget};

const HOUR: Duration = Duration::from_secs(3600);
const WINDOW_START_MS: i64 = 1_767_225_600_000;

async fn budget(store: &Store, tenant: &TenantId) -> Budget {
    monthly_budget(store, tenant, 1_000_000, |b| b.hard_limit = true).await
}

fn hold(budget: &Budget, credits: i64) -> BudgetHold {
    BudgetHold {
        budget_id: budget.id.clone(),
        window_start_ms: WINDOW_START_MS,
        credits,
    }
}

async fn reserved(store: &Store, tenant: &TenantId, budget: &Budget) -> i64 {
    let start = Timestamp(chrono::DateTime::from_timestamp_millis(WINDOW_START_MS).unwrap());
    store
        .budget_window(tenant, budget, start, start)
        .await
        .unwrap()
        .reserved_credits
}

/// A `Pending` row written `age` ago carrying `holds` (taken on the budget first).
async fn pending_run(
    store: &Store,
    tenant: &TenantId,
    budget: &Budget,
    id: &str,
    age: Duration,
    credits: i64,
) -> RunRecord {
    let mut record = RunRecord::pending(
        id.to_string(),
        tenant.clone(),
        RunKind::Flow,
        "openai/gpt-4o-mini".into(),
    );
    let started = chrono::Utc::now() - chrono::Duration::from_std(age).unwrap();
    record.created_at = Timestamp(started);
    let held = hold(budget, credits);
    assert!(store.hold_budget(tenant, budget, &held).await.unwrap());
    record.budget_holds = vec![held];
    store.write_runs(&[record.clone()], &[]).await.unwrap();
    record
}

#[tokio::test]
async fn abandoned_runs_are_failed_once_with_their_holds_given_back() {
    let db = database("abandoned").await;
    let store = &db.store;
    let tenant = store.create_tenant("t").await.unwrap().id;
    let budget = budget(store, &tenant).await;
    let old = pending_run(store, &tenant, &budget, "run-old", 2 * HOUR, 100).await;
    pending_run(store, &tenant, &budget, "run-live", Duration::ZERO, 50).await;
    assert_eq!(reserved(store, &tenant, &budget).await, 150);

    assert_eq!(store.finish_abandoned_runs(HOUR, 500).await.unwrap(), 1);
    let run = store.get_run(&tenant, "run-old").await.unwrap();
    assert_eq!(run.status, RunStatus::Failed);
    assert_eq!(run.error_code.as_deref(), Some(RUN_ABANDONED));
    assert!(run.error_message.is_some());
    assert!(run.completed_at.is_some());
    let live = store.get_run(&tenant, "run-live").await.unwrap();
    assert_eq!(
        live.status,
        RunStatus::Pending,
        "a run younger than the cut-off stays"
    );
    assert_eq!(reserved(store, &tenant, &budget).await, 50);

    // Idempotent: a second pass (another instance, or the next tick) finds nothing.
    assert_eq!(store.finish_abandoned_runs(HOUR, 500).await.unwrap(), 0);
    assert_eq!(reserved(store, &tenant, &budget).await, 50);

    // The original process's final row arrives late (its writer retried through an outage):
    // the real outcome replaces the sweep's, and the holds are not given back a second time.
    let mut late = old.clone();
    late.status = RunStatus::Succeeded;
    late.completed_at = Some(Timestamp::now());
    store.write_runs(&[late], &[]).await.unwrap();
    assert_eq!(
        store.get_run(&tenant, "run-old").await.unwrap().status,
        RunStatus::Succeeded
    );
    assert_eq!(reserved(store, &tenant, &budget).await, 50);
    db.drop_database().await;
}

#[tokio::test]
async fn abandoned_runs_are_swept_in_batches_and_by_concurrent_sweepers_once() {
    let db = database("batches").await;
    let store = &db.store;
    let tenant = store.create_tenant("t").await.unwrap().id;
    let budget = budget(store, &tenant).await;
    for i in 0..7 {
        pending_run(store, &tenant, &budget, &format!("run-{i}"), 2 * HOUR, 10).await;
    }
    assert_eq!(reserved(store, &tenant, &budget).await, 70);
    // Two sweepers at once, batches of 2: every run finished exactly once between them.
    let (a, b) = tokio::join!(
        store.finish_abandoned_runs(HOUR, 2),
        store.finish_abandoned_runs(HOUR, 2)
    );
    assert_eq!(a.unwrap() + b.unwrap(), 7);
    assert_eq!(reserved(store, &tenant, &budget).await, 0);
    let runs = store.list_runs(&tenant).await.unwrap();
    assert_eq!(runs.len(), 7);
    assert!(
        runs.iter().all(
            |r| r.status == RunStatus::Failed && r.error_code.as_deref() == Some(RUN_ABANDONED)
        )
    );
    db.drop_database().await;
}

/// Regression: the hard-limit check was custom SQL whose `$1` named, on SQLite, the statement's
/// first parameter (the hold's credits), so once a period carried a hold the next was refused.
#[tokio::test]
async fn a_budget_period_takes_several_holds_up_to_its_limit() {
    let db = database("holds").await;
    let store = &db.store;
    let tenant = store.create_tenant("t").await.unwrap().id;
    let budget = budget(store, &tenant).await;
    for (credits, total) in [(100, 100), (50, 150), (10, 160)] {
        assert!(
            store
                .hold_budget(&tenant, &budget, &hold(&budget, credits))
                .await
                .unwrap()
        );
        assert_eq!(reserved(store, &tenant, &budget).await, total);
    }
    assert!(
        store
            .hold_budget(&tenant, &budget, &hold(&budget, 999_840))
            .await
            .unwrap()
    );
    assert!(
        !store
            .hold_budget(&tenant, &budget, &hold(&budget, 1))
            .await
            .unwrap(),
        "no room left: refused"
    );
    store
        .release_budget_holds(&tenant, &[hold(&budget, 999_840)])
        .await
        .unwrap();
    assert_eq!(reserved(store, &tenant, &budget).await, 160);
    store
        .release_budget_holds(&tenant, &[hold(&budget, 1_000)])
        .await
        .unwrap();
    assert_eq!(
        reserved(store, &tenant, &budget).await,
        0,
        "never below zero"
    );
    db.drop_database().await;
}
