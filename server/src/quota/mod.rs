//! Quotas, rate limits and per-tenant fairness: fast approximate enforcement shared by every
//! replica through Redis, kept apart from billing: enforcement is approximate, billing is exact
//! (it reads PostgreSQL's usage events, never these counters). Callers hand it plain data (who
//! asks, token counts) and get plain data back ([`answer`]); the gateway renders it as HTTP, the
//! CLI fills [`QuotaOptions`].
//!
//! Files depend on each other one way (`scripts/import-cycles.py` checks it):
//! - [`config`], [`limits`] (limits from PostgreSQL, cached per replica), [`plan`] (the ordered
//!   checks of one request and its estimate), [`answer`] (what a caller is told): data.
//! - [`scripts`]: the atomic Redis Lua scripts (`lua/`: acquire, sync, reconcile, merge).
//! - [`credit`]: this replica's credit, spent without I/O: granted by Redis, or by the replica
//!   itself from its share of each limit while Redis is down (fail-open for rates); `queue`: what
//!   is owed to Redis.
//! - `flight`: one ACQUIRE in flight per key, the others wait for its credit.
//! - `state`: what the parts below share, and the one way they call Redis.
//! - `sync`: the writer of what this replica owes Redis; `reconciler`: the cluster leader's
//!   spend reset from billed usage; `settle`: the admitted request's guard.
//! - `admission`: the entry point the request path calls after resolution.
//! - [`warn_every`]: warnings an outage repeats on every request, logged once per interval.
//!
//! On failure: Redis down or slow -> each replica's share of the limits, as credit it grants
//! itself, serving continues, what is owed to Redis is kept and sent when it answers; PostgreSQL
//! down -> cached limits keep applying; a request that dies -> its slots are freed by its guard,
//! or expire with the replica's holding if the replica dies.

mod admission;
pub mod answer;
pub mod config;
pub mod credit;
mod flight;
pub mod limits;
pub mod plan;
mod queue;
mod reconciler;
pub mod scripts;
mod settle;
mod state;
mod sync;
pub mod warn_every;

pub use admission::{AdmitRequest, Quota, REDIS_BACKOFF};
pub use answer::{RateStatus, Refusal};
pub use config::QuotaOptions;
pub use settle::Admitted;
