//! API keys: `tf-` followed by 32 random bytes in URL-safe base64. Only the SHA-256 of the whole
//! key is stored; the first characters are kept as a visible prefix so people can tell keys apart.

use base64::Engine;
use rand::RngCore;
use sha2::{Digest, Sha256};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::db;
pub use crate::tenancy::ApiKey;

/// Every key starts with this, so a leaked key is recognisable by secret scanners.
pub const KEY_PREFIX: &str = "tf-";
/// How many characters of the key (after `tf-`) are kept in clear as its visible prefix.
const VISIBLE_CHARS: usize = 8;

/// A freshly generated key. `secret` is shown to the person once and never stored.
pub struct NewKey {
    pub secret: String,
    pub prefix: String,
    pub sha256: [u8; 32],
}

impl std::fmt::Debug for NewKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NewKey")
            .field("prefix", &self.prefix)
            .field("secret", &"*****")
            .finish()
    }
}

/// SHA-256 of a presented key: the lookup key of the `api_keys` table.
pub fn hash_secret(secret: &str) -> [u8; 32] {
    Sha256::digest(secret.as_bytes()).into()
}

/// Generates a new random key.
pub fn generate() -> NewKey {
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    let body = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
    let secret = format!("{KEY_PREFIX}{body}");
    let prefix = secret[..KEY_PREFIX.len() + VISIBLE_CHARS].to_owned();
    NewKey {
        sha256: hash_secret(&secret),
        prefix,
        secret,
    }
}

/// Issues a key for `tenant_id`; returns the stored row and the secret to show once.
pub async fn issue(
    pool: impl sqlx::PgExecutor<'_>,
    tenant_id: Uuid,
    name: &str,
) -> sqlx::Result<(ApiKey, String)> {
    let key = generate();
    let new = db::keys::NewKey {
        tenant_id,
        name,
        prefix: &key.prefix,
        sha256: &key.sha256,
    };
    let row = db::keys::insert(pool, &new).await?;
    Ok((row, key.secret))
}

/// The default cap on a tenant's working keys (`--max-keys-per-tenant`): enough for any real
/// use, and it keeps pages and caches that list keys cheap.
pub const DEFAULT_MAX_KEYS_PER_TENANT: u32 = 100;

