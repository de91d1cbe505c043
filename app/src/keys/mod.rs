//! Server functions of the tenant's `/keys` page: create, list, revoke and rotate API keys.
//!
//! Every function takes the tenant from the session and nothing else: a key id in a form is only
//! ever looked up among the session tenant's keys, so another tenant's id changes nothing and is
//! answered like an unknown one ("No such key"). Forms check CSRF first and always answer with a
//! redirect to `/keys` (and a flash message); a new key's secret reaches the page through the
//! one-shot slot of [`crate::keys::reveal`], never through a URL.

pub mod page;
#[cfg(feature = "ssr")]
pub mod reveal;

use leptos::prelude::*;
use serde::{Deserialize, Serialize};

use crate::error::PortalError;

/// How long a rotated key keeps working, as the rotate form offers it: seconds and label.
pub const GRACE_CHOICES: &[(i64, &str)] = &[
    (0, "stop at once"),
    (3_600, "keep working for 1 hour"),
    (86_400, "keep working for 24 hours"),
    (604_800, "keep working for 7 days"),
];

/// Whether a key works.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum KeyState {
    /// Accepted.
    Active,
    /// Accepted until the end of a rotation's grace period.
    Ending,
    /// Revoked, or past its grace period: refused.
    Refused,
}

/// One key as the page lists it (times already formatted, in UTC).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyView {
    pub id: String,
    pub name: String,
    /// The visible start of the key (`tf-` and 8 characters).
    pub prefix: String,
    pub created: String,
    /// "never" when the key has not been used.
    pub last_used: String,
    pub state: KeyState,
    /// "Active", "Works until …", "Revoked …", "Expired …".
    pub status: String,
}

/// A key just made, shown once. Its `Debug` hides the secret.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FreshKey {
    pub name: String,
    pub prefix: String,
    pub secret: String,
    /// What became of the key it replaced, after a rotation.
    pub note: Option<String>,
}

impl std::fmt::Debug for FreshKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FreshKey")
            .field("name", &self.name)
            .field("prefix", &self.prefix)
            .field("secret", &"*****")
            .finish_non_exhaustive()
    }
}

/// Everything `/keys` shows.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeysView {
    pub keys: Vec<KeyView>,
    /// A key created or rotated by the previous form post, shown this once.
    pub fresh: Option<FreshKey>,
    /// Whether the viewer's role may create, rotate and revoke keys (the forms are shown).
    pub can_manage: bool,
    /// Keys refused for longer than [`HIDE_REFUSED_AFTER_DAYS`] left out of `keys` (all of them
    /// are listed when the page was asked for `?revoked=all`).
    pub hidden: usize,
    /// Whether the long-refused keys are listed (`?revoked=all`).
    pub showing_all: bool,
}

/// A key revoked or expired longer ago than this many days is listed only on request.
pub const HIDE_REFUSED_AFTER_DAYS: i64 = 7;

/// The tenant's keys, and the new key waiting to be shown (taken: it is shown once).
#[server(prefix = "/api", endpoint = "keys", input = leptos::server_fn::codec::GetUrl)]
pub async fn list_keys(#[server(default)] all: bool) -> Result<KeysView, PortalError> {
    use crate::keys::reveal;
    use crate::ssr::{cookies, internal, member, session, Portal};

    let portal = Portal::current()?;
    let s = session::current().await?;
    let m = member::required(&portal, &s).await?;
    let fresh = reveal::take(reveal::Slot::NewKey, &s, &cookies::jar().await?).await?;
    let rows = tf_core::db::keys::list_of_tenant(&portal.deps.pool, m.tenant.id)
        .await
        .map_err(|e| internal("listing keys", e))?;
    let now = time::OffsetDateTime::now_utc();
    let cutoff = now - time::Duration::days(HIDE_REFUSED_AFTER_DAYS);
    let (shown, hidden): (Vec<_>, Vec<_>) = rows
        .into_iter()
        .partition(|k| all || refused_since(k, now).is_none_or(|at| at > cutoff));
    Ok(KeysView {
        keys: shown.into_iter().map(|k| view_of(k, now)).collect(),
        fresh,
        can_manage: m.role.manages_keys(),
        hidden: hidden.len(),
        showing_all: all,
    })
}

