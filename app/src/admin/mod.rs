//! Server functions of the admin pages (`/admin/tenants`, `/admin/users`, `/admin/audit`,
//! `/admin/ops`, `/admin/fleet`, `/admin/economics`, `/admin/prices`, `/admin/invoices`). Every one requires a signed-in admin (anybody else: 403 and nothing read or
//! changed); forms check CSRF first and act through `tf_core::operator`, the code path of
//! `tokenfactory admin`, which writes each action's audit row (actor: the admin's email and
//! address) in the action's transaction. Lists are keyset-paginated in SQL.

pub mod audit;
pub mod billing;
pub mod economics;
pub mod fleet;
pub mod ops;
pub mod page;
#[cfg(feature = "ssr")]
pub mod server;
pub mod tenants;
pub mod users;

/// Rows per page of the admin lists.
pub const PAGE_SIZE: i64 = 50;

/// `1234567` as `1,234,567`, for counts (signed: the database's bigints).
pub fn count(n: i64) -> String {
    crate::money::group_thousands(u64::try_from(n).unwrap_or(0))
}

/// What every admin form does first: the CSRF token (refused: back to `back`), then the admin.
#[cfg(feature = "ssr")]
pub(crate) async fn form(
    token: &str,
    back: &str,
) -> Result<Option<server::AdminForm>, crate::error::PortalError> {
    use crate::ssr::{cookies, csrf, session, Portal};

    let portal = Portal::current()?;
    let s = session::current().await?;
    let jar = cookies::jar().await?;
    if !csrf::verify(&jar, token) {
        return Err(crate::ssr::form::refuse_csrf(&jar, back));
    }
    server::form_after_csrf(portal, s, jar).await
}
