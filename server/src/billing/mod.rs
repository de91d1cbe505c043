//! Billing on the server: the rater (a background task under one leader) and the export formats
//! of rated usage, and the rating-lag gauges. The money itself is computed in PostgreSQL (`tf_core::db::billing`).

pub mod export;
pub mod lag;
pub mod rater;
