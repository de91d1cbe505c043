//! The data-access layer: every SQL statement of the product, one file per area, written with
//! `sqlx::query!` and friends so the compiler checks each against the schema (`.sqlx/` holds the
//! offline data; `scripts/sqlx-prepare.sh` regenerates it). Callers get typed functions and named
//! row structs; rules (hashing, validation, error wording) stay with the callers.
//!
//! | file | tables |
//! | --- | --- |
//! | [`accounts`] | `tenants`, `users` |
//! | [`audit`] | `audit_log` (append-only) |
//! | [`billing`] | prices, rating runs, charge lines, invoices, credits (issue 16) |
//! | [`invoicing`] | invoice lists with subtotals, the open month's draft as built now, tiers |
//! | [`periods`] | `period_closes`, `invoice_sources`: billing periods, the runs a draft is built from |
//! | [`keys`] | `api_keys` |
//! | [`bodies`] | `stored_bodies` (opted-in tenants' prompts and completions) |
//! | [`catalog`] | `base_models`, `adapters` (routes, the fleet's price keys) |
//! | [`limits`] | `tenant_limits`, `key_limits` |
//! | [`members`] | a tenant's users and roles, `invitations` |
//! | [`usage`] | `usage_events` (insert, list) |
//! | [`spend`] | billed spend from `usage_events` priced by `base_models` |
//! | [`sessions`] | `portal_sessions` |
//! | [`settings`] | a tenant's settings (`tenants`: display name, body logging) |
//! | [`lifecycle`] | `base_templates`, `graphs`, managed `adapters`, `lifecycle_history` |
//! | [`rollout`] | `graphs` rollouts (spec hash and state), a starting adapter's reason |
//! | [`sleep`] | `graphs` scale-to-zero: activity, wake requests, wakes (with history) |
//! | [`leader`] | advisory locks (one leader per cluster) |
//! | [`dashboard`] | the tenant home's month totals and usable models |
//! | [`reports`] | the usage page (`usage_daily` rollup) and the request log |
//! | [`overview`] | the admin pages' tenant and user lists, tenant status by id |
//! | [`economics`] | `base_costs` (append-only), graph history, tokens and revenue per base and day |
//! | [`replicas`] | `replica_reports` (each replica's journal and shipping, for `/admin/ops`) |
//! | [`roles`] | the connected role's standing (owner, superuser), the application role |
//!
//! This file connects to PostgreSQL and applies migrations. A missing database is created (the
//! embedded default must work on a fresh machine); an unreachable server is an error that names
//! the URL and says what to do, never a panic.

pub mod accounts;
pub mod advisor;
pub mod attribution;
pub mod audit;
pub mod billing;
pub mod bodies;
pub mod catalog;
pub mod dashboard;
pub mod documents;
pub mod economics;
pub mod invoicing;
pub mod keys;
pub mod leader;
pub mod lifecycle;
pub mod limits;
pub mod members;
pub mod overview;
pub mod periods;
pub mod replicas;
pub mod reports;
pub mod roles;
pub mod rollout;
pub mod sessions;
pub mod settings;
pub mod sleep;
pub mod spend;
pub mod usage;

use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, PgPool};

/// The migrations of `migrations/`, embedded in the binary so `tokenfactory migrate` needs no files.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations");

/// Why the database could not be reached, phrased for the person starting the binary.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// The URL does not parse.
    #[error("DATABASE_URL {url} is not a valid PostgreSQL URL: {reason}")]
    BadUrl { url: String, reason: sqlx::Error },
    /// The server did not answer or refused us.
    #[error(
        "cannot reach PostgreSQL at {url}: {reason}. Start PostgreSQL or set DATABASE_URL (or --database-url) to a reachable server"
    )]
    Unreachable { url: String, reason: sqlx::Error },
    /// A migration failed.
    #[error("migrating {url} failed: {reason}")]
    Migrate {
        url: String,
        reason: sqlx::migrate::MigrateError,
    },
}

/// Strips the password from a URL so it can be shown in errors and logs.
pub fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{}{}:*****{}", &url[..scheme + 3], user, &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

/// Connects a pool to `url`, creating the database first if it does not exist.
pub async fn connect(url: &str, max_connections: u32) -> Result<PgPool, DbError> {
    let shown = redact_url(url);
    let options = PgConnectOptions::from_str(url).map_err(|reason| DbError::BadUrl {
        url: shown.clone(),
        reason,
    })?;
    create_database_if_missing(&options)
        .await
        .map_err(|reason| DbError::Unreachable {
            url: shown.clone(),
            reason,
        })?;
    PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(5))
        .connect_with(options)
        .await
        .map_err(|reason| DbError::Unreachable { url: shown, reason })
}

/// Applies pending migrations.
pub async fn migrate(pool: &PgPool, url: &str) -> Result<(), DbError> {
    MIGRATOR.run(pool).await.map_err(|reason| DbError::Migrate {
        url: redact_url(url),
        reason,
    })
}

async fn create_database_if_missing(options: &PgConnectOptions) -> Result<(), sqlx::Error> {
    let Some(name) = options.get_database().map(str::to_owned) else {
        return Ok(());
    };
    let maintenance = options
        .clone()
        .database("postgres")
        .log_statements(tracing::log::LevelFilter::Trace);
    let mut conn = tokio::time::timeout(Duration::from_secs(5), maintenance.connect())
        .await
        .map_err(|_| sqlx::Error::PoolTimedOut)??;
    let exists = sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1) AS "exists!""#,
        name
    )
    .fetch_one(&mut conn)
    .await?;
    if !exists {
        // An identifier cannot be a bind parameter: the name is quoted here instead.
        let mut create = sqlx::QueryBuilder::<sqlx::Postgres>::new("CREATE DATABASE ");
        create.push(format!("\"{}\"", name.replace('"', "\"\"")));
        // A concurrent creator may win the race; that is fine.
        if let Err(e) = create.build().execute(&mut conn).await {
            let duplicate = e
                .as_database_error()
                .and_then(|d| d.code())
                .is_some_and(|c| c == "42P04" || c == "23505");
            if !duplicate {
                return Err(e);
            }
        }
    }
    conn.close().await
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn redacts_password_only() {
        assert_eq!(
            redact_url("postgres://u:secret@h:5432/db"),
            "postgres://u:*****@h:5432/db"
        );
        assert_eq!(
            redact_url("postgres://postgres@127.0.0.1/db"),
            "postgres://postgres@127.0.0.1/db"
        );
    }
}
