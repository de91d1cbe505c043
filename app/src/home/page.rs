//! The tenant home: this month's usage (requests, tokens, cost), the number of working keys, the
//! models the tenant may call and a quick-start snippet, with links to the console's pages.

use leptos::prelude::*;
use leptos_meta::Title;

use super::{load_home, HomeView};
use crate::frame::{framed, CopyButton, CopyScript, Guarded, Head, NARROW};
use crate::model::{Access, PageState};
use crate::PRODUCT;

/// `/`: signed-in tenant members; admins go to `/admin`, everyone else to `/login`.
#[component]
pub fn HomePage() -> impl IntoView {
    view! {
        <Title text=PRODUCT/>
        <Guarded access=Access::Tenant content=home/>
    }
}

fn home(state: PageState) -> AnyView {
    let email = state.viewer.as_ref().map(|v| v.email.clone());
    framed(state, NARROW, Head::Nothing, load_home(), move |h, _| {
        dashboard(h, email)
    })
}

fn dashboard(h: HomeView, email: Option<String>) -> AnyView {
    let model = h
        .models
        .first()
        .map_or_else(|| "MODEL".to_owned(), |m| m.name.clone());
    let snippet = format!(
        "curl {base}/chat/completions \\\n  -H \"Authorization: Bearer YOUR_KEY\" \\\n  \
         -H \"Content-Type: application/json\" \\\n  \
         -d '{{\"model\": \"{model}\", \"messages\": [{{\"role\": \"user\", \"content\": \"Hello\"}}]}}'",
        base = h.api_base
    );
    let models = if h.models.is_empty() {
        view! { <p class="muted">"No model is offered to this tenant yet."</p> }.into_any()
    } else {
        view! {
            <table class="list models">
                <thead><tr><th>"Model"</th><th>"Kind"</th><th class="num">"Input / 1M tokens"</th><th class="num">"Cached input / 1M"</th><th class="num">"Output / 1M"</th></tr></thead>
                <tbody>
                    {h.models
                        .into_iter()
                        .map(|m| view! {
                            <tr>
                                <td><code>{m.name}</code></td><td>{m.kind}</td>
                                <td class="num">{m.input_price}</td><td class="num">{m.cached_price}</td>
                                <td class="num">{m.output_price}</td>
                            </tr>
                        })
                        .collect_view()}
                </tbody>
            </table>
        }
        .into_any()
    };
    view! {
        <h1>{h.tenant}</h1>
        <p class="muted">"Signed in as " <strong>{email}</strong> "."</p>
        <section class="panel">
            <h2>"This month (" {h.month} ")"</h2>
            <div class="stats">
                <div class="stat"><span class="label">"Requests"</span><span class="value" id="stat-requests">{h.requests}</span></div>
                <div class="stat"><span class="label">"Prompt tokens"</span><span class="value">{h.prompt_tokens}</span>
                    <span class="sub">{format!("{} cached", h.cached_tokens)}</span></div>
                <div class="stat"><span class="label">"Completion tokens"</span><span class="value">{h.completion_tokens}</span></div>
                <div class="stat"><span class="label">"Cost"</span><span class="value" id="stat-cost">{h.cost}</span></div>
                <div class="stat"><span class="label">"Active keys"</span><span class="value" id="stat-keys">{h.active_keys}</span>
                    <a class="sub" href="/keys">"Manage keys"</a></div>
            </div>
            <p><a href="/usage">"Usage by day and model"</a> " · " <a href="/logs">"Request log"</a></p>
        </section>
        <section class="panel">
            <h2>"Models you can use"</h2>
            {models}
        </section>
        <section class="panel">
            <h2>"Quick start"</h2>
            <p>
                "Any OpenAI client works with base URL " <code>{h.api_base}</code>
                " and one of your " <a href="/keys">"API keys"</a> ". With curl:"
            </p>
            <pre class="snippet"><code id="quick-start">{snippet}</code></pre>
            <CopyButton target="quick-start".to_owned()/>
            <CopyScript/>
        </section>
    }
    .into_any()
}
