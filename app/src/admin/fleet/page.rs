//! `/admin/fleet`: bases and their serving templates, graphs with live state, replicas, sleep
//! policy and wakes (an `asleep` graph has no replicas and wakes on the next request), and
//! every tenant's adapters with state and reason; this replica's cold starts (time to first token
//! of requests held for a wake or a reload); and forms per base that set its sleep policies (its
//! graph always on or idle after a duration; its adapters always loaded or each unloaded after a
//! duration; POST with CSRF, works with JavaScript off).

use leptos::prelude::*;
use leptos_meta::Title;

use super::{
    admin_fleet, duration, AdapterItem, AdminSetIdlePolicy, BaseItem, FleetView, GraphItem,
};
use crate::frame::{CsrfField, Guarded};
use crate::model::{Access, ColdSnapshot, PageState};
use crate::PRODUCT;

#[component]
pub fn FleetPage() -> impl IntoView {
    view! {
        <Title text=format!("Fleet · {PRODUCT}")/>
        <Guarded access=Access::Admin content=page/>
    }
}

fn page(state: PageState) -> AnyView {
    crate::frame::framed(state, crate::frame::WIDE, "Fleet", admin_fleet(), body)
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
    // The last template change: rolling, rolled out, or failed with its reason.
    let rollout = match (g.rollout.as_deref(), g.rollout_reason) {
        (Some("rolled_out"), _) => "rolled out".to_owned(),
        (Some("failed"), Some(why)) => format!("failed: {why}"),
        (Some(state), _) => state.to_owned(),
        (None, _) => "–".to_owned(),
    };
    view! {
        <tr>
            <td class="nowrap">{g.base}</td>
            <td class="mono">{g.name}</td>
            <td>{g.state}</td>
            <td class="num">{format!("{} / {}", g.replicas_ready, g.replicas_desired)}</td>
            <td>{policy(g.idle_after_secs)}</td>
            <td class="num">{wakes}</td>
            <td class="rollout">{rollout}</td>
            <td>{g.reason.unwrap_or_default()}</td>
        </tr>
    }
    .into_any()
}

fn policy(idle_after_secs: Option<i32>) -> String {
    idle_after_secs.map_or_else(
        || "always on".to_owned(),
        |s| format!("idle after {}", duration(s)),
    )
}

fn adapter_policy(idle_after_secs: Option<i32>) -> String {
    idle_after_secs.map_or_else(
        || "always loaded".to_owned(),
        |s| format!("unloaded after {} idle", duration(s)),
    )
}

/// One base's sleep policies, each with the form that changes it: its graph's (always on, or
/// to zero replicas when idle) and its adapters' (always loaded, or each unloaded when idle).
fn idle_row(b: &BaseItem, csrf: String) -> AnyView {
    let graph = idle_form(
        &b.name,
        csrf.clone(),
        "graph",
        ("always-on", "Always on"),
        b.idle_after_secs,
    );
    let adapters = idle_form(
        &b.name,
        csrf,
        "adapters",
        ("always-loaded", "Always loaded"),
        b.adapter_idle_after_secs,
    );
    let (name, now, adapters_now) = (
        b.name.clone(),
        policy(b.idle_after_secs),
        adapter_policy(b.adapter_idle_after_secs),
    );
    view! {
        <tr>
            <td>{name}</td>
            <td class="idle-policy">{now}</td>
            <td>{graph}</td>
            <td class="adapter-idle-policy">{adapters_now}</td>
            <td>{adapters}</td>
        </tr>
    }
    .into_any()
}

/// The form that sets one of a base's idle policies.
fn idle_form(
    base: &str,
    csrf: String,
    scope: &'static str,
    (always_value, always_label): (&'static str, &'static str),
    idle_after_secs: Option<i32>,
) -> AnyView {
    let save = ServerAction::<AdminSetIdlePolicy>::new();
    let always = idle_after_secs.is_none();
    let after = idle_after_secs.map(duration).unwrap_or_default();
    let base = base.to_owned();
    let class = if scope == "graph" {
        "idle-form"
    } else {
        "adapter-idle-form"
    };
    view! {
        <ActionForm action=save attr:class=class>
            <CsrfField token=csrf/>
            <input type="hidden" name="base" value=base/>
            <input type="hidden" name="scope" value=scope/>
            <label class="check"><input type="radio" name="policy" value=always_value
                checked=always/>{always_label}</label>
            <label class="check"><input type="radio" name="policy" value="idle-after"
                checked=!always/>"Idle after"</label>
            <input type="text" name="after" size="8" value=after
                placeholder="10m" aria-label="Idle after (90, 90s, 10m, 1h30m)"/>
            <button type="submit">"Save"</button>
        </ActionForm>
    }
    .into_any()
}

fn seconds(ms: u64) -> String {
    format!("{}.{:03} s", ms / 1000, ms % 1000)
}

/// Fleet-wide wakes of graphs and reloads of adapters, and whether each failed.
struct Wakes {
    wakes: i64,
    wake_failures: i64,
    reloads: i64,
    reload_failures: i64,
}

