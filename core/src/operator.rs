//! What operators do to tenants, users, keys and limits: the one code path behind both
//! `tokenfactory admin` (the CLI, actor `cli`) and the admin pages (actor: the signed-in admin's
//! email and address). Each action and its `audit_log` row commit in one transaction, so there is
//! no action without its record and no record of an action that rolled back.
//!
//! Changes reach every replica through the tables' triggers (`tf_auth_changed` for keys and
//! tenant status, `tf_limits_changed` for limits), within a second; suspension also deletes the
//! tenant's users' portal sessions in the same transaction.

use serde_json::{json, Value};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::accounts::{self, AccountError};
use crate::db::{self, audit, limits};
use crate::tenancy::{ApiKey, Role, Tenant, TenantStatus, User};

/// Who acts, for the audit log.
#[derive(Debug, Clone, Copy)]
pub struct Actor<'a> {
    /// The signed-in user (`None` for the CLI).
    pub user_id: Option<Uuid>,
    /// An email, or `cli`.
    pub name: &'a str,
    /// The client address of the request, when there was one.
    pub source_ip: Option<&'a str>,
}

impl Actor<'static> {
    /// The operator at a shell (`tokenfactory admin …`).
    pub const CLI: Self = Self {
        user_id: None,
        name: "cli",
        source_ip: None,
    };
}

/// One audit row for an operator's action, in the caller's transaction (also billing's).
pub(crate) async fn record(
    conn: &mut PgConnection,
    actor: &Actor<'_>,
    tenant_id: Option<Uuid>,
    action: &str,
    target: &str,
    detail: Value,
) -> sqlx::Result<()> {
    audit::record(
        conn,
        &audit::Entry {
            actor_user_id: actor.user_id,
            actor: actor.name,
            tenant_id,
            action,
            target,
            detail,
            source_ip: actor.source_ip,
        },
    )
    .await
}

/// The first portal user of a new tenant.
pub struct FirstUser<'a> {
    pub email: &'a str,
    pub password: &'a str,
}

/// Creates a tenant and, when given, its first user (a tenant member), audited as
/// `tenant.create`.
pub async fn create_tenant(
    pool: &PgPool,
    actor: &Actor<'_>,
    name: &str,
    display_name: &str,
    first_user: Option<FirstUser<'_>>,
) -> Result<(Tenant, Option<User>), AccountError> {
    let mut tx = pool.begin().await?;
    let tenant = accounts::create_tenant(&mut *tx, name, display_name).await?;
    let user = match &first_user {
        Some(u) => Some(
            accounts::create_user(
                &mut *tx,
                u.email,
                u.password,
                Role::TenantMember,
                Some(tenant.id),
            )
            .await?,
        ),
        None => None,
    };
    let detail = json!({
        "display_name": tenant.display_name,
        "first_user": user.as_ref().map(|u| u.email.clone()),
    });
    record(
        &mut tx,
        actor,
        Some(tenant.id),
        "tenant.create",
        &tenant.name,
        detail,
    )
    .await?;
    tx.commit().await?;
    Ok((tenant, user))
}

/// Suspends a tenant: its keys get 403 on every replica within a second and its users' portal
/// sessions end (deleted in the same transaction). Returns the tenant and the sessions ended;
/// `None` when there is no such tenant.
pub async fn suspend_tenant(
    pool: &PgPool,
    actor: &Actor<'_>,
    tenant_id: Uuid,
) -> Result<Option<(Tenant, u64)>, AccountError> {
    let mut tx = pool.begin().await?;
    let Some(tenant) =
        db::overview::set_status(&mut *tx, tenant_id, TenantStatus::Suspended).await?
    else {
        return Ok(None);
    };
    let ended = db::sessions::delete_of_tenant(&mut *tx, tenant_id).await?;
    record(
        &mut tx,
        actor,
        Some(tenant_id),
        "tenant.suspend",
        &tenant.name,
        json!({ "sessions_ended": ended }),
    )
    .await?;
    tx.commit().await?;
    Ok(Some((tenant, ended)))
}

