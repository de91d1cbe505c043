//! The advisor's part of `/admin/economics` (issue 36): what each candidate serving policy (floor
//! x idle-after) would have cost over a base's last days, the recommendation within the admin's
//! cold-start budget, and the Apply form (POST with CSRF) that sets a policy through
//! `tf_core::operator::set_serving_policy`, audited with the admin as actor. The replay is
//! `tf_core::economics::advisor`; the page only shows it.

use leptos::prelude::*;
use serde::{Deserialize, Serialize};

use super::frontier::FrontierChart;
use crate::error::PortalError;
use crate::frame::CsrfField;

pub use super::policy::PolicyRow;

/// A base's advice, or why there is none (`notice`, with no rows).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdvisorView {
    /// `YYYY-MM-DD`, the window's first day; it runs `days` whole UTC days to today's start.
    pub first_day: String,
    pub days: i64,
    pub requests: i64,
    pub load_tokens: i64,
    pub revenue_micros: i64,
    pub ceiling: i64,
    pub peak_tokens_per_second: i64,
    /// GPU micro-units per replica-hour (per GPU-hour x GPUs per replica), at the cost version
    /// in effect now.
    pub replica_micros_per_hour: i64,
    pub cold_start_ms: i64,
    /// `measured` (the median wake in the window) or `assumed` (no wake in it).
    pub cold_start_source: String,
    pub wakes: i64,
    pub rows: Vec<PolicyRow>,
    pub notice: Option<String>,
}

impl AdvisorView {
    pub fn recommended(&self) -> Option<&PolicyRow> {
        self.rows.iter().find(|r| r.recommended)
    }

    pub fn current(&self) -> Option<&PolicyRow> {
        self.rows.iter().find(|r| r.current)
    }
}

/// The budget form as filled in (echoed), and what it came to.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BudgetView {
    pub days: String,
    /// `share` or `starts`.
    pub budget: String,
    pub max_share: String,
    pub max_starts: String,
    /// The budget in words.
    pub label: String,
    /// Why part of it was ignored.
    pub notice: Option<String>,
}

/// Where an Apply goes back to: the page with the same advisor query and the base's section.
/// Only values that parse are carried (the rest is dropped), so the address is always the page's.
pub fn back_to(base: &str, days: &str, budget: &str, max_share: &str, max_starts: &str) -> String {
    let digits = |s: &str| !s.is_empty() && s.len() <= 6 && s.bytes().all(|b| b.is_ascii_digit());
    let share = |s: &str| {
        !s.is_empty() && s.len() <= 9 && s.bytes().all(|b| b.is_ascii_digit() || b == b'.')
    };
    let mut query = Vec::new();
    if digits(days) {
        query.push(format!("days={days}"));
    }
    if matches!(budget, "share" | "starts") {
        query.push(format!("budget={budget}"));
    }
    if share(max_share) {
        query.push(format!("max_share={max_share}"));
    }
    if digits(max_starts) {
        query.push(format!("max_starts={max_starts}"));
    }
    let mut to = "/admin/economics".to_owned();
    if !query.is_empty() {
        to.push('?');
        to.push_str(&query.join("&"));
    }
    if !base.is_empty()
        && base
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
    {
        to.push_str("#advisor-");
        to.push_str(base);
    }
    to
}

/// Sets a base's floor and graph idle policy (`idle` in seconds; empty: always on) through
/// `tf_core::operator::set_serving_policy`: one transaction, audited as `fleet.floor` and
/// `fleet.idle_policy` with the admin as actor. Back to the page with a message.
#[server(prefix = "/api", endpoint = "admin_apply_policy")]
#[allow(clippy::too_many_arguments, reason = "one argument per form field")]
pub async fn admin_apply_policy(
    #[server(default)] csrf: String,
    #[server(default)] base: String,
    #[server(default)] floor: String,
    #[server(default)] idle: String,
    #[server(default)] days: String,
    #[server(default)] budget: String,
    #[server(default)] max_share: String,
    #[server(default)] max_starts: String,
) -> Result<(), PortalError> {
    use crate::ssr::admin_flash::AdminFlash;
    use crate::ssr::internal;
    use tf_core::accounts::AccountError;

    let base = base.trim();
    let back = back_to(base, &days, &budget, &max_share, &max_starts);
    let Some(f) = super::super::form(&csrf, &back).await? else {
        return Ok(());
    };
    let floor = floor.trim().parse::<i32>().ok();
    let idle = match idle.trim() {
        "" => Some(None),
        s => s.parse::<i32>().ok().map(Some),
    };
    let (Some(floor), Some(idle)) = (floor, idle) else {
        return f.back(&back, Some(AdminFlash::PolicyInvalid));
    };
    let pool = &f.portal.deps.pool;
    match tf_core::operator::set_serving_policy(pool, &f.actor(), base, floor, idle).await {
        Ok(()) => f.back(&back, Some(AdminFlash::PolicyApplied)),
        Err(AccountError::Invalid(_)) => f.back(&back, Some(AdminFlash::PolicyInvalid)),
        Err(AccountError::NotFound(_)) => f.back(&back, Some(AdminFlash::NoSuchBase)),
        Err(e) => Err(internal("applying a serving policy", e)),
    }
}

