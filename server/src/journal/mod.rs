//! The local usage journal: every finished usage event is appended here before the response's
//! final bytes leave the gateway, and a shipper moves records to PostgreSQL in batches. Nothing is
//! lost when PostgreSQL is down (the journal grows) or when the process is killed (a restart
//! replays what PostgreSQL did not acknowledge); nothing is counted twice (PostgreSQL's primary
//! key on the request id absorbs a replay).
//!
//! Layout of the journal directory: segments `{seq:016}.journal` of records (`u32` LE payload
//! length, `u32` LE CRC-32 of the payload, the event in binary, `codec`; an older binary wrote
//! JSON, still read), the shipper's `cursor` (segment and offset acknowledged by PostgreSQL), and
//! a `lock` file held by the one process that owns the directory.

pub mod codec;
pub mod durability;
pub mod inflight;
mod mapped;
pub mod metrics;
mod nudge;
pub mod record;
pub mod segment;
pub mod shipper;
pub mod writer;

pub use durability::Durability;
pub use metrics::JournalMetrics;
pub use shipper::Shipper;
pub use writer::{Journal, JournalSink};
