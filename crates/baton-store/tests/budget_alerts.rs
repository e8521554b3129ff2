//! Budget alerts no process sent, or whose delivery round failed: leased to one sender at a
//! time, and only while unsent or due (SQLite by default; PostgreSQL with
//! `BATON_TEST_DATABASE_URL=postgres://...`).

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use baton_domain::budget::Budget;
use baton_domain::run::{RunKind, RunRecord, RunStatus};
use baton_domain::{TenantId, Timestamp};
use baton_store::Store;
use baton_store::budgets::BudgetAlert;

mod support;
use support::{database, monthly_budget};

const LIMIT: i64 = 1_000_000;

async fn budget(store: &Store, tenant: &TenantId) -> Budget {
    monthly_budget(store, tenant, LIMIT, |b| {
        b.alert_thresholds_percent = Some(vec![50, 80, 100]);
        b.webhook_url = Some("https://hooks.example.com/budget".into());
    })
    .await
}

/// Writes a finished run costing `credits`: the alerts it reaches, as the log writer gets them.
async fn spend(store: &Store, tenant: &TenantId, id: &str, credits: i64) -> Vec<BudgetAlert> {
    spend_tagged(store, tenant, id, credits, &[]).await
}

/// [`spend`] by a run carrying `tags`.
async fn spend_tagged(
    store: &Store,
    tenant: &TenantId,
    id: &str,
    credits: i64,
    tags: &[&str],
) -> Vec<BudgetAlert> {
    let mut record = RunRecord::pending(
        id.to_string(),
        tenant.clone(),
        RunKind::Chat,
        "openai/gpt-4o-mini".into(),
    );
    record.status = RunStatus::Succeeded;
    record.cost_credits = credits;
    record.tags = tags.iter().map(|tag| tag.to_string()).collect();
    record.completed_at = Some(Timestamp::now());
    store.write_runs(&[record], &[]).await.unwrap()
}

fn at(offset: Duration, later: bool) -> Timestamp {
    let offset = chrono::Duration::from_std(offset).unwrap();
    let now = chrono::Utc::now();
    Timestamp(if later { now + offset } else { now - offset })
}

const MINUTE: Duration = Duration::from_secs(60);

/// Leases what is unsent at `now`, counting alerts recorded up to a second from now.
async fn lease(store: &Store, now: Timestamp) -> Vec<BudgetAlert> {
    let until = Timestamp(now.0 + chrono::Duration::minutes(2));
    let recorded_before = at(Duration::from_secs(1), true);
    store
        .lease_unsent_alerts(recorded_before, now, until, 100)
        .await
        .unwrap()
        .0
}

/// Leases what is due another round at `now`.
async fn retries(store: &Store, now: Timestamp) -> Vec<BudgetAlert> {
    let until = Timestamp(now.0 + chrono::Duration::minutes(2));
    store
        .lease_due_alert_retries(now, until, 100)
        .await
        .unwrap()
        .0
}

/// Records `alert`'s delivery outcome, then checks no sweep takes it up again, even once every
/// lease has run out.
async fn assert_finished(store: &Store, alert: &BudgetAlert, attempts: u32, error: Option<&str>) {
    store
        .record_alert_delivery(alert, attempts, error, None)
        .await
        .unwrap();
    let much_later = at(Duration::from_secs(600), true);
    assert!(lease(store, much_later).await.is_empty(), "{alert:?}");
    assert!(retries(store, much_later).await.is_empty(), "{alert:?}");
}

#[tokio::test]
async fn an_unsent_alert_is_leased_once_and_never_after_it_was_sent_or_gave_up() {
    let db = database("alert_leases").await;
    let store = &db.store;
    let tenant = store.create_tenant("t").await.unwrap().id;
    let other = store.create_tenant("u").await.unwrap().id;
    budget(store, &tenant).await;
    budget(store, &other).await;
    let reached = spend(store, &tenant, "run-1", LIMIT * 6 / 10).await;
    assert_eq!(reached.len(), 1, "{reached:?}");
    assert_eq!(reached[0].threshold_percent, 50);

    // Younger than the age asked for: its own process may still be sending it.
    let (young, seen) = store
        .lease_unsent_alerts(at(MINUTE, false), Timestamp::now(), at(MINUTE, true), 100)
        .await
        .unwrap();
    assert_eq!((young.len(), seen), (0, 0));

    // Leased as it was recorded (the tenant's, not another's), then held.
    assert_eq!(lease(store, Timestamp::now()).await, reached);
    assert!(lease(store, Timestamp::now()).await.is_empty(), "held");
    // The lease ran out (the sender stopped too): leased again.
    let expired = at(Duration::from_secs(180), true);
    assert_eq!(lease(store, expired).await, reached);

    // Sent: never again, whoever asks.
    assert_finished(store, &reached[0], 1, None).await;

    // Five failed attempts and no round left: it stays failed, not resent.
    let failed = spend(store, &tenant, "run-2", LIMIT * 3 / 10).await;
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].threshold_percent, 80);
    assert_finished(store, &failed[0], 5, Some("the webhook answered 500")).await;

    // Nothing to send to (a budget without a webhook): recorded so, not taken up again.
    let nowhere = spend(store, &tenant, "run-4", LIMIT / 10).await;
    assert_eq!(nowhere.len(), 1);
    assert_eq!(nowhere[0].threshold_percent, 100);
    assert_finished(store, &nowhere[0], 0, Some("the budget has no webhook URL")).await;

    // Another tenant's alert is its own.
    let theirs = spend(store, &other, "run-3", LIMIT).await;
    assert_eq!(theirs.len(), 3);
    let mut leased = lease(store, Timestamp::now()).await;
    leased.sort_by_key(|a| a.threshold_percent);
    assert_eq!(leased, theirs);
    assert!(leased.iter().all(|a| a.tenant == other));
    db.drop_database().await;
}

