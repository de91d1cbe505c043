//! Plain data types shared by `tf-core` (which computes them) and `tf-app` (which shows them,
//! also in a browser build where `tf-core` cannot go). Each is defined here once and re-exported
//! by `tf-core` where it belongs, so there is no copy to keep in step.

pub mod economics;
