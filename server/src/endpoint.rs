//! The endpoints the gateway serves and forwards to: one enum, shared with `tf_core` (the usage
//! event stores its name).

pub use tf_core::endpoint::Endpoint;
