//! Quotas, rate limits and per-tenant fairness: fast approximate enforcement shared by every
//! replica through Redis, kept apart from billing: enforcement is approximate, billing is exact
//! (it reads PostgreSQL's usage events, never these counters).
//!
//! - [`limits`]: limits from PostgreSQL, cached per replica (changes apply within a second).
//! - [`plan`]: the ordered checks of one request (cheapest first) and its estimate.
//! - [`scripts`]: the atomic Redis Lua scripts (acquire, sync, reconcile, merge).
//! - [`credit`]: this replica's credit from Redis, spent without I/O.
//! - [`sync`]: the one writer of what this replica owes Redis (spend, refunds, holdings).
//! - [`local`]: per-replica fallback limits while Redis is down (fail-open for rates).
//! - [`admission`]: the entry point the request path calls after resolution.
//! - [`settle`]: the admitted request's guard; settles at completion, frees on every path.
//! - [`headers`]: `x-ratelimit-*` headers and refusals.
//! - [`reconciler`]: the cluster leader's spend reset from billed usage.
//!
//! On failure: Redis down or slow -> local limits, serving continues; PostgreSQL down -> cached
//! limits keep applying; a request that dies -> its slots are freed by its guard, or expire with
//! the replica's holding if the replica dies.

pub mod admission;
pub mod config;
pub mod credit;
pub mod headers;
pub mod limits;
pub mod local;
pub mod plan;
mod reconciler;
pub mod scripts;
pub mod settle;
mod sync;

pub use admission::{AdmitRequest, Quota};
pub use config::QuotaArgs;
pub use headers::{RateHeaders, Refusal};
pub use settle::Admitted;
