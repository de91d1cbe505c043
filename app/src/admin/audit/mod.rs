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
    /// The detail as `key: value` rows (an object's fields in order; a nested value as compact
    /// JSON, a string as itself); one `("", json)` row for a detail that is not an object.
    pub detail: Vec<(String, String)>,
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

/// The actions the filter offers, families with their labels (a family matches every
/// `family.*` action); a whole action such as `tenant.suspend` may still be typed in the URL.
pub const ACTION_CHOICES: &[(&str, &str)] = &[
    ("tenant", "Tenants (create, rename, suspend, tier)"),
    ("tenant.suspend", "  tenant.suspend"),
    ("tenant.reactivate", "  tenant.reactivate"),
    ("user", "Users (passwords, sessions)"),
    ("member", "Members (invite, join, role, remove)"),
    ("key", "API keys (create, rotate, revoke)"),
    ("limits", "Limits"),
    ("model", "Models (upload, start, stop, delete)"),
    ("bodies", "Body logging (opt in/out, retention, delete)"),
    ("prices", "Prices"),
    ("tier", "Price tiers"),
    ("invoice", "Invoices (build, issue, adjust, correct)"),
    ("credit", "Credit grants"),
    ("period", "Billing periods"),
    ("billing", "Re-rating"),
    ("fleet", "Serving policy (idle, floor)"),
    ("economics", "Serving costs"),
];

/// The actions a tenant's own audit view (`/audit`) filters by: the families a tenant's members
/// cause or that concern the tenant.
pub const TENANT_ACTION_CHOICES: &[(&str, &str)] = &[
    ("key", "API keys (create, rotate, revoke)"),
    ("member", "Members (invite, join, role, remove)"),
    ("model", "Models (upload, start, stop, delete)"),
    ("bodies", "Body logging (opt in/out, retention, delete)"),
    ("tenant", "Tenant (name, status, tier)"),
    ("limits", "Limits"),
    ("user", "Passwords and sessions"),
    ("invoice", "Invoices"),
    ("credit", "Credit"),
];

/// An audit row's detail as `key: value` rows, for reading (not raw JSON).
#[cfg(feature = "ssr")]
pub fn detail_rows(detail: &serde_json::Value) -> Vec<(String, String)> {
    use serde_json::Value;
    let show = |v: &Value| match v {
        Value::String(s) => s.clone(),
        Value::Null => "–".to_owned(),
        other => other.to_string(),
    };
    match detail {
        Value::Object(map) => map.iter().map(|(k, v)| (k.clone(), show(v))).collect(),
        Value::Null => Vec::new(),
        other => vec![(String::new(), show(other))],
    }
}

/// An audit row as the pages show it.
#[cfg(feature = "ssr")]
pub fn item_of(r: tf_core::db::audit::Found) -> AuditItem {
    let stamp = time::macros::format_description!("[year]-[month]-[day] [hour]:[minute]:[second]");
    AuditItem {
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
        detail: detail_rows(&r.detail),
        source_ip: r.source_ip.unwrap_or_else(|| "-".into()),
    }
}

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
    Ok(AuditView {
        filter: AuditParams {
            tenant: tenant_name,
            action,
            before: None,
        },
        items: rows.into_iter().map(item_of).collect(),
        older,
        notice,
    })
}

#[cfg(all(test, feature = "ssr"))]
mod tests {
    use super::detail_rows;

    #[test]
    fn details_read_as_key_value_rows() {
        let d = serde_json::json!({"name": "ci", "grace_secs": 3600, "tags": ["a"], "gone": null});
        let rows = detail_rows(&d);
        let find = |k: &str| {
            rows.iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(find("name"), Some("ci"));
        assert_eq!(find("grace_secs"), Some("3600"));
        assert_eq!(find("tags"), Some(r#"["a"]"#));
        assert_eq!(find("gone"), Some("–"));
        assert!(detail_rows(&serde_json::json!({})).is_empty());
        assert_eq!(
            detail_rows(&serde_json::json!("x")),
            [(String::new(), "x".to_owned())]
        );
    }
}