/// Reactivates a tenant: its keys work again within a second and its users may sign in.
pub async fn reactivate_tenant(
    pool: &PgPool,
    actor: &Actor<'_>,
    tenant_id: Uuid,
) -> Result<Option<Tenant>, AccountError> {
    let mut tx = pool.begin().await?;
    let Some(tenant) = db::overview::set_status(&mut *tx, tenant_id, TenantStatus::Active).await?
    else {
        return Ok(None);
    };
    record(
        &mut tx,
        actor,
        Some(tenant_id),
        "tenant.reactivate",
        &tenant.name,
        json!({}),
    )
    .await?;
    tx.commit().await?;
    Ok(Some(tenant))
}

fn change_json(c: limits::Change) -> Value {
    if c.given {
        c.value.map_or(Value::String("none".into()), Value::from)
    } else {
        Value::Null
    }
}

fn rates_json(r: &limits::RateChange) -> serde_json::Map<String, Value> {
    let mut m = serde_json::Map::new();
    for (k, c) in [
        ("rpm", r.requests_per_minute),
        ("tpm", r.tokens_per_minute),
        ("spend_limit_micros", r.spend_limit_micros),
    ] {
        if c.given {
            m.insert(k.into(), change_json(c));
        }
    }
    m
}

/// Writes the given limits of a tenant (limits not given stay; a given `None` removes one),
/// audited as `limits.tenant` with the values written.
pub async fn set_tenant_limits(
    pool: &PgPool,
    actor: &Actor<'_>,
    tenant: &Tenant,
    rates: &limits::RateChange,
    caps: &limits::CapsChange,
) -> Result<(), AccountError> {
    let mut tx = pool.begin().await?;
    limits::update_tenant(&mut *tx, tenant.id, rates, caps).await?;
    let mut detail = rates_json(rates);
    for (k, c) in [
        ("max_in_flight", caps.max_in_flight),
        ("max_long_prompts", caps.max_long_prompts),
        ("long_prompt_tokens", caps.long_prompt_tokens),
    ] {
        if c.given {
            detail.insert(k.into(), change_json(c));
        }
    }
    record(
        &mut tx,
        actor,
        Some(tenant.id),
        "limits.tenant",
        &tenant.name,
        Value::Object(detail),
    )
    .await?;
    tx.commit().await?;
    Ok(())
}

/// Writes the given limits of one key of `tenant_id`, audited as `limits.key` (target: the key's
/// prefix). A key of another tenant is left untouched and reported as not found.
pub async fn set_key_limits(
    pool: &PgPool,
    actor: &Actor<'_>,
    tenant_id: Uuid,
    key_prefix: &str,
    rates: &limits::RateChange,
) -> Result<(), AccountError> {
    let mut tx = pool.begin().await?;
    let key = db::keys::by_prefix(&mut *tx, key_prefix)
        .await?
        .filter(|k| k.tenant_id == tenant_id)
        .ok_or_else(|| AccountError::NotFound(format!("key {key_prefix}")))?;
    limits::update_key(&mut *tx, key.id, tenant_id, rates).await?;
    record(
        &mut tx,
        actor,
        Some(tenant_id),
        "limits.key",
        key_prefix,
        Value::Object(rates_json(rates)),
    )
    .await?;
    tx.commit().await?;
    Ok(())
}

/// Issues a key for a tenant, audited as `key.issue`; returns the key and its secret (to show
/// once).
pub async fn issue_key(
    pool: &PgPool,
    actor: &Actor<'_>,
    tenant: &Tenant,
    name: &str,
) -> Result<(ApiKey, String), AccountError> {
    let mut tx = pool.begin().await?;
    let (key, secret) = crate::keys::issue(&mut *tx, tenant.id, name).await?;
    record(
        &mut tx,
        actor,
        Some(tenant.id),
        "key.issue",
        &key.prefix,
        json!({ "name": key.name }),
    )
    .await?;
    tx.commit().await?;
    Ok((key, secret))
}

/// Revokes a key of any tenant, given by id or by visible prefix (or whole key), audited as
/// `key.revoke`. `None`: no unrevoked key matched.
pub async fn revoke_key(
    pool: &PgPool,
    actor: &Actor<'_>,
    id_or_prefix: &str,
) -> Result<Option<ApiKey>, AccountError> {
    let mut tx = pool.begin().await?;
    let revoked = match Uuid::parse_str(id_or_prefix) {
        Ok(id) => db::keys::revoke_by_id(&mut *tx, id).await?,
        Err(_) => {
            db::keys::revoke_by_prefix(&mut *tx, crate::keys::visible_prefix(id_or_prefix)).await?
        }
    };
    let Some(key) = revoked else {
        return Ok(None);
    };
    record(
        &mut tx,
        actor,
        Some(key.tenant_id),
        "key.revoke",
        &key.prefix,
        json!({ "name": key.name }),
    )
    .await?;
    tx.commit().await?;
    Ok(Some(key))
}