/// Why [`issue_capped`] issued no key.
#[derive(Debug, thiserror::Error)]
pub enum IssueError {
    /// The tenant already has `cap` working keys.
    #[error("a tenant may have at most {cap} working keys; revoke one first")]
    TooMany { cap: u32 },
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// Issues a key like [`issue`] unless the tenant already has `cap` working keys (not revoked,
/// not past a grace period); concurrent creations of one tenant are serialized on its row.
pub async fn issue_capped(
    pool: &PgPool,
    tenant_id: Uuid,
    name: &str,
    cap: u32,
) -> Result<(ApiKey, String), IssueError> {
    let mut tx = pool.begin().await?;
    let issued = issue_capped_in(&mut tx, tenant_id, name, cap).await?;
    tx.commit().await?;
    Ok(issued)
}

/// [`issue_capped`] inside the caller's transaction (the member's audited action).
pub async fn issue_capped_in(
    conn: &mut PgConnection,
    tenant_id: Uuid,
    name: &str,
    cap: u32,
) -> Result<(ApiKey, String), IssueError> {
    db::keys::lock_tenant(conn, tenant_id).await?;
    // INVARIANT: a tenant never gets a key past its cap (test: portal_keys, key cap).
    if db::keys::count_active(&mut *conn, tenant_id).await? >= i64::from(cap) {
        return Err(IssueError::TooMany { cap });
    }
    Ok(issue(conn, tenant_id, name).await?)
}

/// Revokes the key with this visible prefix (or whole secret) within `tenant_id`'s keys, or any
/// tenant's when `tenant_id` is `None` (operators only). Returns whether a key was revoked.
pub async fn revoke(
    pool: &PgPool,
    tenant_id: Option<Uuid>,
    prefix_or_key: &str,
) -> sqlx::Result<bool> {
    db::keys::revoke_prefix_of(pool, tenant_id, visible_prefix(prefix_or_key)).await
}

/// The visible prefix of a whole key, or the argument itself when it already is a prefix.
/// Operators type this, so it may be anything: a string whose cut would fall inside a character
/// cannot be a key (keys are ASCII) and is returned whole, to match nothing.
pub fn visible_prefix(prefix_or_key: &str) -> &str {
    let n = KEY_PREFIX.len() + VISIBLE_CHARS;
    match prefix_or_key.get(..n) {
        Some(prefix) if prefix_or_key.starts_with(KEY_PREFIX) && prefix_or_key.len() > n => prefix,
        _ => prefix_or_key,
    }
}

/// Revokes the key with this id (any tenant's; operators only). Returns the revoked key, or
/// `None` when no unrevoked key has that id.
pub async fn revoke_by_id(pool: &PgPool, id: Uuid) -> sqlx::Result<Option<ApiKey>> {
    db::keys::revoke_by_id(pool, id).await
}

/// Revokes the unrevoked key with this visible prefix (or whole key) of any tenant (operators
/// only). Returns the revoked key, or `None` when there is none.
pub async fn revoke_by_prefix(pool: &PgPool, prefix_or_key: &str) -> sqlx::Result<Option<ApiKey>> {
    db::keys::revoke_by_prefix(pool, visible_prefix(prefix_or_key)).await
}

/// Longest key name accepted (characters).
pub const MAX_NAME_CHARS: usize = 100;

/// A key name as typed, trimmed; `None` when empty, too long or holding control characters.
pub fn clean_name(name: &str) -> Option<&str> {
    let name = name.trim();
    let ok = !name.is_empty()
        && name.chars().count() <= MAX_NAME_CHARS
        && !name.chars().any(char::is_control);
    ok.then_some(name)
}

/// What a rotation made: the new key (its secret shown once) and when the old one stops working.
pub struct Rotated {
    pub id: Uuid,
    pub name: String,
    pub prefix: String,
    pub secret: String,
    /// The old key's visible prefix (for the audit row).
    pub old_prefix: String,
    pub old_ends_at: time::OffsetDateTime,
}

impl std::fmt::Debug for Rotated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rotated")
            .field("prefix", &self.prefix)
            .field("secret", &"*****")
            .finish_non_exhaustive()
    }
}

/// Rotates the tenant's working key `id`: a new key named after it, and the old one refused
/// `grace_secs` from now (0: at once), in one transaction. `None` (nothing changed) when the
/// tenant has no working key with that id.
pub async fn rotate(
    pool: &PgPool,
    tenant_id: Uuid,
    id: Uuid,
    grace_secs: i64,
) -> sqlx::Result<Option<Rotated>> {
    let mut tx = pool.begin().await?;
    let rotated = rotate_in(&mut tx, tenant_id, id, grace_secs).await?;
    tx.commit().await?;
    Ok(rotated)
}

/// [`rotate`] inside the caller's transaction (the member's audited action).
pub async fn rotate_in(
    tx: &mut PgConnection,
    tenant_id: Uuid,
    id: Uuid,
    grace_secs: i64,
) -> sqlx::Result<Option<Rotated>> {
    let Some(old) = db::keys::lock_working_of_tenant(tx, tenant_id, id).await? else {
        return Ok(None);
    };
    let taken = db::keys::list_of_tenant(&mut *tx, tenant_id).await?;
    let name = rotated_name(&old.name, taken.iter().map(|k| k.name.as_str()));
    let key = generate();
    let new = db::keys::NewKey {
        tenant_id,
        name: &name,
        prefix: &key.prefix,
        sha256: &key.sha256,
    };
    let new_id = db::keys::insert_in(tx, &new).await?;
    let old_ends_at = db::keys::retire_in(tx, tenant_id, id, grace_secs).await?;
    Ok(Some(Rotated {
        id: new_id,
        name,
        prefix: key.prefix,
        secret: key.secret,
        old_prefix: old.prefix,
        old_ends_at,
    }))
}

/// Appended to a rotated key's name (once: rotating a rotated key keeps one suffix, numbered
/// from the second rotation on: `ci (rotated)`, `ci (rotated 2)`, `ci (rotated 3)`).
pub const ROTATED_SUFFIX: &str = " (rotated)";