fn cold_panel(cold: Option<ColdSnapshot>, w: Wakes) -> AnyView {
    let Wakes {
        wakes,
        wake_failures,
        reloads,
        reload_failures,
    } = w;
    let bound =
        |b: Option<u64>| b.map_or_else(|| "> 120 s".to_owned(), |ms| format!("≤ {}", seconds(ms)));
    let (requests, last, p50, p99) = match cold {
        Some(c) if c.requests > 0 => (
            c.requests.to_string(),
            c.last_ms.map(seconds).unwrap_or_default(),
            bound(c.p50_le_ms),
            bound(c.p99_le_ms),
        ),
        Some(_) => (
            "0".to_owned(),
            "–".to_owned(),
            "–".to_owned(),
            "–".to_owned(),
        ),
        None => (
            "–".to_owned(),
            "–".to_owned(),
            "–".to_owned(),
            "–".to_owned(),
        ),
    };
    view! {
        <section class="panel">
            <h2>"Cold starts"</h2>
            <table class="list cold-starts">
                <tr class="wakes"><th>"Wakes (all graphs)"</th><td class="num">{wakes}</td></tr>
                <tr class="wake-failures"><th>"Failed wakes"</th><td class="num">{wake_failures}</td></tr>
                <tr class="reloads"><th>"Adapter reloads (all adapters)"</th><td class="num">{reloads}</td></tr>
                <tr class="reload-failures"><th>"Failed reloads"</th><td class="num">{reload_failures}</td></tr>
                <tr class="cold-requests"><th>"Requests held for a wake or a reload (this server)"</th>
                    <td class="num">{requests}</td></tr>
                <tr class="cold-last"><th>"Cold time to first token, last"</th><td class="num">{last}</td></tr>
                <tr class="cold-p50"><th>"Cold time to first token, median"</th><td class="num">{p50}</td></tr>
                <tr class="cold-p99"><th>"Cold time to first token, p99"</th><td class="num">{p99}</td></tr>
            </table>
            <p class="muted">"A request is held for a graph's wake or an adapter's reload. Time \
                from a held request's arrival to its first token: a stream's first \
                content chunk, a non-streamed answer's whole body. Median and p99 are the bounds of \
                the histogram buckets that hold them (tf_gateway_cold_ttft_seconds); counts are \
                this server's since it started."</p>
        </section>
    }
    .into_any()
}

fn adapter_row(a: AdapterItem) -> AnyView {
    let reloads = if a.reload_failures > 0 {
        format!("{} ({} failed)", a.reloads, a.reload_failures)
    } else {
        a.reloads.to_string()
    };
    view! {
        <tr>
            <td class="nowrap">
                <a href=format!("/admin/tenants/{}", a.tenant)>{a.tenant_display}</a>
            </td>
            <td class="nowrap">{a.name}</td>
            <td class="nowrap">{a.base}</td>
            <td class="num">{a.version}</td>
            <td>{a.state}</td>
            <td>{a.desired}</td>
            <td>{a.reason.unwrap_or_default()}</td>
            <td class="mono">{a.engine_name}</td>
            <td class="num">{reloads}</td>
        </tr>
    }
    .into_any()
}

fn body(v: FleetView, csrf: String) -> AnyView {
    let wakes = v.graphs.iter().map(|g| g.wakes).sum();
    let wake_failures = v.graphs.iter().map(|g| g.wake_failures).sum();
    let reloads = v.adapters.iter().map(|a| a.reloads).sum();
    let reload_failures = v.adapters.iter().map(|a| a.reload_failures).sum();
    let idle_rows = v
        .bases
        .iter()
        .map(|b| idle_row(b, csrf.clone()))
        .collect_view();
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
                    <th class="num">"Wakes"</th><th>"Rollout"</th><th>"Reason"</th>
                </tr></thead>
                <tbody>{v.graphs.into_iter().map(graph_row).collect_view()}</tbody>
            </table>
        </section>
        {cold_panel(v.cold, Wakes { wakes, wake_failures, reloads, reload_failures })}
        <section class="panel">
            <h2>"Sleep policy"</h2>
            <table class="list sleep-policy">
                <thead><tr><th>"Base"</th><th>"Graph"</th><th>"Change"</th>
                    <th>"Adapters"</th><th>"Change"</th></tr></thead>
                <tbody>{idle_rows}</tbody>
            </table>
            <p class="muted">"An idle graph goes to zero replicas; the next request is held while \
                it wakes. Always on keeps the template's floor (and wakes a sleeping graph). An \
                idle adapter is unloaded from the engines while the graph serves the others; the \
                next request for it is held while it is loaded again."</p>
        </section>
        <section class="panel">
            <h2>"Adapters"</h2>
            <div class="scroll">
            <table class="list">
                <thead><tr>
                    <th>"Tenant"</th><th>"Name"</th><th>"Base"</th><th class="num">"Version"</th>
                    <th>"State"</th><th>"Desired"</th><th>"Reason"</th><th>"Engine name"</th>
                    <th class="num">"Reloads"</th>
                </tr></thead>
                <tbody>{v.adapters.into_iter().map(adapter_row).collect_view()}</tbody>
            </table>
            </div>
        </section>
    }
    .into_any()
}