/// Sets a user's password and ends every portal session they have (the old password may be what
/// leaked), audited as `user.reset_password`. Returns the sessions ended.
pub async fn reset_password(
    pool: &PgPool,
    actor: &Actor<'_>,
    user: &User,
    password: &str,
) -> Result<u64, AccountError> {
    let mut tx = pool.begin().await?;
    accounts::reset_password(&mut *tx, &user.email, password).await?;
    let ended = db::sessions::delete_of_user(&mut *tx, user.id).await?;
    record(
        &mut tx,
        actor,
        user.tenant_id,
        "user.reset_password",
        &user.email,
        json!({ "sessions_ended": ended }),
    )
    .await?;
    tx.commit().await?;
    Ok(ended)
}

/// Ends every portal session of a user, audited as `user.end_sessions`. Returns how many ended.
pub async fn end_sessions(
    pool: &PgPool,
    actor: &Actor<'_>,
    user: &User,
) -> Result<u64, AccountError> {
    let mut tx = pool.begin().await?;
    let ended = db::sessions::delete_of_user(&mut *tx, user.id).await?;
    record(
        &mut tx,
        actor,
        user.tenant_id,
        "user.end_sessions",
        &user.email,
        json!({ "sessions_ended": ended }),
    )
    .await?;
    tx.commit().await?;
    Ok(ended)
}

/// Appends a cost version of the base named `c.base_model` (which must exist in the catalog),
/// audited as `economics.cost` with the values written. Costs are versioned like prices: an
/// earlier version is never changed, and a second version at the same instant is refused
/// ([`AccountError::Exists`]).
pub async fn set_base_cost(
    pool: &PgPool,
    actor: &Actor<'_>,
    c: &db::economics::NewCost<'_>,
) -> Result<i64, AccountError> {
    if c.gpu_micros_per_hour < 0 || c.gpus_per_replica <= 0 || c.peak_tokens_per_second <= 0 {
        return Err(AccountError::Invalid(
            "GPU cost must be 0 or more, GPUs per replica and peak tokens per second above 0"
                .into(),
        ));
    }
    let mut tx = pool.begin().await?;
    if !db::economics::base_exists(&mut *tx, c.base_model).await? {
        return Err(AccountError::NotFound(format!(
            "base model {}",
            c.base_model
        )));
    }
    let id = match db::economics::insert_cost(&mut *tx, c).await {
        Ok(id) => id,
        Err(e)
            if e.as_database_error()
                .and_then(|d| d.code())
                .is_some_and(|code| code == "23505") =>
        {
            return Err(AccountError::Exists(format!(
                "a cost version of {} from that time",
                c.base_model
            )));
        }
        Err(e) => return Err(e.into()),
    };
    let from = c
        .effective_from
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default();
    record(
        &mut tx,
        actor,
        None,
        "economics.cost",
        c.base_model,
        json!({
            "version": id,
            "effective_from": from,
            "gpu_micros_per_hour": c.gpu_micros_per_hour,
            "gpus_per_replica": c.gpus_per_replica,
            "peak_tokens_per_second": c.peak_tokens_per_second,
        }),
    )
    .await?;
    tx.commit().await?;
    Ok(id)
}

