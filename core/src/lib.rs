//! Token Factory's shared domain: the database connection and migrations, tenants, portal users
//! and API keys, and the replica's Redis connection slot. Both the portal (`tf-app`, server side) and the `tokenfactory` binary use it, so
//! the rules (how a key is hashed, how a password is checked) live in exactly one place.

pub mod accounts;
pub mod db;
pub mod keys;
pub mod redis_slot;

pub use accounts::{Role, TenantStatus};
