//! The `migrate` and `admin` commands: what an operator does from a shell (`admin limits` is in
//! [`limits`], `admin economics` in [`economics`], `admin fleet` in [`fleet`]). Secrets (generated passwords, new API keys) are printed once to stdout and never
//! logged. Changes to keys and tenants reach every replica through the `tf_auth_changed` trigger (within a second); the
//! commands that end portal sessions delete their rows, so the next request is signed out. The
//! operator actions on tenants, keys and limits go through `tf_core::operator`, the code path
//! the admin pages use, which writes their audit rows (actor `cli`) in the same transaction.

pub mod advise;
pub mod attribution;
pub mod billing;
pub mod economics;
pub mod fleet;
pub mod limits;
pub mod measure_peak;

use std::io::Write;

use anyhow::Context;
use sqlx::PgPool;
use tf_core::accounts::{self, Role};
use tf_core::keys;
use tf_core::operator::{self, Actor, FirstUser};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use crate::cli::{AdminCommand, DbArgs, MigrateArgs};
use crate::secret::Secret;
use crate::usage_store;

async fn pool(db: &DbArgs) -> anyhow::Result<PgPool> {
    let url = db.database_url.expose();
    let pool = tf_core::db::connect(url, 4).await?;
    crate::db_start::for_admin(&pool, url).await?;
    Ok(pool)
}

/// Applies the migrations as the schema's owner (TF_MIGRATE_DATABASE_URL, else DATABASE_URL)
/// and, when asked, makes the serving login role a member of `tokenfactory_app`.
pub async fn migrate(args: &MigrateArgs) -> anyhow::Result<()> {
    let url = args.owner_url();
    let pool = tf_core::db::connect(url, 2).await?;
    tf_core::db::migrate(&pool, url).await?;
    let shown = tf_core::db::redact_url(url);
    say(
        &mut std::io::stdout(),
        &format!("migrations applied to {shown}"),
    )?;
    if let Some(role) = &args.grant_app_role {
        tf_core::db::roles::grant_app_role(&pool, role)
            .await
            .with_context(|| format!("granting {} to {role}", tf_core::db::roles::APP_ROLE))?;
        say(
            &mut std::io::stdout(),
            &format!("{role} is a member of {}", tf_core::db::roles::APP_ROLE),
        )?;
    }
    Ok(())
}

fn say(out: &mut impl Write, line: &str) -> anyhow::Result<()> {
    writeln!(out, "{line}")?;
    Ok(out.flush()?)
}