/// What every `/keys` form has once its CSRF token is checked (before anything else).
#[cfg(feature = "ssr")]
struct KeyForm {
    portal: crate::ssr::Portal,
    session: tower_sessions::Session,
    jar: tower_cookies::Cookies,
    member: crate::ssr::member::Member,
    /// The client's address, for the audit rows (`key.create`, `key.rotate`, `key.revoke`) that
    /// `tf_core::member_ops` writes in each action's transaction.
    ip: String,
}

/// The CSRF token, then the signed-in member, who must be allowed to manage keys; `None` when
/// nobody is signed in (redirected to the login).
#[cfg(feature = "ssr")]
async fn key_form(csrf: &str) -> Result<Option<KeyForm>, PortalError> {
    use crate::ssr::{cookies, csrf as tokens, member, session, Portal};

    let portal = Portal::current()?;
    let s = session::current().await?;
    let jar = cookies::jar().await?;
    if !tokens::verify(&jar, csrf) {
        return Err(crate::ssr::form::refuse_csrf(&jar, "/keys"));
    }
    let Some(member) = member::current(&portal, &s).await? else {
        session::redirect("/login");
        return Ok(None);
    };
    // INVARIANT: a read-only user changes no key (test: roles::read_only_changes_nothing).
    let member = member::permitted(member, tf_core::TenantRole::manages_keys, &jar, "/keys")?;
    Ok(Some(KeyForm {
        portal,
        session: s,
        jar,
        member,
        ip: session::client_ip().await,
    }))
}

/// Creates a key named `name`; its secret is shown once on the next render of `/keys`.
#[server(prefix = "/api", endpoint = "create_key")]
pub async fn create_key(
    #[server(default)] csrf: String,
    #[server(default)] name: String,
) -> Result<(), PortalError> {
    use crate::keys::reveal;
    use crate::ssr::cookies::Flash;
    use crate::ssr::internal;

    let Some(KeyForm {
        portal,
        session: s,
        jar,
        member: m,
        ip,
    }) = key_form(&csrf).await?
    else {
        return Ok(());
    };
    let Some(name) = tf_core::keys::clean_name(&name) else {
        return back(&jar, Some(Flash::KeyNameInvalid));
    };
    let cap = portal.deps.max_keys_per_tenant;
    let actor = m.actor(&ip);
    let (row, secret) =
        match tf_core::member_ops::create_key(&portal.deps.pool, &actor, m.tenant.id, name, cap)
            .await
        {
            Ok(issued) => issued,
            Err(tf_core::keys::IssueError::TooMany { cap }) => {
                return back(&jar, Some(Flash::KeyLimit { cap }));
            }
            Err(tf_core::keys::IssueError::Db(e)) => return Err(internal("creating a key", e)),
        };
    tracing::info!(tenant = %m.tenant.name, key = %row.prefix, "key created in the portal");
    let fresh = FreshKey {
        name: row.name,
        prefix: row.prefix,
        secret,
        note: None,
    };
    reveal::stash(reveal::Slot::NewKey, &s, &jar, &fresh).await?;
    back(&jar, None)
}

/// Revokes one of the tenant's keys: refused on every replica within a second.
#[server(prefix = "/api", endpoint = "revoke_key")]
pub async fn revoke_key(
    #[server(default)] csrf: String,
    #[server(default)] key: String,
) -> Result<(), PortalError> {
    use crate::ssr::cookies::Flash;
    use crate::ssr::internal;

    let Some(KeyForm {
        portal,
        session: _,
        jar,
        member: m,
        ip,
    }) = key_form(&csrf).await?
    else {
        return Ok(());
    };
    let Ok(id) = key.parse::<uuid::Uuid>() else {
        return back(&jar, Some(Flash::NoSuchKey));
    };
    let revoked =
        tf_core::member_ops::revoke_key(&portal.deps.pool, &m.actor(&ip), m.tenant.id, id)
            .await
            .map_err(|e| internal("revoking a key", e))?;
    match revoked {
        Some(_) => {
            tracing::info!(tenant = %m.tenant.name, key = %id, "key revoked in the portal");
            back(&jar, Some(Flash::KeyRevoked))
        }
        None => back(&jar, Some(Flash::NoSuchKey)),
    }
}

