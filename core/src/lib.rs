//! Token Factory's shared domain, below every other crate: the tenancy and usage records, money,
//! and the data-access layer (`db`, every SQL statement of the product, checked at compile time),
//! with the rules that must live in exactly one place (how a key is hashed, how a password is
//! checked) and the replica's Redis connection slot. The portal (`tf-app`, server side) and the
//! `tokenfactory` binary both use it.
//!
//! Inside, imports point one way: `tenancy`, `usage`, `money`, `period`, `economics` (records and arithmetic) <- `db` (statements) <-
//! `accounts`, `keys` (rules) <- `operator`, `billing_ops` (audited operator actions), `member_ops`
//! (tenant members' audited key and password actions).

pub mod accounts;
pub mod billing_ops;
pub mod db;
pub mod economics;
pub mod endpoint;
pub mod keys;
pub mod member_ops;
pub mod money;
pub mod operator;
pub mod period;
pub mod redis_slot;
pub mod tenancy;
pub mod usage;

pub use tenancy::{Role, TenantRole, TenantStatus};
