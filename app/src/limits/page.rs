//! `/limits`: the tenant's and each working key's limits beside what was used: requests and
//! tokens in the last minute, spend billed this month. Read-only; admins set limits.

use leptos::prelude::*;
use leptos_meta::Title;

use super::{load_limits, LimitsView, SubjectLimits};
use crate::frame::{framed, Guarded, NARROW};
use crate::model::{Access, PageState};
use crate::money::{format_micros, group_thousands};
use crate::PRODUCT;

#[component]
pub fn LimitsPage() -> impl IntoView {
    view! {
        <Title text=format!("Limits · {PRODUCT}")/>
        <Guarded access=Access::Tenant content=page/>
    }
}

fn page(state: PageState) -> AnyView {
    framed(state, NARROW, "Limits", load_limits(), |v, _| body(v))
}

fn count(n: Option<i64>) -> String {
    n.map_or_else(
        || "unlimited".to_owned(),
        |n| group_thousands(u64::try_from(n).unwrap_or(0)),
    )
}

fn used(n: i64) -> String {
    group_thousands(u64::try_from(n).unwrap_or(0))
}

fn money(n: Option<i64>) -> String {
    n.map_or_else(|| "unlimited".to_owned(), format_micros)
}

fn row(s: SubjectLimits) -> AnyView {
    view! {
        <tr>
            <td>{s.label}</td>
            <td class="num">{format!("{} / {}", used(s.requests_last_minute), count(s.requests_per_minute))}</td>
            <td class="num">{format!("{} / {}", used(s.tokens_last_minute), count(s.tokens_per_minute))}</td>
            <td class="num">{format!("{} / {}", format_micros(s.spend_micros), money(s.spend_limit_micros))}</td>
        </tr>
    }
    .into_any()
}

fn body(v: LimitsView) -> AnyView {
    let keys = if v.keys.is_empty() {
        view! { <p class="muted">"No working keys."</p> }.into_any()
    } else {
        view! {
            <table class="list">
                <thead>
                    <tr>
                        <th>"Key"</th>
                        <th class="num">"Requests, last minute / per minute"</th>
                        <th class="num">"Tokens, last minute / per minute"</th>
                        <th class="num">"Spend this month / limit"</th>
                    </tr>
                </thead>
                <tbody>{v.keys.into_iter().map(row).collect_view()}</tbody>
            </table>
        }
        .into_any()
    };
    let credit = v.credit_micros;
    let credit_note = credit > 0 && v.tenant.spend_limit_micros.is_some();
    view! {
        <section class="panel">
            <h2>"Tenant"</h2>
            <table class="list">
                <thead>
                    <tr>
                        <th></th>
                        <th class="num">"Requests, last minute / per minute"</th>
                        <th class="num">"Tokens, last minute / per minute"</th>
                        <th class="num">"Spend this month / limit"</th>
                    </tr>
                </thead>
                <tbody>{row(v.tenant)}</tbody>
            </table>
            {credit_note.then(|| view! {
                <p class="notice" role="status" id="credit-note">{format!(
                    "Prepaid credit left: {}. The tenant's spend counts net of it: requests are \
                     refused at the limit plus the credit.",
                    format_micros(credit))}</p>
            })}
            <dl class="facts">
                <dt>"Requests in flight per model"</dt><dd>{count(v.max_in_flight)}</dd>
                <dt>"Long prompts at once per model"</dt><dd>{count(v.max_long_prompts)}</dd>
                <dt>"A prompt is long from (tokens)"</dt><dd>{count(v.long_prompt_tokens)}</dd>
            </dl>
        </section>
        <section class="panel">
            <h2>"Keys"</h2>
            {keys}
        </section>
        <p class="muted">
            "Spend counts from " {v.month} " (UTC), as billed. A request over a limit is refused \
             with 429. Limits are set by the platform's administrators."
        </p>
    }
    .into_any()
}
