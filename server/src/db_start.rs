//! The database step of start-up: who the process is connected as, and whether it migrates.
//!
//! `serve` refuses to run as a superuser or as an owner of the schema (issue 31): such a role
//! can disable the triggers that keep issued invoices, usage and the audit log immutable, so one
//! compromised or buggy replica could rewrite history. Production runs `tokenfactory migrate`
//! with the owner's URL and serves as a member of `tokenfactory_app`, which migrates nothing.
//! `--allow-owner-role` is the single-machine demo's way out (and then `serve` migrates, as
//! before). Admin commands migrate when they can (connected as an owner) and otherwise leave the
//! schema alone.

use sqlx::PgPool;
use tf_core::db::roles::{self, APP_ROLE};

/// Checks the connected role for `serve` and applies migrations when the process is allowed to
/// be the owner. Refusal names the role, why it is too powerful and the two ways out.
pub async fn for_serve(pool: &PgPool, url: &str, allow_owner_role: bool) -> anyhow::Result<()> {
    let standing = roles::standing(pool).await?;
    match (standing.too_powerful(), allow_owner_role) {
        (Some(why), false) => anyhow::bail!(
            "refusing to serve: {why} (DATABASE_URL {}). A replica connected as the schema's \
             owner or a superuser could disable the triggers that keep issued invoices and usage \
             immutable. Run `tokenfactory migrate` with the owner's URL and serve as a role \
             granted {APP_ROLE} (`tokenfactory migrate --grant-app-role <login role>`), or pass \
             --allow-owner-role (TF_ALLOW_OWNER_ROLE=true) for a single-machine demo",
            tf_core::db::redact_url(url)
        ),
        (why, true) => {
            if let Some(why) = why {
                tracing::warn!(%why, "serving as the schema's owner (--allow-owner-role): fine for a demo, never for production");
            }
            tf_core::db::migrate(pool, url).await?;
        }
        (None, false) => {
            // The owner migrates (`tokenfactory migrate`); until then /readyz says what is missing.
            tracing::info!(role = %standing.user, "connected as an application role; migrations are left to `tokenfactory migrate`");
        }
    }
    Ok(())
}

/// Admin commands: migrate when connected as an owner (an operator's shell usually is), and
/// leave the schema alone as an application role (which could not migrate anyway).
pub async fn for_admin(pool: &PgPool, url: &str) -> anyhow::Result<()> {
    if roles::standing(pool).await?.too_powerful().is_some() {
        tf_core::db::migrate(pool, url).await?;
    }
    Ok(())
}
