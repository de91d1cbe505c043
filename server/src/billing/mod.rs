//! Billing on the server: the rater (a background task under one leader) and the export formats
//! of rated usage. The money itself is computed in PostgreSQL (`tf_core::db::billing`).

pub mod export;
pub mod rater;
