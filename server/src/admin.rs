//! The `migrate` and `admin` commands: what an operator does from a shell. Secrets (generated
//! passwords, new API keys) are printed once to stdout and never logged.

use std::io::Write;

use anyhow::Context;
use sqlx::PgPool;
use tf_core::accounts::{self, Role};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use crate::cli::{AdminCommand, DbArgs};
use crate::demo::random_password;
use crate::metering::usage;
use crate::secret::Secret;

async fn pool(db: &DbArgs) -> anyhow::Result<PgPool> {
    let url = db.database_url.expose();
    let pool = tf_core::db::connect(url, 4).await?;
    tf_core::db::migrate(&pool, url).await?;
    Ok(pool)
}

pub async fn migrate(db: &DbArgs) -> anyhow::Result<()> {
    pool(db).await?;
    say(&format!(
        "migrations applied to {}",
        tf_core::db::redact_url(db.database_url.expose())
    ))
}

fn say(line: &str) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")?;
    Ok(out.flush()?)
}

/// The given password, or a generated one that is printed.
fn password_or_generated(p: Option<Secret>) -> (String, bool) {
    match p {
        Some(p) => (p.expose().to_owned(), false),
        None => (random_password(), true),
    }
}

fn parse_time(flag: &str, value: Option<String>) -> anyhow::Result<Option<OffsetDateTime>> {
    value
        .map(|v| {
            OffsetDateTime::parse(&v, &Rfc3339)
                .with_context(|| format!("--{flag} {v:?} is not an RFC 3339 time"))
        })
        .transpose()
}

pub async fn run(cmd: AdminCommand) -> anyhow::Result<()> {
    match cmd {
        AdminCommand::CreateAdmin {
            db,
            email,
            password,
        } => {
            let pool = pool(&db).await?;
            let (password, generated) = password_or_generated(password);
            let user = accounts::create_user(&pool, &email, &password, Role::Admin, None).await?;
            say(&format!("created admin {}", user.email))?;
            if generated {
                say(&format!("password: {password}"))?;
            }
        }
        AdminCommand::CreateTenant {
            db,
            name,
            display_name,
            member_email,
            member_password,
        } => {
            let pool = pool(&db).await?;
            let tenant =
                accounts::create_tenant(&pool, &name, display_name.as_deref().unwrap_or(&name))
                    .await?;
            say(&format!("created tenant {} ({})", tenant.name, tenant.id))?;
            if let Some(email) = member_email {
                let (password, generated) = password_or_generated(member_password);
                let user = accounts::create_user(
                    &pool,
                    &email,
                    &password,
                    Role::TenantMember,
                    Some(tenant.id),
                )
                .await?;
                say(&format!("created member {}", user.email))?;
                if generated {
                    say(&format!("password: {password}"))?;
                }
            }
        }
        AdminCommand::IssueKey { db, tenant, name } => {
            let pool = pool(&db).await?;
            let tenant = accounts::find_tenant(&pool, &tenant).await?;
            let (key, secret) = tf_core::keys::issue(&pool, tenant.id, &name).await?;
            say(&format!(
                "issued key {} for tenant {}; it is shown only now:",
                key.prefix, tenant.name
            ))?;
            say(&secret)?;
        }
        AdminCommand::ResetPassword {
            db,
            email,
            password,
        } => {
            let pool = pool(&db).await?;
            let (password, generated) = password_or_generated(password);
            accounts::reset_password(&pool, &email, &password).await?;
            say(&format!("password of {email} reset"))?;
            if generated {
                say(&format!("password: {password}"))?;
            }
        }
        AdminCommand::Usage {
            db,
            tenant,
            since,
            until,
        } => {
            let pool = pool(&db).await?;
            let tenant_id = match tenant {
                Some(t) => Some(accounts::find_tenant(&pool, &t).await?.id),
                None => None,
            };
            let events = usage::query(
                &pool,
                tenant_id,
                parse_time("since", since)?,
                parse_time("until", until)?,
            )
            .await?;
            let mut out = std::io::stdout().lock();
            for e in events {
                serde_json::to_writer(&mut out, &e)?;
                out.write_all(b"\n")?;
            }
            out.flush()?;
        }
        AdminCommand::Limits(args) => {
            let pool = pool(&args.db).await?;
            say(crate::quota::admin::run(&pool, &args).await?.trim_end())?;
        }
    }
    Ok(())
}