#[tokio::test]
async fn concurrent_sweeps_lease_each_alert_once() {
    let db = database("alert_sweeps").await;
    let store = &db.store;
    let tenant = store.create_tenant("t").await.unwrap().id;
    budget(store, &tenant).await;
    assert_eq!(spend(store, &tenant, "run-1", LIMIT).await.len(), 3);
    let now = Timestamp::now();
    let until = at(Duration::from_secs(120), true);
    let before = at(Duration::from_secs(1), true);
    // Batches of one: the sweeps go on while they see a full batch.
    let sweep = || async {
        let mut mine = Vec::new();
        loop {
            let (leased, seen) = store
                .lease_unsent_alerts(before, now, until, 1)
                .await
                .unwrap();
            mine.extend(leased);
            if seen < 1 {
                return mine;
            }
        }
    };
    let (a, b) = tokio::join!(sweep(), sweep());
    let mut all: Vec<u32> = a.iter().chain(&b).map(|x| x.threshold_percent).collect();
    all.sort_unstable();
    assert_eq!(all, [50, 80, 100], "each alert leased by one sweep");
    db.drop_database().await;
}

#[tokio::test]
async fn a_failed_round_is_leased_again_once_it_is_due_and_never_after_it_was_sent() {
    let db = database("alert_retries").await;
    let store = &db.store;
    let tenant = store.create_tenant("t").await.unwrap().id;
    budget(store, &tenant).await;
    let reached = spend(store, &tenant, "run-1", LIMIT * 6 / 10).await;
    assert_eq!(reached.len(), 1, "{reached:?}");
    let alert = &reached[0];
    assert_eq!(alert.attempts, 0);

    // Its process's round failed; the next is due in five minutes.
    let due = at(Duration::from_secs(300), true);
    store
        .record_alert_delivery(alert, 5, Some("the webhook answered 503"), Some(due))
        .await
        .unwrap();
    assert!(
        retries(store, Timestamp::now()).await.is_empty(),
        "not due yet"
    );
    assert!(lease(store, due).await.is_empty(), "attempted: not unsent");

    // Due: leased once, with the attempts made so far, and held.
    let past_due = at(Duration::from_secs(301), true);
    let leased = retries(store, past_due).await;
    let expected = BudgetAlert {
        attempts: 5,
        ..alert.clone()
    };
    assert_eq!(leased, [expected]);
    assert!(retries(store, past_due).await.is_empty(), "held");

    // That round failed too: due again later, and leased with ten attempts made.
    let later = at(Duration::from_secs(900), true);
    store
        .record_alert_delivery(&leased[0], 10, Some("timed out"), Some(later))
        .await
        .unwrap();
    let past_later = at(Duration::from_secs(1000), true);
    let again = retries(store, past_later).await;
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].attempts, 10);

    // The third round got through on its first attempt: never again, whoever asks.
    let much_later = at(Duration::from_secs(3600), true);
    store
        .record_alert_delivery(&again[0], 11, None, None)
        .await
        .unwrap();
    assert!(
        retries(store, much_later).await.is_empty(),
        "sent: never again"
    );
    assert!(lease(store, much_later).await.is_empty());
    db.drop_database().await;
}

/// A budget given another scope starts a period of its own, even one that begins at the same
/// instant as the old one (here the same month; also a month's first day made a Day budget):
/// a threshold the new scope has reached is alerted again, not taken as sent.
#[tokio::test]
async fn a_rescoped_budget_alerts_the_thresholds_its_new_scope_has_reached() {
    let db = database("alert_rescoped").await;
    let store = &db.store;
    let tenant = store.create_tenant("t").await.unwrap().id;
    let tagged = |tag: &str| {
        let tag = tag.to_string();
        move |b: &mut baton_domain::budget::BudgetInput| {
            b.alert_thresholds_percent = Some(vec![100]);
            b.webhook_url = Some("https://hooks.example.com/budget".into());
            b.tag = Some(tag);
        }
    };
    let budget = monthly_budget(store, &tenant, LIMIT, tagged("Proj:a")).await;
    for (id, tag) in [("run-a", "Proj:a"), ("run-b", "Proj:b")] {
        spend_tagged(store, &tenant, id, LIMIT, &[tag]).await;
    }
    let first = lease(store, Timestamp::now()).await;
    assert_eq!(first.len(), 1, "Proj:a reached its limit: {first:?}");
    assert_finished(store, &first[0], 1, None).await;

    let mut input = baton_domain::budget::BudgetInput {
        name: "all".into(),
        period: "month".into(),
        limit_credits: LIMIT,
        alert_thresholds_percent: None,
        webhook_url: None,
        hard_limit: false,
        customer_id: None,
        tag: None,
    };
    tagged("Proj:b")(&mut input);
    let rescoped = store
        .update_budget(&tenant, &budget.id, &input.clone().validate().unwrap())
        .await
        .unwrap();
    assert_eq!(rescoped.tag.as_deref(), Some("Proj:b"));
    let again = lease(store, Timestamp::now()).await;
    assert_eq!(again.len(), 1, "Proj:b's spend reached it too: {again:?}");
    assert_eq!(again[0].threshold_percent, 100);

    // The same scope again (only the name changed): nothing new to alert.
    assert_finished(store, &again[0], 1, None).await;
    input.name = "renamed".into();
    store
        .update_budget(&tenant, &budget.id, &input.validate().unwrap())
        .await
        .unwrap();
    assert!(lease(store, Timestamp::now()).await.is_empty());
    db.drop_database().await;
}
