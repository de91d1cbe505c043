//! `/settings`: the user's own display name and password (every role), and the tenant's
//! settings, editable by owners and shown read-only to others: display name, request-body
//! logging and its retention.

use leptos::prelude::*;
use leptos_meta::Title;

use super::{
    load_settings, ChangePassword, DeleteStoredBodies, SaveProfile, SaveTenantSettings,
    SettingsView, MAX_DISPLAY_NAME, RETENTION_DAYS,
};
use crate::frame::{framed, CsrfField, Guarded, NARROW};
use crate::model::{Access, PageState};
use crate::money::group_thousands;
use crate::PRODUCT;

#[component]
pub fn SettingsPage() -> impl IntoView {
    view! {
        <Title text=format!("Settings · {PRODUCT}")/>
        <Guarded access=Access::Tenant content=page/>
    }
}

fn page(state: PageState) -> AnyView {
    framed(state, NARROW, "Settings", load_settings(), body)
}

fn body(v: SettingsView, csrf: String) -> AnyView {
    let profile = ServerAction::<SaveProfile>::new();
    let password = ServerAction::<ChangePassword>::new();
    let (c1, c2) = (csrf.clone(), csrf.clone());
    let (email, role, name) = (v.email.clone(), v.role.clone(), v.display_name.clone());
    let tenant = tenant_panel(v, csrf);
    view! {
        <section class="panel">
            <h2>"You"</h2>
            <p class="muted">{email} " · " {role}</p>
            <ActionForm action=profile attr:class="inline">
                <CsrfField token=c1/>
                <label for="display-name">"Your name"</label>
                <input id="display-name" type="text" name="display_name"
                    maxlength=MAX_DISPLAY_NAME.to_string() value=name/>
                <button type="submit">"Save name"</button>
            </ActionForm>
        </section>
        <section class="panel">
            <h2>"Password"</h2>
            <ActionForm action=password attr:class="stack">
                <CsrfField token=c2/>
                <label for="current">"Current password"</label>
                <input id="current" type="password" name="current"
                    autocomplete="current-password" required/>
                <label for="password">"New password (10 characters or more)"</label>
                <input id="password" type="password" name="password" minlength="10"
                    autocomplete="new-password" required/>
                <label for="confirm">"Repeat the new password"</label>
                <input id="confirm" type="password" name="confirm" minlength="10"
                    autocomplete="new-password" required/>
                <p class="muted">"Changing it signs you out everywhere else."</p>
                <button type="submit">"Change password"</button>
            </ActionForm>
        </section>
        {tenant}
    }
    .into_any()
}

fn tenant_panel(v: SettingsView, csrf: String) -> AnyView {
    let stored = u64::try_from(v.stored_bodies).unwrap_or(0);
    if !v.can_manage {
        let logging = if v.body_logging { "on" } else { "off" };
        return view! {
            <section class="panel">
                <h2>"Tenant"</h2>
                <dl class="facts">
                    <dt>"Name"</dt><dd>{v.tenant_display_name}</dd>
                    <dt>"Request-body logging"</dt><dd>{logging}</dd>
                    <dt>"Bodies kept for"</dt><dd>{v.body_retention_days} " days"</dd>
                    <dt>"Bodies stored"</dt><dd>{group_thousands(stored)}</dd>
                </dl>
                <p class="muted">"Only the tenant's owners change these."</p>
            </section>
        }
        .into_any();
    }
    let save = ServerAction::<SaveTenantSettings>::new();
    let delete = ServerAction::<DeleteStoredBodies>::new();
    let csrf2 = csrf.clone();
    view! {
        <section class="panel">
            <h2>"Tenant"</h2>
            <p id="audit-link">"Who changed what in this tenant (keys, members, models, body \
                logging, settings): " <a href="/audit">"the tenant's audit log"</a> "."</p>
            <ActionForm action=save attr:class="stack">
                <CsrfField token=csrf/>
                <label for="tenant-name">"Tenant name"</label>
                <input id="tenant-name" type="text" name="display_name" required
                    maxlength=MAX_DISPLAY_NAME.to_string() value=v.tenant_display_name/>
                <label class="check">
                    <input type="checkbox" name="body_logging" checked=v.body_logging/>
                    " Store request bodies (prompt and completion, the first 32 KiB of each) so \
                     they can be read on the request log"
                </label>
                <label for="retention">"Keep stored bodies for (days)"</label>
                <input id="retention" type="number" name="retention_days"
                    min=RETENTION_DAYS.0.to_string() max=RETENTION_DAYS.1.to_string()
                    value=v.body_retention_days.to_string() required/>
                <p class="muted">
                    "Off by default. When on, every API request's body and its answer (for a \
                     stream, the events as sent) are stored, each cut at 32 KiB, and shown on \
                     the request's page under Request log. Bodies older than the retention \
                     period are deleted. Turning it on or off takes effect within a second; it, \
                     the retention period and deleting are recorded in the audit log."
                </p>
                <button type="submit">"Save tenant settings"</button>
            </ActionForm>
            <h3>"Stored bodies"</h3>
            <p id="stored-bodies">{stored_note(stored)}</p>
            {(stored > 0).then(|| view! {
                // A confirmation first, as for revoking a key: a disclosure, no JavaScript.
                <details class="confirm" id="delete-bodies">
                    <summary>"Delete all stored bodies…"</summary>
                    <ActionForm action=delete>
                        <CsrfField token=csrf2/>
                        <p>
                            "Delete the stored bodies of " {group_thousands(stored)}
                            {if stored == 1 { " request" } else { " requests" }}
                            "? Their prompts and completions can no longer be read on the \
                             request log. This cannot be undone."
                        </p>
                        <button type="submit" class="danger">"Delete all stored bodies"</button>
                    </ActionForm>
                </details>
            })}
        </section>
    }
    .into_any()
}

fn stored_note(stored: u64) -> String {
    match stored {
        0 => "No request bodies are stored.".to_owned(),
        1 => "The bodies of 1 request are stored.".to_owned(),
        n => format!("The bodies of {} requests are stored.", group_thousands(n)),
    }
}
