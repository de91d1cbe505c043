//! `tokenfactory admin fleet idle --base B [--adapters] (--after 10m | --always-on)`: a base's
//! sleep policy (of its graph, or of its adapters),
//! through `tf_core::operator::set_idle_policy` (the admin page's path: one write in
//! `tf_core::db::sleep`, audited with actor `cli`).

use anyhow::bail;
use sqlx::PgPool;
use tf_core::accounts::AccountError;
use tf_core::operator::{self, Actor, IdleScope};

use crate::cli::FleetAdminAction;

/// Runs `action`; returns the line to print.
pub async fn run(pool: &PgPool, action: FleetAdminAction) -> anyhow::Result<String> {
    match action {
        FleetAdminAction::Idle {
            base,
            adapters,
            after,
            always_on,
        } => {
            let scope = if adapters {
                IdleScope::Adapters
            } else {
                IdleScope::Graph
            };
            let secs = match (after, always_on) {
                (_, true) => None,
                (Some(a), false) => match operator::parse_idle_after(&a) {
                    Some(s) => Some(s),
                    None => {
                        bail!("--after {a:?}: give seconds or 90s, 10m, 1h30m, 1d (1 s to 30 days)")
                    }
                },
                (None, false) => bail!("give --after DURATION or --always-on"),
            };
            match operator::set_idle_policy(pool, &Actor::CLI, &base, scope, secs).await {
                Ok(()) => Ok(match (scope, secs) {
                    (IdleScope::Graph, None) => format!("{base}: always on"),
                    (IdleScope::Graph, Some(s)) => {
                        format!("{base}: sleeps after {s} s without a request")
                    }
                    (IdleScope::Adapters, None) => {
                        format!("{base}: adapters stay loaded while the graph is up")
                    }
                    (IdleScope::Adapters, Some(s)) => {
                        format!("{base}: each adapter is unloaded after {s} s without a request")
                    }
                }),
                Err(AccountError::NotFound(_)) => {
                    bail!("no templated base model {base:?} (see /admin/fleet)")
                }
                Err(e) => Err(e.into()),
            }
        }
    }
}
