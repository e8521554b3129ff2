//! A named thread running a current-thread runtime of its own: the shape of the serving
//! threads (`serving.rs`) and of the log writer's idle lane (`log_writer.rs`).

use std::future::Future;
use std::io;
use std::thread::JoinHandle;

use tokio::runtime::Handle;
use tokio::sync::oneshot;

/// Starts thread `name`, runs `prepare` on it (thread-local set-up that must come before the
/// runtime, such as a scheduling policy the runtime's own threads should inherit), then runs
/// `body` to completion on a new current-thread runtime. `body` gets the runtime's handle and
/// `started`, on which it reports its start-up; if the runtime cannot be built, `started` gets
/// that error instead. The thread ends when `body` returns.
pub(crate) fn spawn<T, E, Body, Fut>(
    name: String,
    prepare: impl FnOnce() + Send + 'static,
    started: oneshot::Sender<Result<T, E>>,
    body: Body,
) -> io::Result<JoinHandle<()>>
where
    T: Send + 'static,
    E: From<io::Error> + Send + 'static,
    Body: FnOnce(Handle, oneshot::Sender<Result<T, E>>) -> Fut + Send + 'static,
    Fut: Future<Output = ()>,
{
    std::thread::Builder::new().name(name).spawn(move || {
        prepare();
        match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(runtime) => {
                let handle = runtime.handle().clone();
                runtime.block_on(body(handle, started));
            }
            Err(err) => {
                let _ = started.send(Err(err.into()));
            }
        }
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[tokio::test]
    async fn the_body_runs_on_the_named_thread_after_prepare() {
        let (started, started_rx) = oneshot::channel::<io::Result<(String, bool)>>();
        let handle = spawn(
            "baton-test-rt".into(),
            || PREPARED.with(|prepared| prepared.set(true)),
            started,
            |_runtime, started| async move {
                let name = std::thread::current().name().unwrap().to_owned();
                let _ = started.send(Ok((name, PREPARED.with(std::cell::Cell::get))));
            },
        )
        .unwrap();
        let (name, prepared) = started_rx.await.unwrap().unwrap();
        assert_eq!(name, "baton-test-rt");
        assert!(prepared, "prepare ran on the thread before the body");
        handle.join().unwrap();
    }

    thread_local! {
        static PREPARED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }
}
