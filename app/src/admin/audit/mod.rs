//! `/admin/audit`: the audit log, newest first, keyset-paginated by id (no OFFSET), filtered by
//! tenant (handle) and action (a whole action or a family such as `tenant`).

pub mod page;

use leptos::prelude::*;
use serde::{Deserialize, Serialize};

use crate::error::PortalError;

/// The page's query string: `tenant` a handle, `action` an action or family, `before` the
/// cursor of the "Older" link (an id).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditParams {
    pub tenant: Option<String>,
    pub action: Option<String>,
    pub before: Option<String>,
}

/// One recorded action.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditItem {
    pub id: i64,
    /// `YYYY-MM-DD HH:MM:SS` UTC.
    pub at: String,
    pub actor: String,
    pub tenant: String,
    pub action: String,
    pub target: String,
    /// The detail as compact JSON (`{}` when empty).
    pub detail: String,
    pub source_ip: String,
}

/// What `/admin/audit` shows.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditView {
    /// The filters as applied (echoed into the form and the "Older" link).
    pub filter: AuditParams,
    pub items: Vec<AuditItem>,
    /// The cursor of the next (older) page.
    pub older: Option<String>,
    pub notice: Option<String>,
}

/// The actions the filter offers (families first); other values may still be typed in the URL.
pub const ACTION_CHOICES: &[&str] = &[
    "tenant",
    "tenant.create",
    "tenant.suspend",
    "tenant.reactivate",
    "limits",
    "key",
    "user",
];

/// A page of the audit log.
#[server(prefix = "/api", endpoint = "admin_audit", input = leptos::server_fn::codec::GetUrl)]
pub async fn admin_audit(#[server(default)] params: AuditParams) -> Result<AuditView, PortalError> {
    use crate::admin::server as admin;
    use crate::ssr::{internal, Portal};

    let portal = Portal::current()?;
    admin::required(&portal).await?;
    let pool = &portal.deps.pool;
    let given = |v: &Option<String>| {
        v.as_deref()
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
    };
    let mut notice = None;
    let tenant_name = given(&params.tenant);
    let tenant = match &tenant_name {
        Some(name) => match tf_core::db::accounts::tenant_by_name(pool, name)
            .await
            .map_err(|e| internal("loading a tenant", e))?
        {
            Some(t) => Some(t.id),
            None => {
                return Ok(AuditView {
                    filter: AuditParams {
                        tenant: tenant_name,
                        action: given(&params.action),
                        before: None,
                    },
                    items: Vec::new(),
                    older: None,
                    notice: Some("No tenant has that handle.".into()),
                })
            }
        },
        None => None,
    };
    let action = given(&params.action);
    let before = match given(&params.before) {
        Some(b) => match b.parse::<i64>() {
            Ok(id) => Some(id),
            Err(_) => {
                notice = Some("Ignored a page cursor that did not parse.".to_owned());
                None
            }
        },
        None => None,
    };
    let mut rows = tf_core::db::audit::search(
        pool,
        tenant,
        action.as_deref(),
        before,
        super::PAGE_SIZE + 1,
    )
    .await
    .map_err(|e| internal("reading the audit log", e))?;
    let more = rows.len() > usize::try_from(super::PAGE_SIZE).unwrap_or(usize::MAX);
    rows.truncate(usize::try_from(super::PAGE_SIZE).unwrap_or(0));
    let older = more
        .then(|| rows.last().map(|r| r.id.to_string()))
        .flatten();
    let stamp = time::macros::format_description!("[year]-[month]-[day] [hour]:[minute]:[second]");
    Ok(AuditView {
        filter: AuditParams {
            tenant: tenant_name,
            action,
            before: None,
        },
        items: rows
            .into_iter()
            .map(|r| AuditItem {
                id: r.id,
                at: r
                    .at
                    .to_offset(time::UtcOffset::UTC)
                    .format(stamp)
                    .unwrap_or_default(),
                actor: r.actor,
                tenant: r.tenant_name.unwrap_or_else(|| "-".into()),
                action: r.action,
                target: r.target,
                detail: r.detail.to_string(),
                source_ip: r.source_ip.unwrap_or_else(|| "-".into()),
            })
            .collect(),
        older,
        notice,
    })
}