fn percent_of_ppm(ppm: i64) -> String {
    super::chart::percent((ppm + 50) / 100)
}

/// Milliseconds of waiting as seconds with one decimal (`1,830.0 s`).
fn wait(ms: i64) -> String {
    let tenths = (ms.max(0) + 50) / 100;
    format!(
        "{}.{} s",
        crate::money::group_thousands(u64::try_from(tenths / 10).unwrap_or(0)),
        tenths % 10
    )
}

/// The budget form (GET: the advice is read-only until a policy is applied).
fn budget_form(b: &BudgetView, base: &str, day: &str) -> AnyView {
    let share = b.budget != "starts";
    let starts = !share;
    view! {
        <form class="filters budget" method="get" action=format!("/admin/economics#advisor-{base}")>
            <input type="hidden" name="day" value=day.to_owned()/>
            <fieldset>
                <legend>"Cold-start budget"</legend>
                <label><input type="radio" name="budget" value="share" checked=share/>
                    "At most this share of requests wait"</label>
                <input type="text" name="max_share" value=b.max_share.clone() size="6"
                    aria-label="max share of requests that wait (0 to 1)"/>
                <label><input type="radio" name="budget" value="starts" checked=starts/>
                    "or at most this many cold starts a day"</label>
                <input type="text" inputmode="numeric" name="max_starts" value=b.max_starts.clone()
                    size="4" aria-label="max cold starts a day"/>
            </fieldset>
            <label>"Days"<input type="text" inputmode="numeric" name="days" value=b.days.clone() size="4"/></label>
            <button type="submit">"Advise"</button>
        </form>
    }
    .into_any()
}

fn apply_form(base: &str, r: &PolicyRow, b: &BudgetView, csrf: String) -> AnyView {
    let apply = ServerAction::<AdminApplyPolicy>::new();
    let idle = r.idle_after_secs.map(|s| s.to_string()).unwrap_or_default();
    let fields = [
        ("base", base.to_owned()),
        ("floor", r.floor.to_string()),
        ("idle", idle),
        ("days", b.days.clone()),
        ("budget", b.budget.clone()),
        ("max_share", b.max_share.clone()),
        ("max_starts", b.max_starts.clone()),
    ];
    let label = format!("Apply {} to {base}", r.label());
    view! {
        <ActionForm action=apply attr:class="apply">
            <CsrfField token=csrf/>
            {fields.into_iter().map(|(name, value)| view! {
                <input type="hidden" name=name value=value/>
            }).collect_view()}
            <button type="submit" class="secondary" aria-label=label>"Apply"</button>
        </ActionForm>
    }
    .into_any()
}

fn row_view(base: &str, r: &PolicyRow, b: &BudgetView, csrf: String) -> AnyView {
    let mut marks = Vec::new();
    if r.recommended {
        marks.push("recommended");
    }
    if r.current {
        marks.push("current");
    }
    if r.frontier {
        marks.push("frontier");
    }
    if !r.within {
        marks.push("over budget");
    }
    let class = if r.recommended {
        "policy recommended"
    } else if r.current {
        "policy current"
    } else {
        "policy"
    };
    let opt = |v: Option<i64>| v.map_or_else(|| "–".to_owned(), super::chart::percent);
    view! {
        <tr class=class data-floor=r.floor data-idle=r.idle_after_secs.unwrap_or(0)>
            <td class="num">{r.floor}</td>
            <td>{r.idle_label()}</td>
            <td class="num">{crate::money::format_micros(r.gpu_cost_micros)}</td>
            <td class="num">{crate::money::format_micros(r.idle_floor_cost_micros)}</td>
            <td class="num">{crate::admin::count(r.cold_starts)}</td>
            <td class="num">{format!("{} ({})", crate::admin::count(r.waited_requests),
                percent_of_ppm(r.waited_share_ppm))}</td>
            <td class="num">{wait(r.added_wait_ms)}</td>
            <td class="num">{opt(r.duty_cycle_bp)}</td>
            <td class="num">{crate::money::format_micros(r.margin_micros)}</td>
            <td class="num">{opt(r.margin_bp)}</td>
            <td>{marks.join(", ")}</td>
            <td>{if r.current {
                view! { <span class="muted">"in effect"</span> }.into_any()
            } else {
                apply_form(base, r, b, csrf)
            }}</td>
        </tr>
    }
    .into_any()
}

