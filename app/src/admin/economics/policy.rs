//! One candidate serving policy's outcome as `/admin/economics` shows it: shared by the advisor's
//! table ([`super::advisor`]) and its frontier chart ([`super::frontier`]).

use serde::{Deserialize, Serialize};

/// One candidate policy's outcome over the window, as shown.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyRow {
    pub floor: i64,
    /// `None`: always on.
    pub idle_after_secs: Option<i64>,
    pub gpu_cost_micros: i64,
    pub idle_floor_cost_micros: i64,
    pub cold_starts: i64,
    pub waited_requests: i64,
    /// Of all requests, in parts per million.
    pub waited_share_ppm: i64,
    pub added_wait_ms: i64,
    pub duty_cycle_bp: Option<i64>,
    pub margin_micros: i64,
    pub margin_bp: Option<i64>,
    /// No other policy is both cheaper and has fewer cold starts.
    pub frontier: bool,
    pub recommended: bool,
    /// The base's policy now.
    pub current: bool,
    /// Keeps to the budget.
    pub within: bool,
}

impl PolicyRow {
    /// `5m`, `4h`, `always on` (as `admin economics advise` prints it).
    pub fn idle_label(&self) -> String {
        match self.idle_after_secs {
            None => "always on".to_owned(),
            Some(s) if s % 3_600 == 0 => format!("{}h", s / 3_600),
            Some(s) if s % 60 == 0 => format!("{}m", s / 60),
            Some(s) => format!("{s}s"),
        }
    }

    /// `floor 1 · 5m`.
    pub fn label(&self) -> String {
        format!("floor {} · {}", self.floor, self.idle_label())
    }
}
