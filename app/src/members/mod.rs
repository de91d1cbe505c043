//! Server functions of `/members` (a tenant's people: invite, change role, remove) and of
//! `/invite/{token}` (join with an invitation).
//!
//! Only owners change anything here, checked in each function (not only by the page hiding the
//! forms). The tenant comes from the session; a user or invitation id of another tenant matches
//! nothing and is answered like an unknown one. A tenant never loses its last owner: role changes
//! and removals lock the tenant's owners and check inside one transaction, which also writes the
//! audit record. An invitation's token is shown once to the owner (the one-shot slot of
//! [`crate::keys::reveal`]) and stored only as its SHA-256; a link works once, until it expires.

pub mod invite;
pub mod page;

use leptos::prelude::*;
use serde::{Deserialize, Serialize};

use crate::error::PortalError;

/// How long an invitation link works.
pub const INVITATION_DAYS: i64 = 7;

/// One of the tenant's users as `/members` lists them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberView {
    pub id: String,
    pub email: String,
    pub display_name: String,
    /// `owner`, `member` or `read_only`.
    pub role: String,
    pub since: String,
    /// The viewer themself.
    pub me: bool,
}

/// A pending invitation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InvitationView {
    pub id: String,
    pub email: String,
    pub role: String,
    pub expires: String,
}

/// A link just made, shown once (its `Debug` hides it).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FreshInvitation {
    pub email: String,
    pub role: String,
    pub link: String,
}

impl std::fmt::Debug for FreshInvitation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FreshInvitation")
            .field("email", &self.email)
            .field("role", &self.role)
            .field("link", &"*****")
            .finish()
    }
}

/// Everything `/members` shows.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MembersView {
    pub members: Vec<MemberView>,
    /// Pending invitations (owners only; empty for others).
    pub invitations: Vec<InvitationView>,
    pub fresh: Option<FreshInvitation>,
    /// Whether the viewer is an owner (the forms are shown).
    pub can_manage: bool,
}

/// The tenant's members and, for owners, its pending invitations and a link just made.
#[server(prefix = "/api", endpoint = "members", input = leptos::server_fn::codec::GetUrl)]
pub async fn list_members() -> Result<MembersView, PortalError> {
    use crate::keys::reveal;
    use crate::keys::when;
    use crate::ssr::{cookies, internal, member, session, Portal};

    let portal = Portal::current()?;
    let s = session::current().await?;
    let m = member::required(&portal, &s).await?;
    let pool = &portal.deps.pool;
    let can_manage = m.role.manages_tenant();
    let members = tf_core::db::members::list(pool, m.tenant.id)
        .await
        .map_err(|e| internal("listing members", e))?;
    let (invitations, fresh) = if can_manage {
        let rows = tf_core::db::members::pending_invitations(pool, m.tenant.id)
            .await
            .map_err(|e| internal("listing invitations", e))?;
        let fresh = reveal::take(reveal::Slot::Invitation, &s, &cookies::jar().await?).await?;
        (rows, fresh)
    } else {
        (Vec::new(), None)
    };
    Ok(MembersView {
        members: members
            .into_iter()
            .map(|r| MemberView {
                me: r.id == m.user.id,
                id: r.id.to_string(),
                email: r.email,
                display_name: r.display_name,
                role: r.tenant_role.as_str().to_owned(),
                since: when(r.created_at),
            })
            .collect(),
        invitations: invitations
            .into_iter()
            .map(|i| InvitationView {
                id: i.id.to_string(),
                email: i.email,
                role: i.tenant_role.as_str().to_owned(),
                expires: when(i.expires_at),
            })
            .collect(),
        // The slot carries the invitation as a key would: name = email, prefix = role.
        fresh: fresh.map(|f| FreshInvitation {
            email: f.name,
            role: f.prefix,
            link: f.secret,
        }),
        can_manage,
    })
}

/// The address an invitation link starts with: this request's host, `https` behind TLS.
#[cfg(feature = "ssr")]
fn origin(secure: bool) -> String {
    let host = use_context::<http::request::Parts>()
        .and_then(|p| {
            p.headers
                .get(http::header::HOST)
                .and_then(|h| h.to_str().ok())
                .map(str::to_owned)
        })
        .filter(|h| {
            h.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b))
        })
        .unwrap_or_else(|| "localhost".to_owned());
    format!("{}://{host}", if secure { "https" } else { "http" })
}

