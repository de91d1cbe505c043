//! Browser entry point. The portal is server-rendered and works without JavaScript; this crate is
//! where hydration is switched on for pages that gain from it. On native targets it is empty.

#[cfg(target_arch = "wasm32")]
#[wasm_bindgen::prelude::wasm_bindgen]
pub fn hydrate() {
    console_error_panic_hook::set_once();
    leptos::mount::hydrate_body(tf_app::App);
}
