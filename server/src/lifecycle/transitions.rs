//! What an owner's command does to an adapter's desired and observed state: the one table both
//! surfaces (API and portal) go through. The controller does the rest (`starting` -> `ready`,
//! `stopping` -> `stopped`, `deleted` -> gone).

/// An owner's command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Start,
    Stop,
    Delete,
}

impl Command {
    pub fn verb(self) -> &'static str {
        match self {
            Self::Start => "start",
            Self::Stop => "stop",
            Self::Delete => "delete",
        }
    }
}

/// The new (desired, state) of an adapter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Next {
    pub desired: &'static str,
    pub state: &'static str,
}

/// `Ok(None)`: nothing to change (the command is already in effect). `Err`: refused, with why.
pub fn next(command: Command, state: &str, desired: &str) -> Result<Option<Next>, String> {
    let to = |desired, state| Ok(Some(Next { desired, state }));
    if desired == "deleted" {
        return match command {
            Command::Delete => Ok(None),
            _ => Err("the model is being deleted".into()),
        };
    }
    match (command, state) {
        (_, "uploading" | "validating") if command != Command::Stop => {
            Err("the model is still being uploaded and validated".into())
        }
        (Command::Start, "rejected") => {
            Err("the model was rejected at validation; upload a corrected version".into())
        }
        (Command::Start, "ready" | "starting" | "unloading" | "unloaded" | "reloading")
            if desired == "running" =>
        {
            Ok(None)
        }
        (Command::Start, "ready") => to("running", "ready"),
        (Command::Start, _) => to("running", "starting"),
        (Command::Stop, "ready" | "starting" | "unloading" | "reloading") => {
            to("stopped", "stopping")
        }
        // Idle and off the engines already: nothing to deregister.
        (Command::Stop, "unloaded") => to("stopped", "stopped"),
        (Command::Stop, "stopping") if desired == "running" => to("stopped", "stopping"),
        (Command::Stop, "failed") => to("stopped", "stopped"),
        (Command::Stop, _) => Ok(None),
        (Command::Delete, "ready" | "starting" | "stopping" | "unloading" | "reloading") => {
            to("deleted", "stopping")
        }
        (Command::Delete, s) => Ok(Some(Next {
            desired: "deleted",
            state: static_state(s),
        })),
    }
}

/// The observed states, as `'static` names.
pub const STATES: [&str; 11] = [
    "uploading",
    "validating",
    "rejected",
    "stopped",
    "starting",
    "ready",
    "stopping",
    "failed",
    "unloading",
    "unloaded",
    "reloading",
];

fn static_state(s: &str) -> &'static str {
    STATES
        .iter()
        .find(|x| **x == s)
        .copied()
        .unwrap_or("stopped")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_stop_delete_walk_the_states() {
        let n = |c, s, d| next(c, s, d).unwrap_or_else(|e| unreachable!("{e}"));
        assert_eq!(
            n(Command::Start, "stopped", "stopped").map(|n| n.state),
            Some("starting")
        );
        assert_eq!(n(Command::Start, "starting", "running"), None);
        assert_eq!(
            n(Command::Start, "failed", "running").map(|n| n.state),
            Some("starting")
        );
        assert_eq!(
            n(Command::Stop, "ready", "running").map(|n| n.state),
            Some("stopping")
        );
        assert_eq!(n(Command::Stop, "stopped", "stopped"), None);
        assert_eq!(n(Command::Stop, "rejected", "stopped"), None);
        let d = n(Command::Delete, "ready", "running").unwrap_or_else(|| unreachable!());
        assert_eq!((d.desired, d.state), ("deleted", "stopping"));
        let d = n(Command::Delete, "rejected", "stopped").unwrap_or_else(|| unreachable!());
        assert_eq!((d.desired, d.state), ("deleted", "rejected"));
        assert_eq!(n(Command::Delete, "stopping", "deleted"), None);
    }

    #[test]
    fn an_idle_adapter_is_still_running_to_its_owner() {
        let n = |c, s, d| next(c, s, d).unwrap_or_else(|e| unreachable!("{e}"));
        for idle in ["unloading", "unloaded", "reloading"] {
            assert_eq!(n(Command::Start, idle, "running"), None, "{idle}");
            let d = n(Command::Delete, idle, "running").unwrap_or_else(|| unreachable!());
            assert_eq!(d.desired, "deleted", "{idle}");
        }
        let s = |state| n(Command::Stop, state, "running").map(|n| (n.desired, n.state));
        assert_eq!(s("unloaded"), Some(("stopped", "stopped")));
        assert_eq!(s("unloading"), Some(("stopped", "stopping")));
        assert_eq!(s("reloading"), Some(("stopped", "stopping")));
        let d = n(Command::Delete, "unloaded", "running").unwrap_or_else(|| unreachable!());
        assert_eq!((d.desired, d.state), ("deleted", "unloaded"));
    }

    #[test]
    fn refusals_say_why() {
        assert!(next(Command::Start, "rejected", "stopped").is_err());
        assert!(next(Command::Start, "validating", "stopped").is_err());
        assert!(next(Command::Delete, "uploading", "stopped").is_err());
        assert!(next(Command::Start, "stopping", "deleted").is_err());
    }
}
