//! `baton`: the Baton server and its admin commands.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use baton_server::config::Config;
use baton_server::{Application, ServerError, admin, open_store, shutdown_signal, telemetry};
use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "baton",
    version,
    about = "Baton: multi-tenant LLM orchestration service"
)]
struct Cli {
    /// Configuration file (default: ./baton.toml if present). BATON_* variables override it.
    #[arg(long, global = true, value_name = "PATH")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the HTTP service (migrations are applied first).
    Serve {
        /// Address to listen on (default 127.0.0.1:8080).
        #[arg(long, value_name = "ADDR")]
        bind: Option<SocketAddr>,
    },
    /// Apply database migrations and exit.
    Migrate,
    /// Manage tenants.
    Tenant {
        #[command(subcommand)]
        command: TenantCommand,
    },
    /// Manage API keys.
    Key {
        #[command(subcommand)]
        command: KeyCommand,
    },
    /// Manage users who log in to the UI.
    User {
        #[command(subcommand)]
        command: UserCommand,
    },
}

#[derive(Debug, Subcommand)]
enum TenantCommand {
    /// Create a tenant and print its id and first API key.
    Create {
        /// The tenant's name (unique).
        #[arg(long)]
        name: String,
        /// Print {"tenantId", "name", "apiKey"} as JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
enum KeyCommand {
    /// Create an API key for a tenant and print it (shown once).
    Create {
        /// Tenant name.
        #[arg(long)]
        tenant: String,
        /// Label shown in key lists.
        #[arg(long, default_value = "cli")]
        name: String,
        /// Print {"tenantId", "name" (the tenant's), "apiKey"} as JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
enum UserCommand {
    /// Create a user who can log in with email and password.
    Create {
        /// The tenant's name.
        #[arg(long)]
        tenant: String,
        /// Login email (unique across tenants).
        #[arg(long)]
        email: String,
        /// 8 to 1024 characters.
        #[arg(long)]
        password: String,
    },
}

/// jemalloc, not the system allocator: less CPU per request under many threads
/// (docs/performance.md "Allocator"); its options are set where it is built
/// (`.cargo/config.toml`, `JEMALLOC_SYS_WITH_MALLOC_CONF`).
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let mut config = match Config::load(cli.config.as_deref()) {
        Ok(config) => config,
        Err(err) => return fail(&err),
    };
    if let Command::Serve { bind: Some(bind) } = &cli.command {
        config.bind = *bind;
    }
    let _log_guard = telemetry::init(config.log_format);
    // Single-threaded: `serve` starts a runtime per further serving thread itself
    // (`server.threads`, thread per core); the admin commands need no more.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => return fail(&ServerError::Io(err)),
    };
    match runtime.block_on(run(cli.command, &config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => fail(&err),
    }
}

fn fail(err: &ServerError) -> ExitCode {
    eprintln!("error: {err}");
    ExitCode::FAILURE
}

// The CLI's output is its interface; printing is the point.
#[allow(clippy::print_stdout)]
async fn run(command: Command, config: &Config) -> Result<(), ServerError> {
    match command {
        Command::Serve { .. } => {
            let app = Application::build(config).await?;
            if let Some(bootstrap) = app.bootstrap() {
                println!(
                    "Created tenant '{}' ({}).",
                    bootstrap.tenant_name, bootstrap.tenant_id
                );
                match &bootstrap.generated_api_key {
                    Some(key) => println!("Its API key, shown only this once:\n\n    {key}\n"),
                    None => println!("Its API key is the one in BATON_BOOTSTRAP_API_KEY."),
                }
            }
            tracing::info!(address = %app.local_addr(), database = %baton_store::redact_url(&config.database_url), "Baton is listening");
            app.run_until(shutdown_signal()).await
        }
        Command::Migrate => {
            let store = open_store(config).await?;
            store.close().await?;
            println!("Migrations applied.");
            Ok(())
        }
        Command::Tenant {
            command: TenantCommand::Create { name, json },
        } => {
            let store = open_store(config).await?;
            let (tenant, key) = admin::create_tenant(&store, &name).await?;
            if json {
                println!(
                    "{}",
                    serde_json::json!({"tenantId": tenant.id, "name": tenant.name, "apiKey": key})
                );
            } else {
                println!(
                    "Tenant '{}' created with id {}.\nAPI key (shown once): {key}",
                    tenant.name, tenant.id
                );
            }
            Ok(())
        }
        Command::Key {
            command: KeyCommand::Create { tenant, name, json },
        } => {
            let store = open_store(config).await?;
            let (tenant, key) = admin::create_key(&store, &tenant, &name).await?;
            if json {
                println!(
                    "{}",
                    serde_json::json!({"tenantId": tenant.id, "name": tenant.name, "apiKey": key})
                );
            } else {
                println!("API key for tenant '{}' (shown once): {key}", tenant.name);
            }
            Ok(())
        }
        Command::User {
            command:
                UserCommand::Create {
                    tenant,
                    email,
                    password,
                },
        } => {
            let store = open_store(config).await?;
            let user = admin::create_user(&store, &tenant, &email, &password).await?;
            println!(
                "User {} created in tenant '{tenant}' with id {}.",
                user.email, user.id
            );
            Ok(())
        }
    }
}
