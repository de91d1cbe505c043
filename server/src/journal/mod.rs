//! The local usage journal: every finished usage event is appended here before the response's
//! final bytes leave the gateway, and a shipper moves records to PostgreSQL in batches. Nothing is
//! lost when PostgreSQL is down (the journal grows) or when the process is killed (a restart
//! replays what PostgreSQL did not acknowledge); nothing is counted twice (PostgreSQL's primary
//! key on the request id absorbs a replay).
//!
//! Layout of the journal directory: segments `{seq:016}.journal` of records
//! (`u32` LE payload length, `u32` LE CRC-32 of the payload, JSON payload), the shipper's
//! `cursor` (segment and offset acknowledged by PostgreSQL), and a `lock` file held by the one
//! process that owns the directory.

pub mod metrics;
pub mod record;
pub mod segment;
pub mod shipper;
pub mod writer;

use std::str::FromStr;

pub use metrics::JournalMetrics;
pub use shipper::Shipper;
pub use writer::{Journal, JournalSink};

/// How durable an event is when the response's final bytes leave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// No journal: events go straight to PostgreSQL (tests and benchmarks of the raw path).
    Off,
    /// The record was handed to the OS (survives a gateway crash); a group committer fsyncs
    /// every few milliseconds.
    Process,
    /// The record is on disk (survives power loss); one fsync covers every request waiting.
    Machine,
}

impl FromStr for Durability {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "off" => Ok(Self::Off),
            "process" => Ok(Self::Process),
            "machine" => Ok(Self::Machine),
            _ => Err(format!(
                "unknown durability {s:?}: use process, machine or off"
            )),
        }
    }
}
