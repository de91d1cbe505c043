//! The portal's state: the dependencies the server hands over, and the per-router state server
//! functions read from the reactive context.

use leptos::prelude::{provide_context, use_context};
use tf_core::redis_slot::RedisSlot;

use super::throttle::LoginThrottle;
use crate::error::PortalError;
use crate::model::OpsSnapshot;

/// What the portal needs from the server, handed over by the `tokenfactory` binary when it builds
/// the router. Cheap to clone (a pool and a connection manager are handles).
#[derive(Clone)]
pub struct PortalDeps {
    /// Accounts and sessions live in PostgreSQL.
    pub pool: sqlx::PgPool,
    /// Shared login-throttle counters, so every replica sees the same attempts. An empty slot
    /// (or an unreachable server) falls back to a per-process limiter.
    pub redis: RedisSlot,
    /// Every Redis key starts with this, so deployments (and tests) sharing a server stay apart.
    pub redis_prefix: String,
    /// Marks the session cookie `Secure`; on whenever the portal is served over TLS.
    pub secure_cookies: bool,
    /// The proxies whose `X-Forwarded-For` gives the client address for login throttling
    /// (empty: the socket's peer; see `client_addr`).
    pub trusted_proxies: super::client_addr::TrustedProxies,
    /// Most working keys a tenant may have (`--max-keys-per-tenant`); creating one more is
    /// refused with a message.
    pub max_keys_per_tenant: u32,
    /// Reads this replica's usage-journal figures for the admin home (`None`: no journal).
    pub ops: Option<std::sync::Arc<dyn Fn() -> OpsSnapshot + Send + Sync>>,
    /// Reads this replica's cold-start figures for `/admin/fleet` (`None`: not shown).
    pub cold: Option<std::sync::Arc<dyn Fn() -> crate::model::ColdSnapshot + Send + Sync>>,
}

/// Everything the server functions read from the reactive context: the dependencies and the
/// login throttle (whose in-process fallback must outlive single requests).
#[derive(Clone)]
pub struct Portal {
    /// The server's dependencies.
    pub deps: PortalDeps,
    /// Failed-login counters.
    pub throttle: LoginThrottle,
}

impl Portal {
    /// Builds the portal state once per router; clones share the throttle.
    pub fn new(deps: PortalDeps) -> Self {
        let throttle = LoginThrottle::new(deps.redis.clone(), deps.redis_prefix.clone());
        Self { deps, throttle }
    }

    /// Puts the portal into the reactive context of a request; pass it to both
    /// `leptos_routes_with_context` and `handle_server_fns_with_context`.
    pub fn provide(&self) {
        provide_context(self.clone());
    }

    /// The portal of the current request.
    pub fn current() -> Result<Self, PortalError> {
        use_context::<Self>().ok_or_else(|| {
            tracing::error!("portal context missing: the router did not provide it");
            PortalError::Internal
        })
    }
}

/// Logs an internal failure and turns it into the error users see (no details).
pub(crate) fn internal(context: &'static str, e: impl std::fmt::Display) -> PortalError {
    tracing::error!(error = %e, "{context}");
    PortalError::Internal
}
