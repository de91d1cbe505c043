//! CSRF tokens: one random 32-byte token per session, embedded as the hidden `csrf` field of every
//! form and checked in constant time by every state-changing server function. A missing session, a
//! missing token or a mismatch all refuse; nothing is changed before the check passes.

use rand::RngCore;
use subtle::ConstantTimeEq;
use tower_sessions::Session;

use super::internal;
use crate::error::PortalError;

/// Session key of the token.
const CSRF_KEY: &str = "csrf";

fn fresh_token() -> String {
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    hex::encode(bytes)
}

/// Returns the session's token, creating it (and so the session and its cookie) on first use.
pub async fn ensure_token(session: &Session) -> Result<String, PortalError> {
    let existing: Option<String> = session
        .get(CSRF_KEY)
        .await
        .map_err(|e| internal("reading the CSRF token", e))?;
    match existing {
        Some(token) => Ok(token),
        None => rotate_token(session).await,
    }
}

/// Replaces the token, for example when the session changes hands at login.
pub async fn rotate_token(session: &Session) -> Result<String, PortalError> {
    let token = fresh_token();
    session
        .insert(CSRF_KEY, &token)
        .await
        .map_err(|e| internal("storing the CSRF token", e))?;
    Ok(token)
}

/// Whether `given` is the session's token. Compared in constant time so response timing says
/// nothing about how much of a guess was right.
pub async fn verify(session: &Session, given: &str) -> bool {
    let stored: Option<String> = session.get(CSRF_KEY).await.ok().flatten();
    match stored {
        Some(stored) if !given.is_empty() => stored.as_bytes().ct_eq(given.as_bytes()).into(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::fresh_token;

    #[test]
    fn tokens_are_64_hex_chars_and_differ() {
        let (a, b) = (fresh_token(), fresh_token());
        assert_eq!(a.len(), 64);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}
