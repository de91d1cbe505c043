//! `/admin/economics` (issues 17 and 36): per base, what a million tokens really cost on a UTC
//! day at the duty cycle measured, the last 30 days of duty cycle and margin, who the day's cost
//! is for (`tf_core::economics::attribution`), the floor and idle-policy advisor
//! (`tf_core::economics::advisor`) with its Apply buttons, a what-if computed on the server, and
//! the form that appends a base's cost version. The arithmetic is `tf_core::economics`; the
//! server half is [`server`]. Money is integer micro-units, ratios basis points (10,000 = 100 %),
//! each rounded once, half-up.

pub mod advisor;
pub mod attribution;
pub mod chart;
pub mod frontier;
pub mod page;
pub mod policy;
#[cfg(feature = "ssr")]
pub mod server;

use leptos::prelude::*;
use serde::{Deserialize, Serialize};

use crate::error::PortalError;

/// The page's query string: the day (`YYYY-MM-DD`, UTC; default today) and the what-if's base,
/// price (micro-units per million tokens), floor (replicas) and expected tokens per day.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EconomicsParams {
    pub day: Option<String>,
    pub base: Option<String>,
    pub price: Option<String>,
    pub floor: Option<String>,
    pub tokens: Option<String>,
    /// The advisor's window in whole UTC days before today (default 30).
    pub days: Option<String>,
    /// The advisor's budget: `share` (at most `max_share` of requests wait for a wake, a
    /// fraction such as `0.01`; the default) or `starts` (at most `max_starts` wakes a day).
    pub budget: Option<String>,
    pub max_share: Option<String>,
    pub max_starts: Option<String>,
}

/// A cost version as shown.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CostItem {
    /// `YYYY-MM-DD HH:MM:SS` UTC.
    pub effective_from: String,
    pub gpu_micros_per_hour: i64,
    pub gpus_per_replica: i64,
    pub peak_tokens_per_second: i64,
    pub created_by: String,
    /// The peak was measured (`admin economics measure-peak`), not configured.
    pub peak_measured: bool,
}

/// The figures of one base and day: `tf_core::economics::Figures` itself (`None`: no denominator).
pub use tf_types::economics::Figures;

/// One day of a base's 30-day chart.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChartDay {
    /// `YYYY-MM-DD`.
    pub day: String,
    pub duty_cycle_bp: Option<i64>,
    pub margin_bp: Option<i64>,
}

/// A base on the chosen day, its cost versions and its last 30 days.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BaseEconomics {
    pub base: String,
    /// The version in effect at the end of the day (`None`: no cost set yet).
    pub cost: Option<CostItem>,
    pub versions: Vec<CostItem>,
    pub figures: Figures,
    pub chart: Vec<ChartDay>,
    /// Who the day's cost is for (`None`: nothing to split that day).
    pub attribution: Option<attribution::AttributionView>,
    /// The advisor's replay of the base's window (templated, costed bases), or why not.
    pub advisor: Option<advisor::AdvisorView>,
}

/// The capacity weights of the token kinds, in thousandths, as the data layer counts load
/// (`tf_core::economics::Served::load_milli`): the duty cycle, the idle floor, the advisor's
/// replicas and the attribution's used cost all use them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Weights {
    pub fresh_prompt_milli: i64,
    pub cached_prompt_milli: i64,
    pub completion_milli: i64,
}

/// What the what-if comes to.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WhatIfOutcome {
    pub replicas: i64,
    pub figures: Figures,
    pub break_even_duty_cycle_bp: Option<i64>,
    pub break_even_tokens_per_day: Option<i64>,
}

/// The what-if form as filled in (echoed), and its outcome when it could be computed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WhatIfView {
    pub base: String,
    pub price: String,
    pub floor: String,
    pub tokens: String,
    pub outcome: Option<WhatIfOutcome>,
    /// Why there is no outcome.
    pub notice: Option<String>,
}

/// Everything `/admin/economics` shows.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EconomicsView {
    /// `YYYY-MM-DD`, the day shown.
    pub day: String,
    pub bases: Vec<BaseEconomics>,
    /// Every base of the catalog (the cost form's choices).
    pub catalog: Vec<String>,
    pub what_if: WhatIfView,
    /// Why part of the query string was ignored.
    pub notice: Option<String>,
    pub weights: Weights,
    /// The advisor's budget form as filled in.
    pub budget: advisor::BudgetView,
}

/// The economics of every base on a day, and a what-if.
#[server(prefix = "/api", endpoint = "admin_economics", input = leptos::server_fn::codec::GetUrl)]
pub async fn admin_economics(
    #[server(default)] params: EconomicsParams,
) -> Result<EconomicsView, PortalError> {
    use crate::admin::economics::server as economics;
    use crate::admin::server as admin;
    use crate::ssr::{internal, Portal};

    let portal = Portal::current()?;
    admin::required(&portal).await?;
    economics::view(&portal.deps.pool, &params, time::OffsetDateTime::now_utc())
        .await
        .map_err(|e| internal("loading the economics", e))
}

/// Appends a cost version of a base (effective now, or from the given UTC time), audited.
#[server(prefix = "/api", endpoint = "admin_set_base_cost")]
pub async fn admin_set_base_cost(
    #[server(default)] csrf: String,
    #[server(default)] base: String,
    #[server(default)] gpu_micros_per_hour: String,
    #[server(default)] gpus_per_replica: String,
    #[server(default)] peak_tokens_per_second: String,
    #[server(default)] effective_from: String,
) -> Result<(), PortalError> {
    use crate::admin::economics::server as economics;
    use crate::ssr::admin_flash::AdminFlash;
    use crate::ssr::internal;
    use tf_core::accounts::AccountError;

    const BACK: &str = "/admin/economics";
    let Some(f) = super::form(&csrf, BACK).await? else {
        return Ok(());
    };
    let now = time::OffsetDateTime::now_utc();
    let number = |s: &str| s.trim().parse::<i64>().ok();
    let parsed = (
        number(&gpu_micros_per_hour),
        number(&gpus_per_replica).and_then(|n| i32::try_from(n).ok()),
        number(&peak_tokens_per_second),
        economics::parse_from(&effective_from, now),
    );
    let (Some(gpu), Some(gpus), Some(peak), Some(from)) = parsed else {
        return f.back(BACK, Some(AdminFlash::CostInvalid));
    };
    let cost = tf_core::db::economics::NewCost {
        base_model: base.trim(),
        effective_from: from,
        gpu_micros_per_hour: gpu,
        gpus_per_replica: gpus,
        peak_tokens_per_second: peak,
        created_by: &f.user.email,
    };
    match tf_core::operator::set_base_cost(&f.portal.deps.pool, &f.actor(), &cost).await {
        Ok(_) => f.back(BACK, Some(AdminFlash::CostSaved)),
        Err(AccountError::Invalid(_)) => f.back(BACK, Some(AdminFlash::CostInvalid)),
        Err(AccountError::Exists(_)) => f.back(BACK, Some(AdminFlash::CostExists)),
        Err(AccountError::NotFound(_)) => f.back(BACK, Some(AdminFlash::NoSuchBase)),
        Err(e) => Err(internal("setting a base's cost", e)),
    }
}