/// The given password, or a generated one that is printed.
fn password_or_generated(p: Option<Secret>) -> (String, bool) {
    match p {
        Some(p) => (p.expose().to_owned(), false),
        None => (accounts::generate_password(), true),
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

/// Runs an operator command, printing to stdout.
pub async fn run(cmd: AdminCommand) -> anyhow::Result<()> {
    let pool = pool(cmd.db()).await?;
    run_on(&pool, cmd, &mut std::io::stdout()).await
}

/// Runs an operator command on `pool`, writing what it reports to `out` (tests pass a buffer).
pub async fn run_on(pool: &PgPool, cmd: AdminCommand, out: &mut impl Write) -> anyhow::Result<()> {
    match cmd {
        AdminCommand::CreateAdmin {
            db: _,
            email,
            password,
        } => {
            let (password, generated) = password_or_generated(password);
            let user = accounts::create_user(pool, &email, &password, Role::Admin, None).await?;
            say(out, &format!("created admin {}", user.email))?;
            if generated {
                say(out, &format!("password: {password}"))?;
            }
        }
        AdminCommand::CreateTenant {
            db: _,
            name,
            display_name,
            member_email,
            member_password,
        } => {
            let member = member_email.map(|e| (e, password_or_generated(member_password)));
            let first = member
                .as_ref()
                .map(|(email, (password, _))| FirstUser { email, password });
            let (tenant, user) = operator::create_tenant(
                pool,
                &Actor::CLI,
                &name,
                display_name.as_deref().unwrap_or(&name),
                first,
            )
            .await?;
            say(
                out,
                &format!("created tenant {} ({})", tenant.name, tenant.id),
            )?;
            if let (Some(user), Some((_, (password, generated)))) = (user, &member) {
                say(out, &format!("created member {}", user.email))?;
                if *generated {
                    say(out, &format!("password: {password}"))?;
                }
            }
        }
        AdminCommand::IssueKey {
            db: _,
            tenant,
            name,
        } => {
            let tenant = accounts::find_tenant(pool, &tenant).await?;
            let (key, secret) = operator::issue_key(pool, &Actor::CLI, &tenant, &name).await?;
            say(
                out,
                &format!(
                    "issued key {} for tenant {}; it is shown only now:",
                    key.prefix, tenant.name
                ),
            )?;
            say(out, &secret)?;
        }
        AdminCommand::ResetPassword {
            db: _,
            email,
            password,
        } => {
            let (password, generated) = password_or_generated(password);
            let wanted = email.trim().to_lowercase();
            let row = tf_core::db::accounts::login_row(pool, &wanted)
                .await?
                .with_context(|| format!("no user {wanted}"))?;
            let user = tf_core::tenancy::User {
                id: row.id,
                email: row.email,
                role: row.role,
                tenant_id: row.tenant_id,
            };
            // The old password may be what leaked: whoever signed in with it is signed out; the
            // reset and its audit row (`user.reset_password`) commit together.
            let ended = operator::reset_password(pool, &Actor::CLI, &user, &password).await?;
            say(
                out,
                &format!("password of {email} reset; {ended} portal session(s) ended"),
            )?;
            if generated {
                say(out, &format!("password: {password}"))?;
            }
        }
        AdminCommand::RevokeKey { db: _, key } => {
            let revoked = operator::revoke_key(pool, &Actor::CLI, &key).await?;
            let key = revoked.with_context(|| {
                format!(
                    "no unrevoked key {:?} (give its id, its prefix or the whole key)",
                    keys::visible_prefix(&key)
                )
            })?;
            let tenant = accounts::tenant_by_id(pool, key.tenant_id).await?;
            // The UPDATE fired tf_auth_changed: every replica drops its key cache.
            say(
                out,
                &format!(
                    "revoked key {} ({}) of tenant {}; refused everywhere within a second",
                    key.prefix, key.id, tenant.name
                ),
            )?;
        }
        AdminCommand::SuspendTenant { db: _, tenant } => {
            let t = accounts::find_tenant(pool, &tenant).await?;
            let (_, ended) = operator::suspend_tenant(pool, &Actor::CLI, t.id)
                .await?
                .with_context(|| format!("tenant {tenant} not found"))?;
            say(
                out,
                &format!(
                    "suspended tenant {tenant}: its keys get 403 within a second; {ended} portal session(s) ended"
                ),
            )?;
        }
        AdminCommand::ReactivateTenant { db: _, tenant } => {
            let t = accounts::find_tenant(pool, &tenant).await?;
            operator::reactivate_tenant(pool, &Actor::CLI, t.id)
                .await?
                .with_context(|| format!("tenant {tenant} not found"))?;
            say(
                out,
                &format!("reactivated tenant {tenant}: its keys work again within a second"),
            )?;
        }
        AdminCommand::Usage {
            db: _,
            tenant,
            since,
            until,
        } => {
            let tenant_id = match tenant {
                Some(t) => Some(accounts::find_tenant(pool, &t).await?.id),
                None => None,
            };
            let events = usage_store::query(
                pool,
                tenant_id,
                parse_time("since", since)?,
                parse_time("until", until)?,
            )
            .await?;
            for e in events {
                serde_json::to_writer(&mut *out, &e)?;
                out.write_all(b"\n")?;
            }
            out.flush()?;
        }
        AdminCommand::Limits(args) => {
            say(out, limits::run(pool, &args).await?.trim_end())?;
        }
        AdminCommand::Prices(args) => billing::prices(pool, args, out).await?,
        AdminCommand::Rerate {
            db: _,
            tenant,
            since,
            until,
            version,
        } => billing::rerate(pool, &tenant, since, until, version, out).await?,
        AdminCommand::Export {
            db: _,
            format,
            since,
            until,
            source,
        } => billing::export(pool, format, since, until, &source, out).await?,
        AdminCommand::Invoices(args) => billing::invoices(pool, args, out).await?,
        AdminCommand::Credit {
            db: _,
            tenant,
            amount,
            priority,
            expires,
            note,
        } => billing::credit(pool, &tenant, amount, priority, expires, &note, out).await?,
        AdminCommand::Economics(args) => match &args.action {
            Some(crate::cli::EconomicsAction::MeasurePeak(m)) => {
                say(out, measure_peak::run(pool, m).await?.trim_end())?;
            }
            Some(crate::cli::EconomicsAction::Attribution(a)) => {
                let report =
                    attribution::run(pool, a, args.format, OffsetDateTime::now_utc()).await?;
                say(out, report.trim_end())?;
            }
            Some(crate::cli::EconomicsAction::Advise(a)) => {
                let report = advise::run(pool, a, args.format, OffsetDateTime::now_utc()).await?;
                say(out, report.trim_end())?;
            }
            None => {
                let report = economics::run(pool, &args, OffsetDateTime::now_utc()).await?;
                say(out, report.trim_end())?;
            }
        },
        AdminCommand::Fleet(args) => say(out, &fleet::run(pool, args.action).await?)?,
    }
    Ok(())
}