/// The advisor's section of a base's panel.
pub fn section(a: AdvisorView, base: &str, b: &BudgetView, day: &str, csrf: String) -> AnyView {
    let id = format!("advisor-{base}");
    let Some(rec) = a.recommended().cloned() else {
        let why = a
            .notice
            .clone()
            .unwrap_or_else(|| format!("No policy keeps to the budget ({}).", b.label));
        let form = a.notice.is_none().then(|| budget_form(b, base, day));
        return view! {
            <section class="advisor" id=id data-base=base.to_owned()>
                <h3>"Advisor"</h3>
                <p class="notice" role="status">{why}</p>
                {form}
            </section>
        }
        .into_any();
    };
    let current = a.current().cloned();
    let saving = current
        .as_ref()
        .map_or(0, |c| c.gpu_cost_micros.saturating_sub(rec.gpu_cost_micros));
    let recommendation =
        format!(
        "Recommended: {}: GPU cost {} over the {} days, {} cold starts, {} of requests waited{}.",
        rec.label(),
        crate::money::format_micros(rec.gpu_cost_micros),
        a.days,
        crate::admin::count(rec.cold_starts),
        percent_of_ppm(rec.waited_share_ppm),
        current.as_ref().map_or_else(String::new, |c| if c.recommended {
            " (the current policy)".to_owned()
        } else {
            format!(
                "; {} less than the current {}",
                crate::money::format_micros(saving),
                c.label()
            )
        })
    );
    let summary = format!(
        "Replayed: {} requests ({} tokens of load) in the {} whole UTC days from {} to today's \
         start; revenue {} as rated. GPU cost at the cost version in effect now: {} per \
         replica-hour, {} tokens/s per replica at peak, ceiling {} replicas. Cold start {} s \
         ({}{}).",
        crate::admin::count(a.requests),
        crate::admin::count(a.load_tokens),
        a.days,
        a.first_day,
        crate::money::format_micros(a.revenue_micros),
        crate::money::format_micros(a.replica_micros_per_hour),
        crate::admin::count(a.peak_tokens_per_second),
        a.ceiling,
        a.cold_start_ms / 1000,
        a.cold_start_source,
        if a.cold_start_source == "measured" {
            format!(": the median of {} wakes", a.wakes)
        } else {
            ": no wake in the window".to_owned()
        }
    );
    let rows = a
        .rows
        .iter()
        .map(|r| row_view(base, r, b, csrf.clone()))
        .collect_view();
    let caption = format!(
        "{base}: GPU cost against cold starts of each policy over the {} days",
        a.days
    );
    view! {
        <section class="advisor" id=id data-base=base.to_owned()>
            <h3>"Advisor"</h3>
            <p class="recommendation">{recommendation}</p>
            <p class="muted">{summary}</p>
            {budget_form(b, base, day)}
            <p class="muted">{format!(
                "Budget: {}. The recommendation is the cheapest policy within it. A policy is \
                 a floor (replicas while awake) and an idle time after which the graph sleeps \
                 at zero; a request that finds it asleep waits for the cold start, and so does \
                 every request arriving during the wake. Above the floor, replicas follow each \
                 minute's load. The margin is the window's rated revenue less the policy's GPU \
                 cost.", b.label)}</p>
            <div class="scroll">
            <table class="list advisor-policies">
                <thead><tr><th class="num">"Floor"</th><th>"Idle after"</th>
                    <th class="num">"GPU cost"</th><th class="num">"Idle floor cost"</th>
                    <th class="num">"Cold starts"</th><th class="num">"Requests that waited"</th>
                    <th class="num">"Added wait"</th><th class="num">"Duty cycle"</th>
                    <th class="num">"Margin"</th><th class="num">"Margin share"</th>
                    <th></th><th></th></tr></thead>
                <tbody>{rows}</tbody>
            </table>
            </div>
            <FrontierChart rows=a.rows.clone() days=a.days caption=caption/>
        </section>
    }
    .into_any()
}

#[cfg(test)]
mod tests {
    use super::back_to;

    #[test]
    fn apply_goes_back_to_the_same_advice_and_nowhere_else() {
        assert_eq!(
            back_to("llama-sim", "14", "starts", "0.01", "3"),
            "/admin/economics?days=14&budget=starts&max_share=0.01&max_starts=3#advisor-llama-sim"
        );
        assert_eq!(
            back_to("a b", "//evil", "x", "1&y=2", ""),
            "/admin/economics"
        );
    }
}
