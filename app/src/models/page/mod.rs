//! `/models`: the bases offered for adapters and the tenant's adapters with their lifecycle state
//! and, when rejected or failed, the reason; for owners and members the upload form and each
//! adapter's Start / Stop / Delete; for every ready model a curl and a Python snippet. While an
//! adapter is between states the page reloads itself (a meta refresh without JavaScript, the
//! page script with it), so it stays live.

mod actions;
mod snippets;
mod upload;

use leptos::prelude::*;
use leptos_meta::Title;

use crate::frame::{framed, Guarded, WIDE};
use crate::model::{Access, PageState};
use crate::models::{load_models, AdapterView, BaseView, ModelsView};
use crate::PRODUCT;

/// States an adapter passes through on its own; the page refreshes while one is shown.
const TRANSITIONAL: &[&str] = &["uploading", "validating", "starting", "stopping"];
/// Serving: loaded, or unloaded for idleness and loaded again by the next request (held
/// meanwhile, not refused).
const SERVING: &[&str] = &["ready", "unloading", "unloaded", "reloading"];

#[component]
pub fn ModelsPage() -> impl IntoView {
    view! {
        <Title text=format!("Models · {PRODUCT}")/>
        <Guarded access=Access::Tenant content=page/>
    }
}

fn page(state: PageState) -> AnyView {
    // Wide: the adapters table carries a column of buttons. No engine names: they are the
    // operator's (the admin fleet page shows them), and long ones pushed the buttons out.
    framed(state, WIDE, "Models", load_models(), body)
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
    if SERVING.contains(&state) {
        "status ok"
    } else if TRANSITIONAL.contains(&state) {
        "status ending"
    } else {
        "status refused"
    }
}

fn adapter_row(a: AdapterView, csrf: Option<&str>) -> AnyView {
    let buttons = csrf.map(|t| view! { <td class="actions">{actions::cell(&a, t)}</td> });
    view! {
        <tr>
            <td class="nowrap">{a.name}</td>
            <td class="nowrap">{a.base}</td>
            <td class="num">{a.version}</td>
            <td><span class=state_class(&a.state)>{a.state.clone()}</span></td>
            <td>{a.reason.unwrap_or_default()}</td>
            {buttons}
        </tr>
    }
    .into_any()
}

fn body(v: ModelsView, csrf: String) -> AnyView {
    let live = v
        .adapters
        .iter()
        .any(|a| TRANSITIONAL.contains(&a.state.as_str()));
    // Without JavaScript the meta refresh keeps the page live; with it, the page script does
    // (pausing while an upload runs, which a meta refresh would cut off).
    let refresh = live.then(|| {
        view! {
            <noscript id="models-live-meta"><meta http-equiv="refresh" content="5"/></noscript>
            <span id="models-live" hidden></span>
        }
    });
    let ready: Vec<String> = v
        .adapters
        .iter()
        .filter(|a| SERVING.contains(&a.state.as_str()))
        .map(|a| a.name.clone())
        .collect();
    let manage = v.can_manage;
    let upload = if manage {
        upload::panel(&v.bases, csrf.clone())
    } else {
        view! {
            <p class="muted">
                "Your role is read-only: you can see the models but not upload or change them."
            </p>
        }
        .into_any()
    };
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
                        {manage.then(|| view! { <th><span class="visually-hidden">"Actions"</span></th> })}
                    </tr>
                </thead>
                <tbody>
                    {v.adapters
                        .into_iter()
                        .map(|a| adapter_row(a, manage.then_some(csrf.as_str())))
                        .collect_view()}
                </tbody>
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
        {upload}
        <section class="panel">
            <h2>"Your adapters"</h2>
            {adapters}
            <p><a href="/models">"Refresh"</a></p>
        </section>
        {snippets::panel(&v.api_base, &ready)}
        {upload::script()}
    }
    .into_any()
}
