//! CSRF tokens, double-submit: a random 32-byte token in the browser's `tf_csrf` cookie (see
//! [`super::cookies`] for its attributes), embedded as the hidden `csrf` field of every form and
//! checked in constant time by every state-changing server function. A cross-site page can neither
//! read the cookie nor set it, so it cannot fill in the field (and under SameSite=Lax its POST
//! carries no cookie anyway). Keeping the token in a cookie rather than in the
//! session means an anonymous visitor costs no stored session. A missing cookie, a missing field
//! or a mismatch all refuse; nothing is changed before the check passes. The token is replaced
//! when the session changes hands (login, logout).

use rand::RngCore;
use subtle::ConstantTimeEq;
use tower_cookies::Cookies;

use super::cookies::{self, CSRF_COOKIE};

fn fresh_token() -> String {
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    hex::encode(bytes)
}

fn well_formed(token: &str) -> bool {
    token.len() == 64 && token.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Returns the browser's token, setting a new one when it has none (or a malformed one).
pub fn ensure_token(jar: &Cookies) -> String {
    match cookies::get(jar, CSRF_COOKIE).filter(|t| well_formed(t)) {
        Some(token) => token,
        None => rotate_token(jar),
    }
}

/// Replaces the token, for example when the session changes hands at login.
pub fn rotate_token(jar: &Cookies) -> String {
    let token = fresh_token();
    cookies::set(jar, CSRF_COOKIE, token.clone());
    token
}

/// Whether the request carried a token cookie at all (a visitor of this portal, not a cookie-less
/// cross-site post).
pub fn has_token(jar: &Cookies) -> bool {
    cookies::get(jar, CSRF_COOKIE).is_some()
}

/// Whether `given` is the browser's token. Compared in constant time so response timing says
/// nothing about how much of a guess was right.
pub fn verify(jar: &Cookies, given: &str) -> bool {
    match cookies::get(jar, CSRF_COOKIE) {
        Some(stored) if well_formed(&stored) && !given.is_empty() => {
            stored.as_bytes().ct_eq(given.as_bytes()).into()
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::{fresh_token, well_formed};

    #[test]
    fn tokens_are_64_hex_chars_and_differ() {
        let (a, b) = (fresh_token(), fresh_token());
        assert!(well_formed(&a));
        assert_ne!(a, b);
        assert!(!well_formed("00"));
    }
}
