//! `/audit`: a tenant's own audit log, for its owners (issue 37, item 7): who created, rotated or
//! revoked which key, invited or removed whom, changed body logging, the tenant's settings or
//! models, newest first, filtered by action family, paged by id ("Older"). The tenant is the
//! session's and nothing else: no tenant in the URL or form is read, so another tenant's rows
//! can never be asked for.

pub mod page;

use leptos::prelude::*;
use serde::{Deserialize, Serialize};

use crate::admin::audit::{AuditItem, TENANT_ACTION_CHOICES};
use crate::error::PortalError;

/// The page's query string: `action` a family or action, `before` the "Older" cursor (an id).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantAuditParams {
    pub action: Option<String>,
    pub before: Option<String>,
}

/// What `/audit` shows.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TenantAuditView {
    /// The viewer is not an owner of their tenant: nothing is shown.
    NotOwner,
    Shown {
        /// The action filter as applied.
        action: Option<String>,
        items: Vec<AuditItem>,
        older: Option<String>,
        notice: Option<String>,
    },
}

/// Rows the page shows at most.
pub const PAGE_SIZE: i64 = 50;

/// A page of the session tenant's audit log (owners only; others get [`TenantAuditView::NotOwner`]
/// and a 403).
#[server(prefix = "/api", endpoint = "tenant_audit", input = leptos::server_fn::codec::GetUrl)]
pub async fn tenant_audit(
    #[server(default)] params: TenantAuditParams,
) -> Result<TenantAuditView, PortalError> {
    use crate::ssr::{internal, member, session, Portal};

    let portal = Portal::current()?;
    let s = session::current().await?;
    let m = member::required(&portal, &s).await?;
    if !m.role.manages_tenant() {
        session::set_status(http::StatusCode::FORBIDDEN);
        return Ok(TenantAuditView::NotOwner);
    }
    let given = |v: &Option<String>| {
        v.as_deref()
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
    };
    let mut notice = None;
    let action = given(&params.action);
    let before = match given(&params.before).map(|b| b.parse::<i64>()) {
        Some(Ok(id)) => Some(id),
        Some(Err(_)) => {
            notice = Some("Ignored a page cursor that did not parse.".to_owned());
            None
        }
        None => None,
    };
    // INVARIANT: the tenant is the session member's, never a parameter (test:
    // issue37_portal::a_tenant_audit_shows_only_its_own_rows).
    let mut rows = tf_core::db::audit::search(
        &portal.deps.pool,
        Some(m.tenant.id),
        action.as_deref(),
        before,
        PAGE_SIZE + 1,
    )
    .await
    .map_err(|e| internal("reading the tenant's audit log", e))?;
    let page = usize::try_from(PAGE_SIZE).unwrap_or(usize::MAX);
    let more = rows.len() > page;
    rows.truncate(page);
    let older = more
        .then(|| rows.last().map(|r| r.id.to_string()))
        .flatten();
    Ok(TenantAuditView::Shown {
        action,
        items: rows.into_iter().map(crate::admin::audit::item_of).collect(),
        older,
        notice,
    })
}

/// The filter's choices (for the page).
pub fn choices() -> &'static [(&'static str, &'static str)] {
    TENANT_ACTION_CHOICES
}
