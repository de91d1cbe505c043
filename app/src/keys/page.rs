//! `/keys`: the tenant's API keys. Create one (its secret is shown once, right after), see each
//! key's visible prefix, creation, last use and status, revoke or rotate it. Every form is a plain
//! POST with the CSRF token; confirmations are `<details>` disclosures, so nothing needs
//! JavaScript. Where JavaScript runs, a copy button appears next to a new secret.

use leptos::prelude::*;
use leptos_meta::Title;
use leptos_router::hooks::use_query_map;

use super::{
    list_keys, CreateKey, FreshKey, KeyState, KeyView, KeysView, RevokeKey, RotateKey,
    GRACE_CHOICES, HIDE_REFUSED_AFTER_DAYS,
};
use crate::frame::{framed, CopyButton, CopyScript, CsrfField, Guarded, NARROW};
use crate::model::{Access, PageState};
use crate::PRODUCT;

/// `/keys`: signed-in tenant members.
#[component]
pub fn KeysPage() -> impl IntoView {
    view! {
        <Title text=format!("API keys · {PRODUCT}")/>
        <Guarded access=Access::Tenant content=page/>
    }
}

fn page(state: PageState) -> AnyView {
    let all = use_query_map()
        .get_untracked()
        .get("revoked")
        .is_some_and(|v| v == "all");
    framed(state, NARROW, "API keys", list_keys(all), body)
}

fn body(v: KeysView, csrf: String) -> AnyView {
    let create = ServerAction::<CreateKey>::new();
    let manage = v.can_manage;
    let rows = if v.keys.is_empty() {
        view! { <p class="muted">"No keys yet. Create one to call the API."</p> }.into_any()
    } else {
        let csrf = csrf.clone();
        view! {
            <table class="list keys">
                <thead>
                    <tr>
                        <th>"Name"</th>
                        <th>"Key"</th>
                        <th>"Created"</th>
                        <th>"Last used"</th>
                        <th>"Status"</th>
                        <th><span class="visually-hidden">"Actions"</span></th>
                    </tr>
                </thead>
                <tbody>
                    {v.keys.into_iter().map(|k| row(k, manage, csrf.clone())).collect_view()}
                </tbody>
            </table>
        }
        .into_any()
    };
    let create_panel = if manage {
        view! {
            <section class="panel">
                <h2>"Create a key"</h2>
                <ActionForm action=create attr:class="inline">
                    <CsrfField token=csrf/>
                    <label for="key-name">"Name"</label>
                    <input id="key-name" type="text" name="name" maxlength="100" required
                        placeholder="e.g. production backend"/>
                    <button type="submit">"Create key"</button>
                </ActionForm>
            </section>
        }
        .into_any()
    } else {
        view! {
            <p class="muted">"Your role is read-only: you can see the keys but not change them."</p>
        }
        .into_any()
    };
    view! {
        {v.fresh.map(fresh_panel)}
        {create_panel}
        <section class="panel">
            <h2>"Your keys"</h2>
            {rows}
            {hidden_note(v.hidden, v.showing_all)}
            <p class="muted">
                "Last use is recorded about once a minute. A revoked key is refused on every \
                 server within a second."
            </p>
        </section>
    }
    .into_any()
}

/// The link to the keys refused more than a week ago (hidden by default), or back.
fn hidden_note(hidden: usize, showing_all: bool) -> Option<AnyView> {
    if showing_all {
        return Some(
            view! {
                <p class="revoked-toggle">
                    <a href="/keys">"Hide keys revoked or expired more than "
                        {HIDE_REFUSED_AFTER_DAYS} " days ago"</a>
                </p>
            }
            .into_any(),
        );
    }
    (hidden > 0).then(|| {
        let label = if hidden == 1 {
            "1 key".to_owned()
        } else {
            format!("{hidden} keys")
        };
        view! {
            <p class="revoked-toggle muted">
                {label} " revoked or expired more than " {HIDE_REFUSED_AFTER_DAYS} " days ago "
                {if hidden == 1 { "is" } else { "are" }} " not listed. "
                <a href="/keys?revoked=all">"Show revoked keys"</a>
            </p>
        }
        .into_any()
    })
}

/// The new key, shown this once.
fn fresh_panel(k: FreshKey) -> AnyView {
    view! {
        <section class="panel secret" aria-live="polite">
            <h2>"New key “" {k.name} "”"</h2>
            <p>
                <strong>"Copy it now: it will not be shown again."</strong>
                " Only its prefix " <code>{k.prefix}</code> " is kept in clear."
            </p>
            <div class="secret-line">
                <code id="new-key-secret" class="secret-value">{k.secret}</code>
                <CopyButton target="new-key-secret".to_owned()/>
            </div>
            {k.note.map(|n| view! { <p class="muted">{n}</p> })}
            <CopyScript/>
        </section>
    }
    .into_any()
}

fn row(k: KeyView, manage: bool, csrf: String) -> AnyView {
    let working = manage && k.state != KeyState::Refused;
    let state_class = match k.state {
        KeyState::Active => "status ok",
        KeyState::Ending => "status ending",
        KeyState::Refused => "status refused",
    };
    let actions = working.then(|| actions(&k, csrf));
    view! {
        <tr>
            <td>{k.name}</td>
            <td class="nowrap"><code>{format!("{}…", k.prefix)}</code></td>
            <td>{k.created}</td>
            <td>{k.last_used}</td>
            <td><span class=state_class>{k.status}</span></td>
            <td class="actions">{actions}</td>
        </tr>
    }
    .into_any()
}

fn actions(k: &KeyView, csrf: String) -> AnyView {
    view! {
        {rotate_form(k.id.clone(), k.name.clone(), csrf.clone())}
        {revoke_form(k.id.clone(), k.name.clone(), csrf)}
    }
    .into_any()
}

fn rotate_form(id: String, name: String, csrf: String) -> AnyView {
    let rotate = ServerAction::<RotateKey>::new();
    view! {
        <details class="confirm">
            <summary>"Rotate…"</summary>
            <ActionForm action=rotate>
                <CsrfField token=csrf/>
                <input type="hidden" name="key" value=id/>
                <p>"A new key replaces “" {name} "”. The old key should:"</p>
                <select name="grace" aria-label="Grace period of the old key">
                    {GRACE_CHOICES
                        .iter()
                        .map(|(secs, label)| {
                            let selected = *secs == 3_600;
                            view! { <option value=secs.to_string() selected=selected>{*label}</option> }
                        })
                        .collect_view()}
                </select>
                <button type="submit">"Rotate key"</button>
            </ActionForm>
        </details>
    }
    .into_any()
}

fn revoke_form(id: String, name: String, csrf: String) -> AnyView {
    let revoke = ServerAction::<RevokeKey>::new();
    view! {
        <details class="confirm">
            <summary>"Revoke…"</summary>
            <ActionForm action=revoke>
                <CsrfField token=csrf/>
                <input type="hidden" name="key" value=id/>
                <p>
                    "Revoke “" {name} "”? Every request with it is refused within a second. \
                     This cannot be undone."
                </p>
                <button type="submit" class="danger">"Revoke key"</button>
            </ActionForm>
        </details>
    }
    .into_any()
}
