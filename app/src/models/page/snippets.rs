//! Ready-to-copy calls of a served model: curl and Python (the `openai` package), against the
//! gateway's public base URL, with the key left as the `TOKENFACTORY_API_KEY` environment
//! variable (a page never shows a key's secret).

use crate::frame::{CopyButton, CopyScript};
use leptos::prelude::*;

/// `curl` of a chat completion with `model`.
pub fn curl(api_base: &str, model: &str) -> String {
    format!(
        "curl {api_base}/chat/completions \\\n  \
         -H \"Authorization: Bearer $TOKENFACTORY_API_KEY\" \\\n  \
         -H \"Content-Type: application/json\" \\\n  \
         -d '{{\"model\": \"{model}\", \"messages\": [{{\"role\": \"user\", \"content\": \"Hello\"}}]}}'"
    )
}

/// The same call with the `openai` Python package.
pub fn python(api_base: &str, model: &str) -> String {
    format!(
        "import os\nfrom openai import OpenAI\n\n\
         client = OpenAI(base_url=\"{api_base}\", api_key=os.environ[\"TOKENFACTORY_API_KEY\"])\n\
         reply = client.chat.completions.create(\n    \
         model=\"{model}\",\n    \
         messages=[{{\"role\": \"user\", \"content\": \"Hello\"}}],\n)\n\
         print(reply.choices[0].message.content)"
    )
}

/// The snippets of every ready model, or nothing when none is ready.
pub fn panel(api_base: &str, ready: &[String]) -> AnyView {
    if ready.is_empty() {
        return ().into_any();
    }
    // One disclosure per model, the first open: the page stays short with many ready models.
    let blocks = ready
        .iter()
        .enumerate()
        .map(|(i, model)| {
            let (curl, python) = (curl(api_base, model), python(api_base, model));
            view! {
                <details class="snippet-model" open={i == 0}>
                    <summary><code>{model.clone()}</code></summary>
                    <p class="muted">"curl"</p>
                    <pre class="snippet"><code id=format!("curl-{i}")>{curl}</code></pre>
                    <CopyButton target=format!("curl-{i}")/>
                    <p class="muted">"Python (" <code>"pip install openai"</code> ")"</p>
                    <pre class="snippet"><code id=format!("python-{i}")>{python}</code></pre>
                    <CopyButton target=format!("python-{i}")/>
                </details>
            }
        })
        .collect_view();
    view! {
        <section class="panel" id="snippets">
            <h2>"Call your models"</h2>
            <p class="muted">
                "Set " <code>"TOKENFACTORY_API_KEY"</code> " to one of your "
                <a href="/keys">"API keys"</a> ", then:"
            </p>
            {blocks}
            <CopyScript/>
        </section>
    }
    .into_any()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snippets_name_the_model_the_base_url_and_no_secret() {
        let c = curl("https://tf.example/v1", "support-bot");
        assert!(c.starts_with("curl https://tf.example/v1/chat/completions"));
        assert!(c.contains("$TOKENFACTORY_API_KEY") && c.contains("\"model\": \"support-bot\""));
        let p = python("https://tf.example/v1", "support-bot");
        assert!(p.contains("base_url=\"https://tf.example/v1\""));
        assert!(p.contains("os.environ[\"TOKENFACTORY_API_KEY\"]"));
        assert!(p.contains("model=\"support-bot\""));
    }
}
