//! The invocation-log writer's idle lane ([`IdleLane`]): a thread with a runtime and a database
//! connection of its own, at idle scheduling priority on Linux, where the writer sends its
//! batches while it keeps up, so a batch being encoded and committed never holds a CPU a request
//! is waiting for.
//!
//! Under the kernel's EEVDF scheduler a running thread keeps its CPU for the rest of its time
//! slice (about a millisecond here) when a request's thread wakes, unless the running one is
//! `SCHED_IDLE`; the writer's commits were the concurrency-1 tail with logging on
//! (docs/performance.md, "The log writer at idle priority"). When the machine is saturated the
//! idle thread would starve and the queue fill, so the writer then writes on its own runtime
//! (the store's `Lanes`).
//!
//! The lane's connection is opened from its thread, so SQLite's worker thread for it (sqlx
//! starts one per connection) inherits the policy.

use baton_store::Store;
use baton_store::runs::IdleLane;
use tokio::sync::oneshot;

use crate::ServerError;
use crate::config::WriterPriority;
use crate::runtime_thread;

/// Starts the idle lane's thread (none for [`WriterPriority::Normal`]). The thread ends when the
/// writer drops the lane.
///
/// On PostgreSQL the lane writes `statement_rows` rows a statement at most: the database
/// server's process is not at idle priority, so the lane keeps each of its bursts short.
pub(crate) async fn spawn_idle_lane(
    store: &Store,
    priority: WriterPriority,
    statement_rows: usize,
) -> Result<Option<IdleLane>, ServerError> {
    if priority == WriterPriority::Normal {
        return Ok(None);
    }
    let (started, started_rx) = oneshot::channel::<Result<IdleLane, ServerError>>();
    let (alive, ended) = oneshot::channel::<()>();
    let store = store.clone();
    runtime_thread::spawn(
        "baton-log-idle".into(),
        lower_to_idle,
        started,
        move |handle, started| async move {
            match store.own_connection().await {
                Ok(own) => {
                    let own = own.with_array_statement_rows(statement_rows);
                    let _ = started.send(Ok(IdleLane::new(handle, own, alive)));
                    // Until the lane is dropped (its `alive` sender with it).
                    let _ = ended.await;
                }
                Err(err) => {
                    let _ = started.send(Err(err.into()));
                }
            }
        },
    )?;
    let lane = started_rx
        .await
        .map_err(|_| ServerError::Other("the log writer's idle thread ended at start".into()))??;
    Ok(Some(lane))
}

#[cfg(target_os = "linux")]
fn lower_to_idle() {
    use thread_priority::{
        NormalThreadSchedulePolicy, ThreadPriority, ThreadSchedulePolicy,
        set_thread_priority_and_policy, thread_native_id, thread_schedule_policy,
    };
    let idle = ThreadSchedulePolicy::Normal(NormalThreadSchedulePolicy::Idle);
    let result = set_thread_priority_and_policy(thread_native_id(), ThreadPriority::Min, idle);
    // The crate also resets the nice value, which fails in a process started under `nice`
    // after the policy itself has changed: the policy is what matters.
    if result.is_err() && thread_schedule_policy().ok() != Some(idle) {
        tracing::warn!(
            error = ?result,
            "could not put the log writer's idle lane at idle priority; it runs at normal priority"
        );
    }
}

#[cfg(not(target_os = "linux"))]
fn lower_to_idle() {}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    #![allow(clippy::unwrap_used)]

    use baton_store::StoreOptions;

    use super::*;

    /// `(thread name, scheduling policy number)` of this process's threads (`SCHED_IDLE` is 5).
    fn thread_policies() -> Vec<(String, u32)> {
        let mut threads = Vec::new();
        for task in std::fs::read_dir("/proc/self/task").unwrap() {
            let path = task.unwrap().path();
            let (Ok(name), Ok(sched)) = (
                std::fs::read_to_string(path.join("comm")),
                std::fs::read_to_string(path.join("sched")),
            ) else {
                continue; // the thread ended meanwhile
            };
            let policy = sched
                .lines()
                .find_map(|line| line.strip_prefix("policy"))
                .and_then(|rest| rest.trim_start_matches([' ', ':']).trim().parse().ok())
                .unwrap();
            threads.push((name.trim().to_owned(), policy));
        }
        threads
    }

    #[tokio::test]
    async fn the_idle_lane_and_its_sqlite_worker_run_at_idle_priority_with_short_statements() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("lane.db").display());
        let store = Store::connect(&StoreOptions::new(url)).await.unwrap();
        let before = thread_policies();
        assert!(before.iter().all(|(_, policy)| *policy != 5), "{before:?}");

        let lane = spawn_idle_lane(&store, WriterPriority::Idle, 7)
            .await
            .unwrap()
            .expect("a lane");
        // (One test: another spawning a lane meanwhile would break the check of `before`.)
        assert_eq!(lane.store().array_statement_rows(), 7);
        // The shared store, which the writer's own lane uses, keeps whole statements.
        assert_eq!(
            store.array_statement_rows(),
            baton_store::ARRAY_ROWS_PER_STATEMENT
        );
        let during = thread_policies();
        let idle: Vec<&str> = during
            .iter()
            .filter(|(_, policy)| *policy == 5)
            .map(|(name, _)| name.as_str())
            .collect();
        assert!(idle.contains(&"baton-log-idle"), "{during:?}");
        // The lane's own connection was opened on its thread: its SQLite worker inherited.
        assert!(
            idle.iter().any(|name| name.starts_with("sqlx-sqlite-wor")),
            "{during:?}"
        );
        drop(lane);

        assert!(
            spawn_idle_lane(&store, WriterPriority::Normal, 32)
                .await
                .unwrap()
                .is_none()
        );
    }
}