/// Rotates one of the tenant's keys: a new key (shown once) and the old one refused after the
/// grace period picked from [`GRACE_CHOICES`].
#[server(prefix = "/api", endpoint = "rotate_key")]
pub async fn rotate_key(
    #[server(default)] csrf: String,
    #[server(default)] key: String,
    #[server(default)] grace: String,
) -> Result<(), PortalError> {
    use crate::keys::reveal;
    use crate::ssr::cookies::Flash;
    use crate::ssr::internal;

    let Some(KeyForm {
        portal,
        session: s,
        jar,
        member: m,
        ip,
    }) = key_form(&csrf).await?
    else {
        return Ok(());
    };
    let Some(grace) = grace
        .parse::<i64>()
        .ok()
        .filter(|g| GRACE_CHOICES.iter().any(|(secs, _)| secs == g))
    else {
        return back(&jar, Some(Flash::KeyFormInvalid));
    };
    let Ok(id) = key.parse::<uuid::Uuid>() else {
        return back(&jar, Some(Flash::NoSuchKey));
    };
    let rotated =
        tf_core::member_ops::rotate_key(&portal.deps.pool, &m.actor(&ip), m.tenant.id, id, grace)
            .await
            .map_err(|e| internal("rotating a key", e))?;
    let Some(r) = rotated else {
        return back(&jar, Some(Flash::NoSuchKey));
    };
    tracing::info!(tenant = %m.tenant.name, old = %id, new = %r.prefix, grace, "key rotated in the portal");
    let note = if grace == 0 {
        "The old key was revoked.".to_owned()
    } else {
        format!("The old key works until {}.", when(r.old_ends_at))
    };
    let fresh = FreshKey {
        name: r.name,
        prefix: r.prefix,
        secret: r.secret,
        note: Some(note),
    };
    reveal::stash(reveal::Slot::NewKey, &s, &jar, &fresh).await?;
    back(&jar, Some(Flash::KeyRotated))
}

/// Back to `/keys`, with a message.
#[cfg(feature = "ssr")]
fn back(
    jar: &tower_cookies::Cookies,
    flash: Option<crate::ssr::cookies::Flash>,
) -> Result<(), PortalError> {
    if let Some(f) = flash {
        crate::ssr::cookies::set_flash(jar, f);
    }
    crate::ssr::session::redirect("/keys");
    Ok(())
}

/// A time as the portal shows it: `2026-12-03 14:05 UTC`.
#[cfg(feature = "ssr")]
pub fn when(t: time::OffsetDateTime) -> String {
    let t = t.to_offset(time::UtcOffset::UTC);
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02} UTC",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute()
    )
}

/// When the key stopped working (revoked, or its grace period ended), if it has.
#[cfg(feature = "ssr")]
fn refused_since(
    k: &tf_core::db::keys::KeyRow,
    now: time::OffsetDateTime,
) -> Option<time::OffsetDateTime> {
    k.revoked_at.or(k.expires_at.filter(|at| *at <= now))
}

#[cfg(feature = "ssr")]
fn view_of(k: tf_core::db::keys::KeyRow, now: time::OffsetDateTime) -> KeyView {
    let (state, status) = match (k.revoked_at, k.expires_at) {
        (Some(at), _) => (KeyState::Refused, format!("Revoked {}", when(at))),
        (None, Some(at)) if at <= now => (KeyState::Refused, format!("Expired {}", when(at))),
        (None, Some(at)) => (KeyState::Ending, format!("Works until {}", when(at))),
        (None, None) => (KeyState::Active, "Active".to_owned()),
    };
    KeyView {
        id: k.id.to_string(),
        name: k.name,
        prefix: k.prefix,
        created: when(k.created_at),
        last_used: k.last_used_at.map_or_else(|| "never".to_owned(), when),
        state,
        status,
    }
}

#[cfg(all(test, feature = "ssr"))]
mod tests {
    use super::*;

    #[test]
    fn times_are_shown_in_utc_to_the_minute() {
        let t = time::macros::datetime!(2026-12-03 14:05:59 +02:00);
        assert_eq!(when(t), "2026-12-03 12:05 UTC");
    }

    #[test]
    fn a_fresh_keys_debug_hides_the_secret() {
        let k = FreshKey {
            name: "ci".into(),
            prefix: "tf-abcdefgh".into(),
            secret: "tf-abcdefghSECRET".into(),
            note: None,
        };
        assert!(!format!("{k:?}").contains("SECRET"));
    }
}
