//! The portal's cookies besides the session: the CSRF token and the one-shot flash message. They
//! live in cookies, not in the session, so a visitor who has not signed in costs no stored
//! session (see [`super::store`]).
//!
//! Both are HttpOnly, SameSite=Lax and path `/`. Behind TLS they are also `Secure` and named with
//! the `__Host-` prefix, which browsers accept only from this exact host over HTTPS: a sibling
//! subdomain cannot plant a CSRF token of its choosing (the known weakness of double-submit
//! cookies) or a flash message. A flash cookie holds a code, never text, so even a planted one
//! can only show one of the portal's own messages.

use std::time::Duration;

use tower_cookies::cookie::SameSite;
use tower_cookies::{Cookie, Cookies};

use super::portal::{internal, Portal};
use crate::error::PortalError;

/// Base name of the CSRF cookie.
pub const CSRF_COOKIE: &str = "tf_csrf";
/// Base name of the flash cookie.
pub const FLASH_COOKIE: &str = "tf_flash";
/// How long a flash message waits for the next page.
const FLASH_MAX_AGE: time::Duration = time::Duration::minutes(5);

/// The request's cookie jar (put there by the session layer's cookie manager); what is added to
/// it goes out as `Set-Cookie` on the response.
pub async fn jar() -> Result<Cookies, PortalError> {
    leptos_axum::extract::<Cookies>().await.map_err(|e| {
        internal(
            "no cookie jar on the request: is the session layer applied?",
            e,
        )
    })
}

/// Whether cookies are marked `Secure` (and `__Host-` prefixed).
fn secure() -> bool {
    Portal::current().is_ok_and(|p| p.deps.secure_cookies)
}

/// The cookie's name as sent: `__Host-` prefixed behind TLS.
pub fn name(base: &str, secure: bool) -> String {
    if secure {
        format!("__Host-{base}")
    } else {
        base.to_owned()
    }
}

fn build(base: &str, value: String, max_age: Option<time::Duration>) -> Cookie<'static> {
    let secure = secure();
    let mut c = Cookie::build((name(base, secure), value))
        .http_only(true)
        .same_site(SameSite::Lax)
        .secure(secure)
        .path("/");
    if let Some(age) = max_age {
        c = c.max_age(age);
    }
    c.build()
}

/// The value of one of the portal's cookies on the request.
pub fn get(jar: &Cookies, base: &str) -> Option<String> {
    jar.get(&name(base, secure())).map(|c| c.value().to_owned())
}

/// Sets one of the portal's cookies for the browser's session.
pub fn set(jar: &Cookies, base: &str, value: String) {
    jar.add(build(base, value, None));
}

/// Sets one of the portal's cookies for at most `max_age`.
pub fn set_for(jar: &Cookies, base: &str, value: String, max_age: time::Duration) {
    jar.add(build(base, value, Some(max_age)));
}

/// Removes one of the portal's cookies from the browser.
pub fn remove(jar: &Cookies, base: &str) {
    jar.remove(build(base, String::new(), None));
}