/// Appends a version of `base`'s costs with a measured peak (tokens per second per replica),
/// effective now: the GPU cost and GPUs per replica of the version in effect now, `how` kept on
/// the row. Audited as `economics.measured_peak`. `Invalid` when the base has no cost in effect
/// (there is nothing to measure against) or the peak is not above 0.
pub async fn record_measured_peak(
    pool: &PgPool,
    actor: &Actor<'_>,
    base: &str,
    peak_tokens_per_second: i64,
    how: &Value,
) -> Result<i64, AccountError> {
    if peak_tokens_per_second <= 0 {
        return Err(AccountError::Invalid(
            "the measured peak is 0 tokens per second: nothing was recorded".into(),
        ));
    }
    let now = time::OffsetDateTime::now_utc();
    let mut tx = pool.begin().await?;
    let current = db::economics::costs(&mut *tx)
        .await?
        .into_iter()
        .rev()
        .find(|c| c.base_model == base && c.effective_from <= now);
    let Some(current) = current else {
        return Err(AccountError::Invalid(format!(
            "{base} has no cost in effect: set its GPU cost first (/admin/economics)"
        )));
    };
    let cost = db::economics::NewCost {
        base_model: base,
        effective_from: now,
        gpu_micros_per_hour: current.gpu_micros_per_hour,
        gpus_per_replica: current.gpus_per_replica,
        peak_tokens_per_second,
        created_by: actor.name,
    };
    let id = db::economics::insert_measured_cost(&mut *tx, &cost, how).await?;
    record(
        &mut tx,
        actor,
        None,
        "economics.measured_peak",
        base,
        json!({
            "version": id,
            "peak_tokens_per_second": peak_tokens_per_second,
            "previous_peak_tokens_per_second": current.peak_tokens_per_second,
            "measurement": how,
        }),
    )
    .await?;
    tx.commit().await?;
    Ok(id)
}

/// A limit as typed into a form or on the command line: empty or `none` removes the limit, a
/// whole number of 0 or more sets it; anything else is `None` (refused, nothing changed).
pub fn parse_limit(typed: &str) -> Option<limits::Change> {
    let t = typed.trim();
    if t.is_empty() || t.eq_ignore_ascii_case("none") {
        return Some(limits::Change {
            given: true,
            value: None,
        });
    }
    match t.parse::<i64>() {
        Ok(n) if n >= 0 => Some(limits::Change {
            given: true,
            value: Some(n),
        }),
        _ => None,
    }
}

/// A money limit as typed: empty or `none` removes it, an amount of currency of 0 or more
/// (`5`, `$5.00`, `0.000125`; [`crate::money::parse_money`], exact) sets it in micro-units;
/// anything else is `None` (refused, nothing changed).
pub fn parse_money_limit(typed: &str) -> Option<limits::Change> {
    let t = typed.trim();
    if t.is_empty() || t.eq_ignore_ascii_case("none") {
        return parse_limit(t);
    }
    match crate::money::parse_money(t) {
        Ok(n) if n >= 0 => Some(limits::Change {
            given: true,
            value: Some(n),
        }),
        _ => None,
    }
}

/// Longest idle policy: 30 days.
pub const MAX_IDLE_AFTER_SECS: i32 = 30 * 86_400;

/// An idle duration as typed on the admin page or after `--after`: whole seconds (`90`), or one
/// or more number-unit pairs of `s`, `m`, `h`, `d` (`90s`, `10m`, `1h30m`); 1 s to 30 days.
pub fn parse_idle_after(typed: &str) -> Option<i32> {
    let t = typed.trim().to_ascii_lowercase();
    if t.is_empty() {
        return None;
    }
    if let Ok(n) = t.parse::<i64>() {
        return i32::try_from(n)
            .ok()
            .filter(|n| (1..=MAX_IDLE_AFTER_SECS).contains(n));
    }
    let mut total: i64 = 0;
    let mut digits = String::new();
    for c in t.chars() {
        match c {
            '0'..='9' => digits.push(c),
            's' | 'm' | 'h' | 'd' if !digits.is_empty() => {
                let n: i64 = digits.parse().ok()?;
                digits.clear();
                let unit = match c {
                    's' => 1,
                    'm' => 60,
                    'h' => 3_600,
                    _ => 86_400,
                };
                total = total.checked_add(n.checked_mul(unit)?)?;
            }
            _ => return None,
        }
    }
    if !digits.is_empty() {
        return None;
    }
    i32::try_from(total)
        .ok()
        .filter(|n| (1..=MAX_IDLE_AFTER_SECS).contains(n))
}

/// What an idle policy puts to sleep: the base's graph (zero replicas), or each of its adapters
/// on its own (unloaded from the engines while the graph serves the others).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdleScope {
    Graph,
    Adapters,
}