/// `name` without its rotation suffix, and the suffix's number (1 for ` (rotated)`, `n` for
/// ` (rotated n)`, 0 for none).
fn rotation_of(name: &str) -> (&str, u32) {
    if let Some(base) = name.strip_suffix(ROTATED_SUFFIX) {
        return (base, 1);
    }
    let numbered = name.strip_suffix(')').and_then(|s| {
        let (base, n) = s.rsplit_once(" (rotated ")?;
        let n = n
            .parse::<u32>()
            .ok()
            .filter(|n| *n >= 2 && !n.to_string().starts_with('0'))?;
        Some((base, n))
    });
    numbered.unwrap_or((name, 0))
}

/// The name of the key that replaces `old`: its base name with the next rotation number not yet
/// used by any of the tenant's keys (`taken`), so two rotations never give two keys one name.
pub fn rotated_name<'a>(old: &str, taken: impl IntoIterator<Item = &'a str>) -> String {
    let (base, own) = rotation_of(old);
    let used = taken
        .into_iter()
        .map(rotation_of)
        .filter(|(b, _)| *b == base)
        .map(|(_, n)| n)
        .max()
        .unwrap_or(0);
    let next = used.max(own).saturating_add(1);
    let name = if next == 1 {
        format!("{base}{ROTATED_SUFFIX}")
    } else {
        format!("{base} (rotated {next})")
    };
    // The suffix may take a name past the limit: cut the base, never the suffix.
    if name.chars().count() <= MAX_NAME_CHARS {
        return name;
    }
    let suffix = &name[base.len()..];
    let room = MAX_NAME_CHARS.saturating_sub(suffix.chars().count());
    format!("{}{suffix}", base.chars().take(room).collect::<String>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_unique_prefixed_and_hash_matches() {
        let a = generate();
        let b = generate();
        assert_ne!(a.secret, b.secret);
        assert!(a.secret.starts_with("tf-"));
        assert_eq!(a.secret.len(), 3 + 43);
        assert_eq!(a.prefix, &a.secret[..11]);
        assert_eq!(a.sha256, hash_secret(&a.secret));
        assert_eq!(visible_prefix(&a.secret), a.prefix);
        assert!(!format!("{a:?}").contains(&a.secret));
    }

    #[test]
    fn rotations_number_their_names_and_never_repeat_one() {
        assert_eq!(rotated_name("ci", ["ci"]), "ci (rotated)");
        // Rotating the original again while its first rotation is still listed.
        assert_eq!(rotated_name("ci", ["ci", "ci (rotated)"]), "ci (rotated 2)");
        assert_eq!(
            rotated_name("ci (rotated)", ["ci", "ci (rotated)"]),
            "ci (rotated 2)"
        );
        assert_eq!(
            rotated_name("ci (rotated 2)", ["ci (rotated 2)", "other (rotated 7)"]),
            "ci (rotated 3)"
        );
        // Only the same base counts; a name that merely looks numbered is a base of its own.
        assert_eq!(
            rotated_name("a (rotated 01)", ["a (rotated 01)"]),
            "a (rotated 01) (rotated)"
        );
        let long = "x".repeat(MAX_NAME_CHARS);
        let r = rotated_name(&long, [long.as_str()]);
        assert_eq!(r.chars().count(), MAX_NAME_CHARS);
        assert!(r.ends_with(" (rotated)"));
    }

    #[test]
    fn names_are_trimmed_and_bounded() {
        assert_eq!(clean_name("  ci  "), Some("ci"));
        assert_eq!(clean_name("   "), None);
        assert_eq!(clean_name("a\u{7}b"), None);
        assert_eq!(
            clean_name(&"é".repeat(MAX_NAME_CHARS)).map(str::len),
            Some(200)
        );
        assert_eq!(clean_name(&"x".repeat(MAX_NAME_CHARS + 1)), None);
    }

    #[test]
    fn a_non_ascii_prefix_does_not_panic() {
        // "tf-" + 7 ASCII + "é" (two bytes): byte 11 falls inside the "é"; likewise after "tf-a".
        for given in ["tf-abcdefgéxyz", "tf-aééééééééé", "é", "tf-", ""] {
            assert_eq!(visible_prefix(given), given);
        }
        assert_eq!(visible_prefix("tf-abcdefghé"), "tf-abcdefgh");
    }
}