/// A message shown once on the next page, as the code its cookie holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flash {
    /// Wrong password or unknown email (one message for both).
    InvalidCredentials,
    /// The tenant is suspended.
    Suspended,
    /// The form's CSRF token was missing or wrong.
    Csrf,
    /// Login attempts are delayed; the next may come after this many seconds.
    Throttled { seconds: u64 },
    /// A key was revoked from `/keys`.
    KeyRevoked,
    /// A key was rotated from `/keys` (the new key is shown on the page).
    KeyRotated,
    /// A key form named a key the tenant has no working key with (or another tenant's).
    NoSuchKey,
    /// A key name was empty, too long or held control characters.
    KeyNameInvalid,
    /// The tenant already has the most working keys it may have.
    KeyLimit { cap: u32 },
    /// A key form carried a value no form of the page offers.
    KeyFormInvalid,
    /// What an admin form did (see [`super::admin_flash::AdminFlash`]).
    Admin(super::admin_flash::AdminFlash),
    /// The signed-in user's role may not use that form.
    RoleRefused,
    /// An invitation was made (its link is shown on `/members`).
    Invited,
    /// An invitation form had no usable email or role.
    InviteInvalid,
    /// The invited email already has an account.
    AlreadyMember,
    /// A pending invitation was withdrawn.
    InvitationCancelled,
    /// An invitation link that is unknown, used, withdrawn or expired.
    InvitationUnusable,
    /// A member's role was changed.
    RoleChanged,
    /// A member was removed.
    MemberRemoved,
    /// A member form named a user who is not in the tenant.
    NoSuchMember,
    /// The change would leave the tenant without an owner.
    LastOwner,
    /// A settings form was saved.
    SettingsSaved,
    /// A settings form carried a value out of bounds.
    SettingsInvalid,
    /// The tenant's billing address was saved (`/invoices`).
    BillingSaved,
    /// A billing address was refused (too long).
    BillingInvalid,
    /// The password was changed.
    PasswordChanged,
    /// A password change was refused.
    PasswordRefused,
    /// The tenant's stored request bodies were deleted.
    BodiesDeleted,
    /// An invitation was accepted and its user signed in.
    Joined,
    /// What a `/models` form did (see [`super::model_flash::ModelFlash`]).
    Model(super::model_flash::ModelFlash),
}

impl Flash {
    /// The cookie's value.
    pub fn code(self) -> String {
        match self {
            Self::InvalidCredentials => "credentials".to_owned(),
            Self::Suspended => "suspended".to_owned(),
            Self::Csrf => "csrf".to_owned(),
            Self::Throttled { seconds } => format!("throttled-{seconds}"),
            Self::KeyRevoked => "key-revoked".to_owned(),
            Self::KeyRotated => "key-rotated".to_owned(),
            Self::NoSuchKey => "no-such-key".to_owned(),
            Self::KeyNameInvalid => "key-name".to_owned(),
            Self::KeyLimit { cap } => format!("key-limit-{cap}"),
            Self::KeyFormInvalid => "key-form".to_owned(),
            Self::Admin(f) => format!("admin-{}", f.code()),
            Self::RoleRefused => "role".to_owned(),
            Self::Invited => "invited".to_owned(),
            Self::InviteInvalid => "invite-form".to_owned(),
            Self::AlreadyMember => "member-exists".to_owned(),
            Self::InvitationCancelled => "invite-cancelled".to_owned(),
            Self::InvitationUnusable => "invite-unusable".to_owned(),
            Self::RoleChanged => "role-changed".to_owned(),
            Self::MemberRemoved => "member-removed".to_owned(),
            Self::NoSuchMember => "no-such-member".to_owned(),
            Self::LastOwner => "last-owner".to_owned(),
            Self::SettingsSaved => "settings-saved".to_owned(),
            Self::SettingsInvalid => "settings-invalid".to_owned(),
            Self::BillingSaved => "billing-saved".to_owned(),
            Self::BillingInvalid => "billing-invalid".to_owned(),
            Self::PasswordChanged => "password-changed".to_owned(),
            Self::PasswordRefused => "password-refused".to_owned(),
            Self::BodiesDeleted => "bodies-deleted".to_owned(),
            Self::Joined => "joined".to_owned(),
            Self::Model(f) => format!("model-{}", f.code()),
        }
    }