/// Sets a base's sleep policy for `scope` (`None`: always on, or always loaded) through
/// `db::sleep`, audited as `fleet.idle_policy` in the same transaction: the one path of the admin
/// page and `tokenfactory admin fleet idle`.
pub async fn set_idle_policy(
    pool: &PgPool,
    actor: &Actor<'_>,
    base: &str,
    scope: IdleScope,
    idle_after_secs: Option<i32>,
) -> Result<(), AccountError> {
    if idle_after_secs.is_some_and(|s| !(1..=MAX_IDLE_AFTER_SECS).contains(&s)) {
        return Err(AccountError::Invalid(
            "an idle policy is 1 s to 30 days".into(),
        ));
    }
    let mut tx = pool.begin().await?;
    let found = match scope {
        IdleScope::Graph => db::sleep::set_idle_after(&mut *tx, base, idle_after_secs).await?,
        IdleScope::Adapters => {
            db::sleep::set_adapter_idle_after(&mut *tx, base, idle_after_secs).await?
        }
    };
    if !found {
        return Err(AccountError::NotFound(format!(
            "templated base model {base}"
        )));
    }
    let (scope_name, always) = match scope {
        IdleScope::Graph => ("graph", "always-on"),
        IdleScope::Adapters => ("adapters", "always-loaded"),
    };
    record(
        &mut tx,
        actor,
        None,
        "fleet.idle_policy",
        base,
        json!({
            "scope": scope_name,
            "policy": if idle_after_secs.is_some() { "idle-after" } else { always },
            "idle_after_secs": idle_after_secs,
        }),
    )
    .await?;
    tx.commit().await?;
    Ok(())
}

/// Sets a base's floor and graph idle policy together (what `admin economics advise --apply`
/// chose), in one transaction with two audit rows: `fleet.floor` (the floor before and after)
/// and `fleet.idle_policy` (the same detail as [`set_idle_policy`]). The floor is 1 to the
/// template's ceiling.
pub async fn set_serving_policy(
    pool: &PgPool,
    actor: &Actor<'_>,
    base: &str,
    floor: i32,
    idle_after_secs: Option<i32>,
) -> Result<(), AccountError> {
    if idle_after_secs.is_some_and(|s| !(1..=MAX_IDLE_AFTER_SECS).contains(&s)) {
        return Err(AccountError::Invalid(
            "an idle policy is 1 s to 30 days".into(),
        ));
    }
    let mut tx = pool.begin().await?;
    let Some((was, ceiling)) = db::sleep::lock_floor(&mut *tx, base).await? else {
        return Err(AccountError::NotFound(format!(
            "templated base model {base}"
        )));
    };
    if !(1..=ceiling).contains(&floor) {
        return Err(AccountError::Invalid(format!(
            "a floor is 1 to the base's ceiling ({ceiling} replicas)"
        )));
    }
    db::sleep::set_floor(&mut *tx, base, floor).await?;
    db::sleep::set_idle_after(&mut *tx, base, idle_after_secs).await?;
    record(
        &mut tx,
        actor,
        None,
        "fleet.floor",
        base,
        json!({ "floor": floor, "was": was, "ceiling": ceiling }),
    )
    .await?;
    record(
        &mut tx,
        actor,
        None,
        "fleet.idle_policy",
        base,
        json!({
            "scope": "graph",
            "policy": if idle_after_secs.is_some() { "idle-after" } else { "always-on" },
            "idle_after_secs": idle_after_secs,
        }),
    )
    .await?;
    tx.commit().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{parse_idle_after, parse_limit};

    #[test]
    fn idle_durations_parse() {
        assert_eq!(parse_idle_after("90"), Some(90));
        assert_eq!(parse_idle_after(" 10m "), Some(600));
        assert_eq!(parse_idle_after("1h30m"), Some(5_400));
        assert_eq!(parse_idle_after("2D"), Some(172_800));
        assert_eq!(parse_idle_after("45s"), Some(45));
        for bad in ["", "0", "-5", "10x", "m", "10m5", "31d", "1.5h"] {
            assert_eq!(parse_idle_after(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn limits_parse_like_the_cli() {
        assert_eq!(parse_limit("").map(|c| c.value), Some(None));
        assert_eq!(parse_limit(" None ").map(|c| c.value), Some(None));
        assert_eq!(parse_limit("120").map(|c| c.value), Some(Some(120)));
        assert_eq!(parse_limit("0").map(|c| c.value), Some(Some(0)));
        assert!(parse_limit("-1").is_none());
        assert!(parse_limit("1.5").is_none());
        assert!(parse_limit("lots").is_none());
    }
}
