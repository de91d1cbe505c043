//! `/admin/fleet`: bases and their serving templates, graphs with live state, replicas, sleep
//! policy and wakes (an `asleep` graph has no replicas and wakes on the next request), and
//! every tenant's adapters with state and reason. Read-only.

use leptos::prelude::*;
use leptos_meta::Title;

use crate::api::admin::fleet::{admin_fleet, AdapterItem, BaseItem, FleetView, GraphItem};
use crate::model::{Access, PageState};
use crate::pages::Guarded;
use crate::PRODUCT;

#[component]
pub fn FleetPage() -> impl IntoView {
    view! {
        <Title text=format!("Fleet · {PRODUCT}")/>
        <Guarded access=Access::Admin content=page/>
    }
}

fn page(state: PageState) -> AnyView {
    crate::pages::loaded_frame(state, "content wide", "Fleet", admin_fleet, |v, _| body(v))
}

fn base_row(b: BaseItem) -> AnyView {
    view! {
        <tr>
            <td>{b.name}</td>
            <td>{b.fleet}</td>
            <td>{if b.offered { "yes" } else { "no" }}</td>
            <td class="mono">{b.model}</td>
            <td class="mono">{b.image}</td>
            <td class="mono">{b.engine_args}</td>
            <td class="num">{b.tensor_parallel_size}</td>
            <td class="num">{b.gpus_per_replica}</td>
            <td class="num">{format!("{}–{}", b.replicas_min, b.replicas_max)}</td>
            <td class="num">{b.max_loras}</td>
            <td class="num">{b.max_lora_rank}</td>
        </tr>
    }
    .into_any()
}

fn graph_row(g: GraphItem) -> AnyView {
    let wakes = if g.wake_failures > 0 {
        format!("{} ({} failed)", g.wakes, g.wake_failures)
    } else {
        g.wakes.to_string()
    };
    view! {
        <tr>
            <td>{g.base}</td>
            <td class="mono">{g.name}</td>
            <td>{g.state}</td>
            <td class="num">{format!("{} / {}", g.replicas_ready, g.replicas_desired)}</td>
            <td>{g.idle_after_secs.map_or_else(|| "always on".to_owned(), |s| format!("idle {s} s"))}</td>
            <td class="num">{wakes}</td>
            <td>{g.reason.unwrap_or_default()}</td>
        </tr>
    }
    .into_any()
}

fn adapter_row(a: AdapterItem) -> AnyView {
    view! {
        <tr>
            <td class="mono">{a.tenant_id}</td>
            <td>{a.name}</td>
            <td>{a.base}</td>
            <td class="num">{a.version}</td>
            <td>{a.state}</td>
            <td>{a.desired}</td>
            <td>{a.reason.unwrap_or_default()}</td>
            <td class="mono">{a.engine_name}</td>
        </tr>
    }
    .into_any()
}

fn body(v: FleetView) -> AnyView {
    view! {
        <section class="panel">
            <h2>"Bases and templates"</h2>
            <div class="scroll">
            <table class="list">
                <thead><tr>
                    <th>"Base"</th><th>"Fleet"</th><th>"Offered"</th><th>"Model"</th>
                    <th>"Image"</th><th>"Engine args"</th><th class="num">"TP"</th>
                    <th class="num">"GPUs / replica"</th><th class="num">"Replicas"</th>
                    <th class="num">"Max LoRAs"</th><th class="num">"Max LoRA rank"</th>
                </tr></thead>
                <tbody>{v.bases.into_iter().map(base_row).collect_view()}</tbody>
            </table>
            </div>
        </section>
        <section class="panel">
            <h2>"Graphs"</h2>
            <table class="list">
                <thead><tr>
                    <th>"Base"</th><th>"Graph"</th><th>"State"</th>
                    <th class="num">"Replicas ready / desired"</th><th>"Sleeps"</th>
                    <th class="num">"Wakes"</th><th>"Reason"</th>
                </tr></thead>
                <tbody>{v.graphs.into_iter().map(graph_row).collect_view()}</tbody>
            </table>
        </section>
        <section class="panel">
            <h2>"Adapters"</h2>
            <div class="scroll">
            <table class="list">
                <thead><tr>
                    <th>"Tenant"</th><th>"Name"</th><th>"Base"</th><th class="num">"Version"</th>
                    <th>"State"</th><th>"Desired"</th><th>"Reason"</th><th>"Engine name"</th>
                </tr></thead>
                <tbody>{v.adapters.into_iter().map(adapter_row).collect_view()}</tbody>
            </table>
            </div>
        </section>
    }
    .into_any()
}