    /// Reads a cookie's value; anything else is ignored.
    pub fn parse(code: &str) -> Option<Self> {
        match code {
            "credentials" => Some(Self::InvalidCredentials),
            "suspended" => Some(Self::Suspended),
            "csrf" => Some(Self::Csrf),
            "key-revoked" => Some(Self::KeyRevoked),
            "key-rotated" => Some(Self::KeyRotated),
            "no-such-key" => Some(Self::NoSuchKey),
            "key-name" => Some(Self::KeyNameInvalid),
            "key-form" => Some(Self::KeyFormInvalid),
            other if other.starts_with("admin-") => other
                .strip_prefix("admin-")
                .and_then(super::admin_flash::AdminFlash::parse)
                .map(Self::Admin),
            other if other.starts_with("model-") => other
                .strip_prefix("model-")
                .and_then(super::model_flash::ModelFlash::parse)
                .map(Self::Model),
            "role" => Some(Self::RoleRefused),
            "invited" => Some(Self::Invited),
            "invite-form" => Some(Self::InviteInvalid),
            "member-exists" => Some(Self::AlreadyMember),
            "invite-cancelled" => Some(Self::InvitationCancelled),
            "invite-unusable" => Some(Self::InvitationUnusable),
            "role-changed" => Some(Self::RoleChanged),
            "member-removed" => Some(Self::MemberRemoved),
            "no-such-member" => Some(Self::NoSuchMember),
            "last-owner" => Some(Self::LastOwner),
            "settings-saved" => Some(Self::SettingsSaved),
            "settings-invalid" => Some(Self::SettingsInvalid),
            "billing-saved" => Some(Self::BillingSaved),
            "billing-invalid" => Some(Self::BillingInvalid),
            "password-changed" => Some(Self::PasswordChanged),
            "password-refused" => Some(Self::PasswordRefused),
            "bodies-deleted" => Some(Self::BodiesDeleted),
            "joined" => Some(Self::Joined),
            other if other.starts_with("key-limit-") => other
                .strip_prefix("key-limit-")
                .and_then(|s| s.parse().ok())
                .map(|cap| Self::KeyLimit { cap }),
            other => other
                .strip_prefix("throttled-")
                .and_then(|s| s.parse().ok())
                .map(|seconds| Self::Throttled { seconds }),
        }
    }

    /// A throttle's answer, rounded up so the user never comes back too early.
    pub fn throttled(retry_after: Duration) -> Self {
        let ms = u64::try_from(retry_after.as_millis()).unwrap_or(u64::MAX);
        Self::Throttled {
            seconds: ms.div_ceil(1000).max(1),
        }
    }

    /// What the page shows.
    pub fn message(self) -> String {
        match self {
            Self::InvalidCredentials => crate::model::INVALID_CREDENTIALS.to_owned(),
            Self::Suspended => crate::model::SUSPENDED.to_owned(),
            Self::Csrf => PortalError::Csrf.to_string(),
            Self::Throttled { seconds } => {
                let (n, unit) = if seconds < 60 {
                    (seconds, "second")
                } else {
                    (seconds.div_ceil(60), "minute")
                };
                let s = if n == 1 { "" } else { "s" };
                format!("Too many failed attempts. Try again in {n} {unit}{s}.")
            }
            Self::KeyRevoked => "Key revoked. It is refused from now on.".to_owned(),
            Self::KeyRotated => "Key rotated. Copy the new key below.".to_owned(),
            Self::NoSuchKey => "No such key: nothing was changed.".to_owned(),
            Self::KeyNameInvalid => format!(
                "A key name must be 1 to {} characters, without control characters.",
                tf_core::keys::MAX_NAME_CHARS
            ),
            Self::KeyFormInvalid => "That form was not understood: nothing was changed.".to_owned(),
            Self::KeyLimit { cap } => format!(
                "No key created: a tenant may have at most {cap} working keys. Revoke one you no longer use first."
            ),
            Self::Admin(f) => f.message().to_owned(),
            Self::RoleRefused => "Your role does not allow that: nothing was changed.".to_owned(),
            Self::Invited => "Invitation made. Send the link below to the person you invited.".to_owned(),
            Self::InviteInvalid => "Give an email address and a role to invite someone.".to_owned(),
            Self::AlreadyMember => "Somebody with that email already has an account.".to_owned(),
            Self::InvitationCancelled => "Invitation withdrawn: its link no longer works.".to_owned(),
            Self::InvitationUnusable => "This invitation link is not valid: it was used, withdrawn or has expired.".to_owned(),
            Self::RoleChanged => "Role changed.".to_owned(),
            Self::MemberRemoved => "Member removed. Their sessions have ended.".to_owned(),
            Self::NoSuchMember => "No such member: nothing was changed.".to_owned(),
            Self::LastOwner => "A tenant keeps at least one owner: make someone else owner first.".to_owned(),
            Self::SettingsSaved => "Settings saved.".to_owned(),
            Self::SettingsInvalid => "That value was not accepted: nothing was changed.".to_owned(),
            Self::BillingSaved => "Billing address saved: invoices issued from now on are addressed to it.".to_owned(),
            Self::BillingInvalid => "A billing address is at most 1,000 characters: nothing was changed.".to_owned(),
            Self::PasswordChanged => "Password changed. Your other sessions have ended.".to_owned(),
            Self::PasswordRefused => "The current password is wrong, or the new ones differ or are shorter than 10 characters.".to_owned(),
            Self::BodiesDeleted => "Every stored request body was deleted.".to_owned(),
            Self::Joined => "Welcome! You have joined the tenant.".to_owned(),
            Self::Model(f) => f.message().to_owned(),
        }
    }

