//! Probes for the orchestrator, outside `/v1` and without authentication: `GET /healthz` says the
//! process is alive and serving HTTP (no I/O at all, so a slow database never restarts a healthy
//! pod), `GET /readyz` says this replica can take traffic: PostgreSQL answers and holds every
//! migration this binary embeds, with the checksum it embeds. Redis is reported in the body but
//! never makes the replica unready: the gateway serves on per-replica limits without it.
//!
//! Cheap under a probe storm: one PostgreSQL check at a time (single flight), its verdict reused
//! for [`FRESH_FOR`], and bounded by [`CHECK_TIMEOUT`], so a hung database gives a prompt 503
//! rather than piling up probes on the pool.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;
use sqlx::migrate::Migrate;
use sqlx::PgPool;
use tf_core::redis_slot::RedisSlot;
use tokio::sync::Mutex;

/// How long one PostgreSQL verdict is reused by later probes.
pub const FRESH_FOR: Duration = Duration::from_secs(1);
/// The longest a readiness check waits for PostgreSQL (pool acquire and query).
pub const CHECK_TIMEOUT: Duration = Duration::from_millis(1500);

/// What `/readyz` found in PostgreSQL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DbState {
    /// Reachable, and every embedded migration is applied with its checksum.
    Current {
        /// Applied migrations this binary does not know (a newer replica ran them during a
        /// rollout); reported, not a failure: migrations expand before they contract, so an
        /// older replica keeps working on the newer schema.
        newer: usize,
    },
    /// Reachable, but migrations this binary needs are missing or differ.
    Behind {
        missing: Vec<i64>,
        changed: Vec<i64>,
    },
    /// Did not answer within [`CHECK_TIMEOUT`], or failed.
    Unreachable(String),
}

/// The readiness checker, shared by every probe of this replica.
#[derive(Clone)]
pub struct Health {
    pool: PgPool,
    redis: RedisSlot,
    last: Arc<Mutex<Option<(Instant, DbState)>>>,
}

impl Health {
    pub fn new(pool: PgPool, redis: RedisSlot) -> Self {
        Self {
            pool,
            redis,
            last: Arc::new(Mutex::new(None)),
        }
    }

    /// The database's state, checked at most once per [`FRESH_FOR`]; concurrent callers wait for
    /// the one check in flight instead of starting their own.
    pub async fn database(&self) -> DbState {
        let mut last = self.last.lock().await;
        if let Some((at, state)) = last.as_ref() {
            if at.elapsed() < FRESH_FOR {
                return state.clone();
            }
        }
        let state = match tokio::time::timeout(CHECK_TIMEOUT, check(&self.pool)).await {
            Ok(Ok(state)) => state,
            Ok(Err(e)) => DbState::Unreachable(e.to_string()),
            Err(_) => {
                DbState::Unreachable(format!("no answer within {} ms", CHECK_TIMEOUT.as_millis()))
            }
        };
        *last = Some((Instant::now(), state.clone()));
        state
    }
}

/// Compares the applied migrations with the ones embedded in the binary.
async fn check(pool: &PgPool) -> Result<DbState, sqlx::Error> {
    let mut conn = pool.acquire().await?;
    let migrate_err = |e: sqlx::migrate::MigrateError| sqlx::Error::Protocol(e.to_string());
    // A migration that failed half-way is not applied, whatever its row says.
    let dirty = conn.dirty_version().await.map_err(migrate_err)?;
    let applied: HashMap<i64, Vec<u8>> = conn
        .list_applied_migrations()
        .await
        .map_err(migrate_err)?
        .into_iter()
        .filter(|m| Some(m.version) != dirty)
        .map(|m| (m.version, m.checksum.into_owned()))
        .collect();
    let (mut missing, mut changed) = (Vec::new(), Vec::new());
    let mut known = 0;
    for m in tf_core::db::MIGRATOR
        .iter()
        .filter(|m| !m.migration_type.is_down_migration())
    {
        match applied.get(&m.version) {
            None => missing.push(m.version),
            Some(sum) => {
                known += 1;
                if sum[..] != m.checksum[..] {
                    changed.push(m.version);
                }
            }
        }
    }
    Ok(if missing.is_empty() && changed.is_empty() {
        DbState::Current {
            newer: applied.len().saturating_sub(known),
        }
    } else {
        DbState::Behind { missing, changed }
    })
}

/// `/healthz` and `/readyz`.
pub fn router(health: Health) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(health)
}

async fn healthz() -> &'static str {
    "ok"
}

async fn readyz(State(health): State<Health>) -> Response {
    let db = health.database().await;
    // Reported only: without Redis the gateway counts limits per replica (fail-open).
    let redis = if health.redis.is_filled() {
        "connected"
    } else {
        "not connected (limits are per replica)"
    };
    let (status, postgres) = match &db {
        DbState::Current { newer: 0 } => (StatusCode::OK, json!({"state": "ok"})),
        DbState::Current { newer } => (
            StatusCode::OK,
            json!({"state": "ok", "newer_migrations": newer}),
        ),
        DbState::Behind { missing, changed } => (
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"state": "migrations not current: run `tokenfactory migrate`",
                   "missing": missing, "changed": changed}),
        ),
        DbState::Unreachable(reason) => {
            // The cause is logged, not shown: the probe is unauthenticated.
            tracing::warn!(reason, "readiness: PostgreSQL did not answer");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                json!({"state": "unreachable"}),
            )
        }
    };
    let ready = status == StatusCode::OK;
    (
        status,
        Json(json!({"ready": ready, "postgres": postgres, "redis": redis})),
    )
        .into_response()
}
