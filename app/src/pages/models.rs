//! `/models`: the bases offered for adapters and the tenant's adapters with their lifecycle state
//! and, when rejected or failed, the reason. While an adapter is between states the page reloads
//! itself (meta refresh), so it stays live without JavaScript.

use leptos::prelude::*;
use leptos_meta::{Meta, Title};

use super::Guarded;
use crate::api::models::{load_models, AdapterView, BaseView, ModelsView};
use crate::model::{Access, PageState};
use crate::PRODUCT;

/// States an adapter passes through on its own; the page refreshes while one is shown.
const TRANSITIONAL: &[&str] = &["uploading", "validating", "starting", "stopping"];

#[component]
pub fn ModelsPage() -> impl IntoView {
    view! {
        <Title text=format!("Models · {PRODUCT}")/>
        <Guarded access=Access::Tenant content=page/>
    }
}

fn page(state: PageState) -> AnyView {
    super::loaded_page(state, "Models", load_models, |v, _| body(v))
}

fn base_row(b: BaseView) -> AnyView {
    view! {
        <tr>
            <td>{b.name}</td>
            <td>{b.model}</td>
            <td class="num">{b.max_lora_rank}</td>
        </tr>
    }
    .into_any()
}

/// The existing status colours: green when serving, amber while moving, muted otherwise.
fn state_class(state: &str) -> &'static str {
    if state == "ready" {
        "status ok"
    } else if TRANSITIONAL.contains(&state) {
        "status ending"
    } else {
        "status refused"
    }
}

fn adapter_row(a: AdapterView) -> AnyView {
    view! {
        <tr>
            <td>{a.name}</td>
            <td>{a.base}</td>
            <td class="num">{a.version}</td>
            <td><span class=state_class(&a.state)>{a.state.clone()}</span></td>
            <td>{a.reason.unwrap_or_default()}</td>
            <td><code>{a.engine_name}</code></td>
        </tr>
    }
    .into_any()
}

fn body(v: ModelsView) -> AnyView {
    let live = v
        .adapters
        .iter()
        .any(|a| TRANSITIONAL.contains(&a.state.as_str()));
    let refresh = live.then(|| view! { <Meta http_equiv="refresh" content="5"/> });
    let bases = if v.bases.is_empty() {
        view! { <p class="muted">"No base model is offered for adapters yet."</p> }.into_any()
    } else {
        view! {
            <table class="list">
                <thead>
                    <tr><th>"Base"</th><th>"Model"</th><th class="num">"Max LoRA rank"</th></tr>
                </thead>
                <tbody>{v.bases.into_iter().map(base_row).collect_view()}</tbody>
            </table>
        }
        .into_any()
    };
    let adapters = if v.adapters.is_empty() {
        view! { <p class="muted">"No adapters yet."</p> }.into_any()
    } else {
        view! {
            <table class="list">
                <thead>
                    <tr>
                        <th>"Name"</th>
                        <th>"Base"</th>
                        <th class="num">"Version"</th>
                        <th>"State"</th>
                        <th>"Reason"</th>
                        <th>"Engine name"</th>
                    </tr>
                </thead>
                <tbody>{v.adapters.into_iter().map(adapter_row).collect_view()}</tbody>
            </table>
        }
        .into_any()
    };
    view! {
        {refresh}
        <section class="panel">
            <h2>"Bases"</h2>
            {bases}
        </section>
        <section class="panel">
            <h2>"Your adapters"</h2>
            {adapters}
            <p><a href="/models">"Refresh"</a></p>
        </section>
    }
    .into_any()
}
