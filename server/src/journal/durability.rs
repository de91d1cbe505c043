//! How durable a usage event is when its response ends (`--journal-durability`).

use std::str::FromStr;

/// How often, in milliseconds, the group committer fsyncs in `process` mode while writes come
/// (`--journal-group-commit-ms`): what a power cut (not a crash: the page cache survives that)
/// may lose. 50, not 5: each `fdatasync` flushes the device's cache and write-protects the
/// mapped pages again (a TLB shootdown on every core), and 200 of them a second were the largest
/// kernel cost of a request under load (README, "The group commit's interval"). `machine` is the
/// level for power-loss safety.
pub const DEFAULT_GROUP_COMMIT_MS: u64 = 50;

/// How durable an event is when the response's final bytes leave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// No journal: events go straight to PostgreSQL (tests and benchmarks of the raw path).
    Off,
    /// The record was handed to the OS (survives a gateway crash); a group committer fsyncs
    /// every group-commit interval ([`DEFAULT_GROUP_COMMIT_MS`]) while writes come.
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