/// The stored form of an invitation token.
#[cfg(feature = "ssr")]
fn digest(token: &str) -> Vec<u8> {
    use sha2::Digest;
    sha2::Sha256::digest(token.as_bytes()).to_vec()
}

/// Invites `email` with `role`: the link is shown once on `/members` for the owner to send.
#[server(prefix = "/api", endpoint = "invite_member")]
pub async fn invite_member(
    #[server(default)] csrf: String,
    #[server(default)] email: String,
    #[server(default)] role: String,
) -> Result<(), PortalError> {
    use crate::keys::reveal;
    use crate::keys::FreshKey;
    use crate::ssr::cookies::Flash;
    use crate::ssr::form::{audit, back, tenant_form, TenantForm};
    use crate::ssr::internal;
    use tf_core::TenantRole;

    let Some(TenantForm {
        portal,
        session: s,
        jar,
        member: m,
    }) = tenant_form(&csrf, "/members", TenantRole::manages_tenant).await?
    else {
        return Ok(());
    };
    let email = email.trim().to_lowercase();
    let role = TenantRole::parse(&role);
    let valid = email.len() <= 254
        && email
            .find('@')
            .is_some_and(|at| at > 0 && at + 1 < email.len())
        && !email.chars().any(|c| c.is_whitespace() || c.is_control());
    let (Some(role), true) = (role, valid) else {
        return back(&jar, "/members", Some(Flash::InviteInvalid));
    };
    // Whether the email already has an account is not looked up here: that would let an owner
    // probe which emails are registered anywhere on the platform. Accepting such an invitation
    // is refused instead (the unique email), and only the email's owner sees that.
    let pool = &portal.deps.pool;
    let mut raw = [0u8; 32];
    rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut raw);
    let token = hex::encode(raw);
    let hash = digest(&token);
    let mut tx = pool.begin().await.map_err(|e| internal("inviting", e))?;
    tf_core::db::members::insert_invitation(
        &mut *tx,
        &tf_core::db::members::NewInvitation {
            tenant_id: m.tenant.id,
            email: &email,
            tenant_role: role,
            token_sha256: &hash,
            invited_by: m.user.id,
            expires_at: time::OffsetDateTime::now_utc() + time::Duration::days(INVITATION_DAYS),
        },
    )
    .await
    .map_err(|e| internal("inviting", e))?;
    audit(
        &mut tx,
        &m,
        "member.invite",
        &email,
        serde_json::json!({ "role": role.as_str() }),
    )
    .await?;
    tx.commit().await.map_err(|e| internal("inviting", e))?;
    let fresh = FreshKey {
        name: email,
        prefix: role.as_str().to_owned(),
        secret: format!("{}/invite/{token}", origin(portal.deps.secure_cookies)),
        note: None,
    };
    reveal::stash(reveal::Slot::Invitation, &s, &jar, &fresh).await?;
    back(&jar, "/members", Some(Flash::Invited))
}

/// Withdraws a pending invitation of the tenant.
#[server(prefix = "/api", endpoint = "cancel_invitation")]
pub async fn cancel_invitation(
    #[server(default)] csrf: String,
    #[server(default)] invitation: String,
) -> Result<(), PortalError> {
    use crate::ssr::cookies::Flash;
    use crate::ssr::form::{audit, back, tenant_form, TenantForm};
    use crate::ssr::internal;
    use tf_core::TenantRole;

    let Some(TenantForm {
        portal,
        jar,
        member: m,
        ..
    }) = tenant_form(&csrf, "/members", TenantRole::manages_tenant).await?
    else {
        return Ok(());
    };
    let Ok(id) = invitation.parse::<uuid::Uuid>() else {
        return back(&jar, "/members", Some(Flash::InvitationUnusable));
    };
    let mut tx = portal
        .deps
        .pool
        .begin()
        .await
        .map_err(|e| internal("withdrawing", e))?;
    let Some(email) = tf_core::db::members::cancel_invitation(&mut *tx, m.tenant.id, id)
        .await
        .map_err(|e| internal("withdrawing an invitation", e))?
    else {
        return back(&jar, "/members", Some(Flash::InvitationUnusable));
    };
    audit(
        &mut tx,
        &m,
        "member.invite_cancel",
        &email,
        serde_json::json!({}),
    )
    .await?;
    tx.commit().await.map_err(|e| internal("withdrawing", e))?;
    back(&jar, "/members", Some(Flash::InvitationCancelled))
}

