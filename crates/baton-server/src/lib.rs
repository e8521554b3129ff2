//! The `baton` binary's library half: configuration, start-up and the admin commands, kept here
//! so integration tests start exactly what the binary starts.

pub mod admin;
pub mod config;
pub mod error;
mod log_writer;
mod runtime_thread;
mod serving;
pub mod telemetry;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use baton_api::AppState;
use baton_providers::{Catalogue, ProvidersConfig, Registry};
use baton_store::runs::{RunWriter, WriterOptions};
use baton_store::{Store, StoreOptions};

pub use config::Config;
pub use error::ServerError;

/// After the grace period, how long the serving threads get to drop their connections.
const ABORT_WAIT: Duration = Duration::from_secs(5);

/// At shutdown, how long the runs answered last get to be queued by their tasks (which run
/// right after their replies; a promise is only made while the writer has room).
const PROMISED_RUNS_WAIT: Duration = Duration::from_secs(5);

/// What start-up did on an empty database, for the operator to see once.
#[derive(Debug, Clone)]
pub struct Bootstrap {
    pub tenant_name: String,
    pub tenant_id: String,
    /// `None` when the key came from `BATON_BOOTSTRAP_API_KEY` (the operator knows it).
    pub generated_api_key: Option<String>,
}

/// A built, bound, not yet serving application: `server.threads` listeners on one port, each
/// to be served by a thread of its own (`serving.rs`); the runtime that built it keeps the
/// background work.
pub struct Application {
    /// One per serving thread, all on one port.
    listeners: Vec<std::net::TcpListener>,
    address: SocketAddr,
    router: baton_api::Router,
    store: Store,
    bootstrap: Option<Bootstrap>,
    runs: RunWriter,
    shutdown_grace: Duration,
    state: AppState,
}

/// The catalogue (shipped or the operator's file) and every provider of the configuration.
pub fn build_providers(
    config: &Config,
    providers: &ProvidersConfig,
) -> Result<Registry, ServerError> {
    let catalogue = match &config.catalogue_path {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| {
                ServerError::Config(format!("catalogue_path {}: {e}", path.display()))
            })?;
            Catalogue::from_json(&text).map_err(|e| {
                ServerError::Config(format!("catalogue_path {}: {e}", path.display()))
            })?
        }
        None => Catalogue::shipped().map_err(|e| ServerError::Config(e.to_string()))?,
    };
    Registry::from_config(providers, Arc::new(catalogue))
        .map_err(|e| ServerError::Config(format!("providers: {e}")))
}

/// Opens the database and applies migrations.
pub async fn open_store(config: &Config) -> Result<Store, ServerError> {
    // The pool cannot be built empty (the driver panics on it).
    if config.database.max_connections == 0 {
        return Err(ServerError::Config(
            "database.max_connections must be at least 1".into(),
        ));
    }
    let mut options = StoreOptions::new(config.database_url.clone());
    options.max_connections = config.database.max_connections;
    options.acquire_timeout = Duration::from_secs(config.database.acquire_timeout_secs);
    let store = Store::connect(&options).await?;
    store.migrate().await?;
    Ok(store)
}

impl Application {
    /// Connects, migrates, bootstraps an empty database and binds `config.bind` (port 0 picks a
    /// free port; see [`Application::port`]).
    pub async fn build(config: &Config) -> Result<Application, ServerError> {
        admin::check_bootstrap_key(config.bootstrap_api_key.as_ref())?;
        let store = open_store(config).await?;
        let bootstrap =
            admin::bootstrap_if_empty(&store, config.bootstrap_api_key.as_ref()).await?;
        let providers = Arc::new(build_providers(config, &config.providers_with_env())?);
        let (alerts, alert_queue) = tokio::sync::mpsc::unbounded_channel();
        let metrics = Arc::new(baton_api::metrics::Metrics::new());
        let runs = RunWriter::spawn(
            store.own_connection().await?,
            WriterOptions {
                alerts: Some(alerts),
                observer: Some(metrics.clone()),
                // No thread or connection for a log that is not written.
                idle_lane: if config.invocation_log.enabled {
                    log_writer::spawn_idle_lane(
                        &store,
                        config.invocation_log.writer_priority,
                        config.invocation_log.idle_statement_rows,
                    )
                    .await?
                } else {
                    None
                },
                ..config.invocation_log.writer_options()?
            },
        );
        let state = AppState::build(store.clone(), providers, runs.clone(), config.api_config()?)
            .await?
            .with_metrics(metrics);
        baton_api::budgets::spawn_alert_delivery(state.clone(), alert_queue, config.alert_resend());
        baton_api::budgets::spawn_alert_resend(state.clone(), config.alert_resend());
        if config.retention.cleanup_interval_secs > 0 {
            baton_store::retention::spawn_text_cleanup(
                store.clone(),
                Duration::from_secs(config.retention.cleanup_interval_secs),
                config.retention.cleanup_batch.max(1),
            );
        }
        // Off the request path: the start-up pass runs on the sweep's own task.
        baton_store::abandoned::spawn_abandoned_run_sweep(
            store.clone(),
            config.abandoned_run_age(),
            (config.retention.abandoned_sweep_interval_secs > 0)
                .then(|| Duration::from_secs(config.retention.abandoned_sweep_interval_secs)),
            config.retention.cleanup_batch.max(1),
        );
        let router = baton_api::build_router(state.clone());
        let listeners = serving::bind(config.bind, config.serving_threads())?;
        let address = listeners
            .first()
            .map(std::net::TcpListener::local_addr)
            .transpose()?
            .unwrap_or(config.bind);
        Ok(Application {
            listeners,
            address,
            router,
            store,
            bootstrap,
            runs,
            shutdown_grace: Duration::from_secs(config.server.shutdown_grace_secs),
            state,
        })
    }

    pub fn port(&self) -> u16 {
        self.address.port()
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.address
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn bootstrap(&self) -> Option<&Bootstrap> {
        self.bootstrap.as_ref()
    }

    /// Serves until `shutdown` resolves, then drains in-flight requests (bounded by the grace
    /// period) and closes the database.
    pub async fn run_until(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServerError> {
        let mut threads = serving::spawn(self.listeners, &self.router, &self.state).await?;
        shutdown.await;
        threads.stop();
        let grace = self.shutdown_grace;
        let drained = tokio::time::timeout(grace, threads.drained()).await;
        match drained {
            Ok(result) => result?,
            Err(_) => {
                tracing::warn!("shutdown grace period over; dropping remaining connections");
                // Dropped, their runs are logged as cut short: before the log writer closes.
                self.runs.stopping();
                threads.abort();
                if tokio::time::timeout(ABORT_WAIT, threads.drained())
                    .await
                    .is_err()
                {
                    tracing::error!("serving threads did not drop their connections in time");
                }
            }
        }
        // Requests have drained: write every queued log row before the database closes,
        // with the runs answered last that their tasks queue after the reply.
        if tokio::time::timeout(PROMISED_RUNS_WAIT, self.runs.promised_runs_queued())
            .await
            .is_err()
        {
            tracing::error!("runs answered before shutdown were not queued in time");
        }
        self.runs.close().await;
        self.store.close().await?;
        threads.end().await;
        Ok(())
    }
}

/// Resolves on SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(err) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %err, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(err) => {
                tracing::error!(error = %err, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
    }
    tracing::info!("shutting down");
}
