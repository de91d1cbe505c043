//! The upload form of `/models`: a plain multipart POST to `/models/upload` (streamed to the
//! store by the server) that works with JavaScript off. The CSRF token is its first field, so the
//! server checks it before reading any file. Where JavaScript runs, [`UPLOAD_SCRIPT`] sends the
//! same form with `XMLHttpRequest` and shows the upload's progress.

use leptos::prelude::*;

use crate::frame::CsrfField;
use crate::models::BaseView;

/// Sends the form through `XMLHttpRequest` (asking for JSON), shows its upload progress, then
/// goes where the server says (back to `/models`, whose flash reports the result); a refusal is
/// shown next to the bar. It also takes over the page's live refresh (the `<noscript>` meta
/// refresh only works with JavaScript off), pausing it while an upload runs. Runs under the
/// page's CSP nonce; no inline handlers.
const UPLOAD_SCRIPT: &str = r#"(function () {
  var uploading = false;
  if (document.getElementById("models-live")) {
    setInterval(function () { if (!uploading) { window.location.reload(); } }, 5000);
  }
  var form = document.getElementById("upload-form");
  if (!form || !window.FormData || !window.XMLHttpRequest) { return; }
  var bar = document.getElementById("upload-progress");
  var status = document.getElementById("upload-status");
  var button = form.querySelector("button[type=submit]");
  form.addEventListener("submit", function (e) {
    e.preventDefault();
    var xhr = new XMLHttpRequest();
    var done = function (message) {
      uploading = false;
      button.disabled = false;
      status.textContent = message;
    };
    xhr.open("POST", form.action);
    xhr.setRequestHeader("Accept", "application/json");
    xhr.upload.addEventListener("progress", function (ev) {
      if (ev.lengthComputable) {
        bar.value = Math.round(ev.loaded * 100 / ev.total);
        status.textContent = "Uploading… " + bar.value + "%";
      }
    });
    xhr.upload.addEventListener("load", function () {
      bar.value = 100;
      status.textContent = "Validating…";
    });
    xhr.addEventListener("load", function () {
      var body = null;
      try { body = JSON.parse(xhr.responseText); } catch (_) { body = null; }
      if (xhr.status === 200 && body && body.location) {
        window.location.assign(body.location);
      } else {
        done((body && body.error) || ("The upload failed (" + xhr.status + ")."));
      }
    });
    xhr.addEventListener("error", function () { done("The upload was interrupted."); });
    uploading = true;
    button.disabled = true;
    bar.hidden = false;
    bar.value = 0;
    status.textContent = "Uploading…";
    xhr.send(new FormData(form));
  });
})();"#;

/// The page's script (for every role: it also keeps the page live); does nothing without
/// JavaScript.
pub fn script() -> AnyView {
    view! { <script nonce=leptos::nonce::use_nonce() inner_html=UPLOAD_SCRIPT></script> }.into_any()
}

/// The upload panel (owners and members only), or a note that there is nothing to upload onto.
pub fn panel(bases: &[BaseView], csrf: String) -> AnyView {
    if bases.is_empty() {
        return ().into_any();
    }
    let options = bases
        .iter()
        .map(|b| {
            let label = format!("{} (max rank {})", b.name, b.max_lora_rank);
            view! { <option value=b.name.clone()>{label}</option> }
        })
        .collect_view();
    view! {
        <section class="panel">
            <h2>"Upload an adapter"</h2>
            <p class="muted">
                "A PEFT LoRA adapter: its " <code>"adapter_config.json"</code> " and "
                <code>"adapter_model.safetensors"</code>
                ". It is checked against the base before it can start; uploading an existing \
                 name (stopped) makes a new version."
            </p>
            <form id="upload-form" class="upload" method="post" action="/models/upload"
                enctype="multipart/form-data">
                // First: the server checks the token before it reads a file.
                <CsrfField token=csrf/>
                <label for="model-name">"Name"</label>
                <input id="model-name" type="text" name="name" required maxlength="64"
                    pattern="[A-Za-z0-9][A-Za-z0-9._\\-]*" placeholder="e.g. support-bot"/>
                <label for="model-base">"Base"</label>
                <select id="model-base" name="base" required>{options}</select>
                <label for="model-config">"adapter_config.json"</label>
                <input id="model-config" type="file" name="adapter_config.json"
                    accept=".json,application/json" required/>
                <label for="model-weights">"adapter_model.safetensors"</label>
                <input id="model-weights" type="file" name="adapter_model.safetensors"
                    accept=".safetensors" required/>
                <div class="upload-submit">
                    <button type="submit">"Upload"</button>
                    <progress id="upload-progress" max="100" value="0" hidden></progress>
                    <span id="upload-status" class="muted" role="status"></span>
                </div>
            </form>
        </section>
    }
    .into_any()
}
