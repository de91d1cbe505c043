//! The one-shot slots that carry a secret (a new API key, an invitation link) from the form post
//! that made it to the page that shows it, once. The secret never goes into a URL, a log or a
//! flash message.
//!
//! It is split in two with a one-time pad: a random pad as long as the secret goes to the browser
//! in an HttpOnly cookie, and the secret XOR the pad goes into the signed-in session (stored in
//! PostgreSQL, so the page may be rendered by any replica). Either half alone is uniformly random:
//! a copy of the sessions table or of the cookie reveals nothing. The next render of the page
//! takes both (removing them) and shows the secret; a slot not taken within [`KEEP`] is dropped.

use rand::RngCore;
use serde::{Deserialize, Serialize};
use tower_cookies::Cookies;
use tower_sessions::Session;

use super::FreshKey;
use crate::error::PortalError;
use crate::ssr::cookies;
use crate::ssr::internal;

/// Which secret a slot carries; each page takes only its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    /// A new API key, shown on `/keys`.
    NewKey,
    /// A new invitation link, shown on `/members`.
    Invitation,
    /// A password an admin generated (a new tenant's first user, a reset), shown on the admin page.
    Password,
}

impl Slot {
    /// Session key of the sealed half.
    fn key(self) -> &'static str {
        match self {
            Self::NewKey => "revealed_key",
            Self::Invitation => "revealed_invitation",
            Self::Password => "revealed_password",
        }
    }

    /// Base name of the pad cookie.
    fn cookie(self) -> &'static str {
        match self {
            Self::NewKey => "tf_reveal",
            Self::Invitation => "tf_reveal_invite",
            Self::Password => "tf_reveal_password",
        }
    }
}
/// How long a new key waits to be shown.
const KEEP: time::Duration = time::Duration::minutes(10);

/// The session's half: everything about the new key except the secret, which is sealed.
#[derive(Serialize, Deserialize)]
struct Sealed {
    name: String,
    prefix: String,
    note: Option<String>,
    /// Hex of the secret's bytes XOR the pad's.
    sealed: String,
    /// Unix seconds when it was stashed.
    at: i64,
}

fn now() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

/// Keeps `fresh` for the next render of its page (replacing one not shown yet).
pub async fn stash(
    slot_of: Slot,
    session: &Session,
    jar: &Cookies,
    fresh: &FreshKey,
) -> Result<(), PortalError> {
    let secret = fresh.secret.as_bytes();
    let mut pad = vec![0u8; secret.len()];
    rand::rngs::OsRng.fill_bytes(&mut pad);
    let sealed: Vec<u8> = secret.iter().zip(&pad).map(|(s, p)| s ^ p).collect();
    let slot = Sealed {
        name: fresh.name.clone(),
        prefix: fresh.prefix.clone(),
        note: fresh.note.clone(),
        sealed: hex::encode(sealed),
        at: now(),
    };
    session
        .insert(slot_of.key(), slot)
        .await
        .map_err(|e| internal("stashing a new key", e))?;
    cookies::set_for(jar, slot_of.cookie(), hex::encode(pad), KEEP);
    Ok(())
}

/// Takes the new key waiting to be shown, if both halves are there and it is recent. Both halves
/// are removed whatever happens, so it is shown at most once.
pub async fn take(
    slot_of: Slot,
    session: &Session,
    jar: &Cookies,
) -> Result<Option<FreshKey>, PortalError> {
    let stored = session
        .remove_value(slot_of.key())
        .await
        .map_err(|e| internal("reading a new key", e))?;
    let pad = cookies::get(jar, slot_of.cookie());
    if pad.is_some() {
        cookies::remove(jar, slot_of.cookie());
    }
    let slot = stored.and_then(|v| serde_json::from_value::<Sealed>(v).ok());
    let (Some(slot), Some(pad)) = (slot, pad) else {
        return Ok(None);
    };
    if now() - slot.at > KEEP.whole_seconds() {
        return Ok(None);
    }
    Ok(unseal(&slot.sealed, &pad).map(|secret| FreshKey {
        name: slot.name,
        prefix: slot.prefix,
        secret,
        note: slot.note,
    }))
}

fn unseal(sealed: &str, pad: &str) -> Option<String> {
    let (sealed, pad) = (hex::decode(sealed).ok()?, hex::decode(pad).ok()?);
    if sealed.len() != pad.len() {
        return None;
    }
    String::from_utf8(sealed.iter().zip(&pad).map(|(s, p)| s ^ p).collect()).ok()
}

#[cfg(test)]
mod tests {
    use super::unseal;

    #[test]
    fn a_pad_unseals_only_its_own_secret() {
        let secret = b"tf-abc";
        let pad = [7u8, 200, 3, 99, 1, 0];
        let sealed: Vec<u8> = secret.iter().zip(&pad).map(|(s, p)| s ^ p).collect();
        let (sealed, pad) = (hex::encode(sealed), hex::encode(pad));
        assert_eq!(unseal(&sealed, &pad).as_deref(), Some("tf-abc"));
        assert_ne!(unseal(&sealed, "00c80363010000").as_deref(), Some("tf-abc"));
        assert_eq!(unseal(&sealed, "07"), None);
        assert_ne!(sealed, hex::encode(secret));
    }
}
