//! The portal's shared data: what server functions return to pages and the messages users see.
//! It imports neither the server functions ([`crate::api`]) nor the server-only half
//! ([`crate::ssr`]), so both, and the pages, can use it.

use serde::{Deserialize, Serialize};

/// Shown for an unknown email and for a wrong password alike, so emails cannot be probed.
pub const INVALID_CREDENTIALS: &str = "Invalid email or password.";
/// Shown when a member of a suspended tenant signs in or has a session.
pub const SUSPENDED: &str = "This tenant is suspended.";
/// Longest email or password looked at; longer input is refused before any hashing.
pub const MAX_INPUT_LEN: usize = 1024;

/// Who may see a page.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Access {
    /// The login page: anyone; a signed-in user is sent to their home.
    Public,
    /// The tenant home: signed-in tenant members; admins are sent to `/admin`.
    Tenant,
    /// The admin pages: admins only; members get 403.
    Admin,
    /// The not-found page: anyone, signed in or not; nobody is redirected, so the page keeps its
    /// 404 and a signed-in user keeps their navigation.
    Anyone,
}

/// What the page should do with the response being rendered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PageStatus {
    /// Render the page.
    Show,
    /// A redirect was set; render nothing.
    Redirect,
    /// 403 was set; render the refusal.
    Forbidden,
}

/// The signed-in user as pages show them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Viewer {
    /// Login email, shown in the top bar.
    pub email: String,
    /// Whether the user operates the platform.
    pub admin: bool,
    /// The tenant's display name (members only).
    pub tenant: Option<String>,
}

/// This replica's usage-journal figures, for the admin home (counts since start-up).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpsSnapshot {
    /// Usage events appended to the local journal.
    pub journaled: u64,
    /// Usage events acknowledged by PostgreSQL.
    pub shipped: u64,
    /// Journal bytes PostgreSQL has not acknowledged yet.
    pub backlog_bytes: u64,
    /// Age of the oldest unshipped event, in milliseconds.
    pub ship_lag_ms: u64,
    /// Failed shipping attempts (PostgreSQL unreachable).
    pub ship_failures: u64,
}

/// This replica's requests held for a wake, for `/admin/fleet` (counts since start-up): the time
/// from a cold request's arrival to its first token (a stream's first content chunk, a whole
/// answer's end). The median and p99 are histogram bucket bounds (`tf_gateway_cold_ttft_seconds`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ColdSnapshot {
    pub requests: u64,
    pub last_ms: Option<u64>,
    /// `None` with requests: above the last bound (120 s).
    pub p50_le_ms: Option<u64>,
    pub p99_le_ms: Option<u64>,
}

/// A one-shot message left by a form post.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Notice {
    /// What the page shows.
    pub text: String,
    /// Reports something done (shown in the success style), rather than a refusal or an error.
    pub ok: bool,
}

/// Everything a page needs from the session, fetched once per render.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PageState {
    /// Goes into the hidden `csrf` field of every form on the page.
    pub csrf: String,
    /// A message left by the previous form post, shown once.
    pub flash: Option<Notice>,
    /// The signed-in user, if any.
    pub viewer: Option<Viewer>,
    /// Whether to render.
    pub status: PageStatus,
    /// Operational figures, for admins only.
    pub ops: Option<OpsSnapshot>,
}