/// What a change of a member would do to the tenant's owners.
#[cfg(feature = "ssr")]
enum Change {
    Role(tf_core::TenantRole),
    Remove,
}

/// Changes a member's role, or removes them (their sessions end with them), unless the tenant
/// would be left without an owner. One transaction: lock the owners, check, change, audit.
#[cfg(feature = "ssr")]
async fn change_member(csrf: &str, user: &str, change: Change) -> Result<(), PortalError> {
    use crate::ssr::cookies::Flash;
    use crate::ssr::form::{audit, back, tenant_form, TenantForm};
    use crate::ssr::{internal, session};
    use tf_core::db::members;
    use tf_core::TenantRole;

    let Some(TenantForm {
        portal,
        jar,
        member: m,
        ..
    }) = tenant_form(csrf, "/members", TenantRole::manages_tenant).await?
    else {
        return Ok(());
    };
    let Ok(id) = user.parse::<uuid::Uuid>() else {
        return back(&jar, "/members", Some(Flash::NoSuchMember));
    };
    let failed = |e| internal("changing a member", e);
    let mut tx = portal.deps.pool.begin().await.map_err(failed)?;
    let owners = members::owners_for_update(&mut tx, m.tenant.id)
        .await
        .map_err(failed)?;
    let Some(target) = members::member(&mut *tx, m.tenant.id, id)
        .await
        .map_err(failed)?
    else {
        return back(&jar, "/members", Some(Flash::NoSuchMember));
    };
    let stays_owner = matches!(change, Change::Role(TenantRole::Owner));
    // INVARIANT: a tenant keeps an owner (test: roles::the_last_owner_stays).
    if target.tenant_role == TenantRole::Owner && !stays_owner && owners.len() <= 1 {
        return back(&jar, "/members", Some(Flash::LastOwner));
    }
    let (action, flash, detail) = match change {
        Change::Role(role) => {
            members::set_role(&mut *tx, m.tenant.id, id, role)
                .await
                .map_err(failed)?;
            (
                "member.role",
                Flash::RoleChanged,
                serde_json::json!({ "from": target.tenant_role.as_str(), "to": role.as_str() }),
            )
        }
        Change::Remove => {
            members::remove(&mut *tx, m.tenant.id, id)
                .await
                .map_err(failed)?;
            (
                "member.remove",
                Flash::MemberRemoved,
                serde_json::json!({ "role": target.tenant_role.as_str() }),
            )
        }
    };
    audit(&mut tx, &m, action, &target.email, detail).await?;
    tx.commit().await.map_err(failed)?;
    tracing::info!(tenant = %m.tenant.name, user = %id, action, "member changed in the portal");
    if id == m.user.id && matches!(flash, Flash::MemberRemoved) {
        // Removed themself: the session went with the user.
        session::redirect("/login");
        return Ok(());
    }
    back(&jar, "/members", Some(flash))
}

/// Gives a member of the tenant another role (`owner`, `member`, `read_only`).
#[server(prefix = "/api", endpoint = "change_role")]
pub async fn change_role(
    #[server(default)] csrf: String,
    #[server(default)] user: String,
    #[server(default)] role: String,
) -> Result<(), PortalError> {
    match tf_core::TenantRole::parse(&role) {
        Some(r) => change_member(&csrf, &user, Change::Role(r)).await,
        None => {
            // Checked like any form: token and role first, so a bad value reveals nothing.
            use crate::ssr::cookies::Flash;
            use crate::ssr::form::{back, tenant_form, TenantForm};
            let Some(TenantForm { jar, .. }) =
                tenant_form(&csrf, "/members", tf_core::TenantRole::manages_tenant).await?
            else {
                return Ok(());
            };
            back(&jar, "/members", Some(Flash::KeyFormInvalid))
        }
    }
}

/// Removes a member of the tenant: their account and sessions are deleted.
#[server(prefix = "/api", endpoint = "remove_member")]
pub async fn remove_member(
    #[server(default)] csrf: String,
    #[server(default)] user: String,
) -> Result<(), PortalError> {
    change_member(&csrf, &user, Change::Remove).await
}

