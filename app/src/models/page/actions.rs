//! The buttons of one adapter's row: Start, Stop and Delete, each a plain POST with the CSRF
//! token to `/models/{name}/...`. Delete is confirmed without JavaScript: a `<details>`
//! disclosure holding a checkbox the server requires ticked. Only the commands the adapter's
//! state allows are offered (the server checks again).

use leptos::prelude::*;

use crate::frame::CsrfField;
use crate::models::AdapterView;

fn command(name: &str, verb: &'static str, label: &'static str, csrf: String) -> AnyView {
    view! {
        <form method="post" action=format!("/models/{name}/{verb}") class="command">
            <CsrfField token=csrf/>
            <button type="submit" class="secondary">{label}</button>
        </form>
    }
    .into_any()
}

fn delete(name: &str, csrf: String) -> AnyView {
    let id = format!("confirm-delete-{name}");
    view! {
        <details class="confirm">
            <summary>"Delete…"</summary>
            <form method="post" action=format!("/models/{name}/delete")>
                <CsrfField token=csrf/>
                <p>
                    "Delete “" {name.to_owned()} "”? It stops being served and its files are \
                     removed. This cannot be undone."
                </p>
                <p>
                    <input id=id.clone() type="checkbox" name="confirm" value="yes" required/>
                    <label for=id>" Yes, delete it"</label>
                </p>
                <button type="submit" class="danger">"Delete model"</button>
            </form>
        </details>
    }
    .into_any()
}

/// The commands `a`'s state allows.
pub fn cell(a: &AdapterView, csrf: &str) -> AnyView {
    if !a.managed {
        return ().into_any();
    }
    let state = a.state.as_str();
    let start = matches!(state, "stopped" | "failed")
        .then(|| command(&a.name, "start", "Start", csrf.to_owned()));
    let stop = matches!(
        state,
        "ready" | "starting" | "failed" | "unloading" | "unloaded" | "reloading"
    )
    .then(|| command(&a.name, "stop", "Stop", csrf.to_owned()));
    let settled = !matches!(state, "uploading" | "validating");
    let remove = settled.then(|| delete(&a.name, csrf.to_owned()));
    view! { {start} {stop} {remove} }.into_any()
}
