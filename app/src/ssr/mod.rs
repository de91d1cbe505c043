//! Server-only half of the portal: the dependencies the server functions run with, the session
//! helpers (signed-in user, CSRF token, flash message), the session store, the login throttle and
//! the redirect rules.
//! Nothing here is compiled into a browser bundle.

pub mod admin;
pub mod billing_admin;
pub mod client_addr;
pub mod cookies;
pub mod csp;
pub mod csrf;
pub mod economics;
pub mod form;
pub mod invoices;
pub mod member;
pub mod model_flash;
pub mod model_form;
pub mod portal;
pub mod reveal;
pub mod session;
pub mod store;
pub mod throttle;
pub mod usage;

pub use csp::{content_security_policy, set_page_policy};
pub(crate) use portal::internal;
pub use portal::{Portal, PortalDeps};
pub use tf_core::redis_slot::RedisSlot;
pub use throttle::LoginThrottle;