/// What `/invite/{token}` shows before the invitee sets a password.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JoinInfo {
    pub email: String,
    pub tenant: String,
    pub role: String,
}

/// The invitation behind a link, if it can still be used.
#[server(prefix = "/api", endpoint = "invitation", input = leptos::server_fn::codec::GetUrl)]
pub async fn invitation_info(token: String) -> Result<Option<JoinInfo>, PortalError> {
    use crate::ssr::{internal, Portal};

    let portal = Portal::current()?;
    if token.len() != 64 {
        return Ok(None);
    }
    let pool = &portal.deps.pool;
    let Some(inv) = tf_core::db::members::usable_invitation(pool, &digest(&token))
        .await
        .map_err(|e| internal("reading an invitation", e))?
    else {
        return Ok(None);
    };
    let tenant = tf_core::db::accounts::tenant_by_id(pool, inv.tenant_id)
        .await
        .map_err(|e| internal("reading an invitation", e))?;
    Ok(tenant.map(|t| JoinInfo {
        email: inv.email,
        tenant: t.display_name,
        role: inv.tenant_role.label().to_owned(),
    }))
}

/// Joins with an invitation: the account is made with the invited email and role, the link is
/// used up, and the invitee is signed in.
#[server(prefix = "/api", endpoint = "accept_invitation")]
pub async fn accept_invitation(
    #[server(default)] csrf: String,
    #[server(default)] token: String,
    #[server(default)] password: String,
    #[server(default)] confirm: String,
) -> Result<(), PortalError> {
    use crate::model::MAX_INPUT_LEN;
    use crate::ssr::cookies::{self, Flash};
    use crate::ssr::{csrf as tokens, internal, session, Portal};
    use tf_core::db::members;

    let back_to = if token.len() == 64 && token.bytes().all(|b| b.is_ascii_hexdigit()) {
        format!("/invite/{token}")
    } else {
        "/login".to_owned()
    };
    let portal = Portal::current()?;
    let s = session::current().await?;
    let jar = cookies::jar().await?;
    if !tokens::verify(&jar, &csrf) {
        return Err(crate::ssr::form::refuse_csrf(&jar, &back_to));
    }
    let too_short = password.chars().count() < tf_core::accounts::MIN_PASSWORD_LEN;
    if too_short || password != confirm || password.len() > MAX_INPUT_LEN {
        cookies::set_flash(&jar, Flash::PasswordRefused);
        session::redirect(&back_to);
        return Ok(());
    }
    let hash = tf_core::accounts::hash_password(&password)
        .await
        .map_err(|e| internal("hashing a password", e))?;
    let failed = |e| internal("accepting an invitation", e);
    let mut tx = portal.deps.pool.begin().await.map_err(failed)?;
    let Some(inv) = members::take_invitation(&mut *tx, &digest(&token))
        .await
        .map_err(failed)?
    else {
        cookies::set_flash(&jar, Flash::InvitationUnusable);
        session::redirect(&back_to);
        return Ok(());
    };
    let inserted = members::insert(
        &mut *tx,
        &members::NewMember {
            email: &inv.email,
            password_hash: &hash,
            tenant_id: inv.tenant_id,
            tenant_role: inv.tenant_role,
        },
    )
    .await;
    let user_id = match inserted {
        Ok(id) => id,
        Err(e) if e.as_database_error().and_then(|d| d.code()).as_deref() == Some("23505") => {
            // The email got an account meanwhile; the invitation stays unused (rolled back).
            cookies::set_flash(&jar, Flash::AlreadyMember);
            session::redirect("/login");
            return Ok(());
        }
        Err(e) => return Err(failed(e)),
    };
    let ip = session::client_ip().await;
    tf_core::db::audit::record(
        &mut *tx,
        &tf_core::db::audit::Entry {
            actor_user_id: Some(user_id),
            actor: &inv.email,
            tenant_id: Some(inv.tenant_id),
            action: "member.join",
            target: &inv.email,
            detail: serde_json::json!({ "role": inv.tenant_role.as_str() }),
            source_ip: Some(&ip),
        },
    )
    .await
    .map_err(failed)?;
    tx.commit().await.map_err(failed)?;
    session::sign_in(&s, user_id).await?;
    cookies::set_flash(&jar, Flash::Joined);
    session::redirect("/");
    Ok(())
}
