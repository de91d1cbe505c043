//! What every feature's server-only code shares: the dependencies the server functions run with,
//! the session helpers (signed-in user, CSRF token, flash message), the session store, the login
//! throttle and the redirect rules. Features' own server code is each feature's `server` child.
//! Nothing here is compiled into a browser bundle.

pub mod admin_flash;
pub mod client_addr;
pub mod cookies;
pub mod csp;
pub mod csrf;
pub mod form;
pub mod member;
pub mod model_flash;
pub mod model_form;
pub mod portal;
pub mod session;
pub mod store;
pub mod throttle;

pub use csp::{content_security_policy, set_page_policy};
pub(crate) use portal::internal;
pub use portal::{Portal, PortalDeps};
pub use tf_core::redis_slot::RedisSlot;
pub use throttle::LoginThrottle;