    /// Whether it reports something done (the success style) rather than a refusal.
    pub fn ok(self) -> bool {
        if let Self::Admin(f) = self {
            return f.ok();
        }
        if let Self::Model(f) = self {
            return f.ok();
        }
        matches!(
            self,
            Self::KeyRevoked
                | Self::KeyRotated
                | Self::Invited
                | Self::InvitationCancelled
                | Self::RoleChanged
                | Self::MemberRemoved
                | Self::SettingsSaved
                | Self::BillingSaved
                | Self::PasswordChanged
                | Self::BodiesDeleted
                | Self::Joined
        )
    }
}

/// Leaves a message for the next page the browser shows.
pub fn set_flash(jar: &Cookies, flash: Flash) {
    jar.add(build(FLASH_COOKIE, flash.code(), Some(FLASH_MAX_AGE)));
}

/// Takes the pending message, if any (shown once: the cookie is removed).
pub fn take_flash(jar: &Cookies) -> Option<crate::model::Notice> {
    let code = get(jar, FLASH_COOKIE)?;
    jar.remove(build(FLASH_COOKIE, String::new(), None));
    Flash::parse(&code).map(|f| crate::model::Notice {
        text: f.message(),
        ok: f.ok(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flash_codes_round_trip_and_unknown_ones_are_ignored() {
        for f in [
            Flash::InvalidCredentials,
            Flash::Suspended,
            Flash::Csrf,
            Flash::Throttled { seconds: 90 },
            Flash::KeyRevoked,
            Flash::KeyRotated,
            Flash::NoSuchKey,
            Flash::KeyNameInvalid,
            Flash::KeyLimit { cap: 100 },
            Flash::KeyFormInvalid,
            Flash::Admin(super::super::admin_flash::AdminFlash::LimitsSaved),
            Flash::RoleRefused,
            Flash::Invited,
            Flash::InviteInvalid,
            Flash::AlreadyMember,
            Flash::InvitationCancelled,
            Flash::InvitationUnusable,
            Flash::RoleChanged,
            Flash::MemberRemoved,
            Flash::NoSuchMember,
            Flash::LastOwner,
            Flash::SettingsSaved,
            Flash::SettingsInvalid,
            Flash::BillingSaved,
            Flash::BillingInvalid,
            Flash::PasswordChanged,
            Flash::PasswordRefused,
            Flash::BodiesDeleted,
            Flash::Joined,
            Flash::Model(super::super::model_flash::ModelFlash::Deleted),
        ] {
            assert_eq!(Flash::parse(&f.code()), Some(f));
        }
        assert_eq!(Flash::parse("Call +1 555 to unlock"), None);
        assert!(Flash::KeyRevoked.ok() && !Flash::NoSuchKey.ok() && !Flash::Csrf.ok());
        assert_eq!(Flash::parse("throttled-x"), None);
    }

    #[test]
    fn throttle_message_rounds_up() {
        let msg = |d| Flash::throttled(d).message();
        assert_eq!(
            msg(Duration::from_secs(14 * 60 + 1)),
            "Too many failed attempts. Try again in 15 minutes."
        );
        assert_eq!(
            msg(Duration::from_millis(29_100)),
            "Too many failed attempts. Try again in 30 seconds."
        );
        assert_eq!(
            msg(Duration::from_millis(10)),
            "Too many failed attempts. Try again in 1 second."
        );
        assert_eq!(
            msg(Duration::from_secs(60)),
            "Too many failed attempts. Try again in 1 minute."
        );
    }
}
