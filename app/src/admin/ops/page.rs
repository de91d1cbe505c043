//! `/admin/ops`: every replica's usage journal and shipping, as each one last reported it, with
//! when that was; replicas that stopped reporting are marked stale.

use leptos::prelude::*;
use leptos_meta::Title;

use super::{admin_ops, ReplicaItem, STALE_AFTER_SECS};
use crate::admin::count;
use crate::frame::Guarded;
use crate::model::{Access, PageState};
use crate::PRODUCT;

#[component]
pub fn OpsPage() -> impl IntoView {
    view! {
        <Title text=format!("Operations · {PRODUCT}")/>
        <Guarded access=Access::Admin content=page/>
    }
}

fn page(state: PageState) -> AnyView {
    crate::frame::framed(
        state,
        crate::frame::WIDE,
        "Operations",
        admin_ops(),
        |v, _| body(v),
    )
}

fn body(replicas: Vec<ReplicaItem>) -> AnyView {
    let empty = replicas.is_empty();
    let rows = replicas.into_iter().map(row).collect_view();
    view! {
        <section class="panel">
            <h2>"Replicas"</h2>
            <p class="muted">
                {format!("Each replica reports every 2 s; one silent for more than \
                          {STALE_AFTER_SECS} s is marked stale.")}
            </p>
            {empty.then(|| view! { <p class="muted">"No replica has reported yet."</p> })}
            <div class="scroll">
            <table class="list replicas">
                <thead><tr>
                    <th>"Replica"</th><th>"Host"</th><th>"Started (UTC)"</th><th>"Last seen"</th>
                    <th class="num">"Backlog bytes"</th><th class="num">"Ship lag ms"</th>
                    <th>"Last shipped (UTC)"</th><th class="num">"Journaled"</th>
                    <th class="num">"Shipped"</th><th class="num">"Ship failures"</th>
                    <th class="num">"Connections"</th>
                </tr></thead>
                <tbody>{rows}</tbody>
            </table>
            </div>
        </section>
    }
    .into_any()
}

fn row(r: ReplicaItem) -> AnyView {
    let seen = if r.stale {
        view! { <span class="status refused">{format!("stale: {} s ago", r.seen_secs_ago)}</span> }
            .into_any()
    } else {
        view! { <span class="status ok">{format!("{} s ago", r.seen_secs_ago)}</span> }.into_any()
    };
    let short =
        r.id.chars()
            .rev()
            .take(12)
            .collect::<String>()
            .chars()
            .rev()
            .collect::<String>();
    let id = r.id.clone();
    view! {
        <tr data-replica=id class:stale=r.stale>
            <td class="mono" title=r.id>{short}</td>
            <td>{r.hostname}</td>
            <td class="mono">{r.started}</td>
            <td>{seen}</td>
            <td class="num backlog">{count(r.backlog_bytes)}</td>
            <td class="num">{count(r.ship_lag_ms)}</td>
            <td class="mono">{r.last_shipped}</td>
            <td class="num journaled">{count(r.journaled)}</td>
            <td class="num shipped">{count(r.shipped)}</td>
            <td class="num">{count(r.ship_failures)}</td>
            <td class="num">{count(r.open_connections)}</td>
        </tr>
    }
    .into_any()
}
