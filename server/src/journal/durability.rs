//! How durable a usage event is when its response ends (`--journal-durability`).

use std::str::FromStr;

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
