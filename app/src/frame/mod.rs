//! The frame every page shares: the access guard that loads the session before rendering (and
//! its server function), the one page skeleton (top bar, flash, heading, loaded body), the top
//! bar with the logout form, the hidden CSRF field, the flash message and the not-found page.

use leptos::prelude::*;
use leptos_meta::Title;

use crate::error::PortalError;
use crate::login::Logout;
use crate::model::{Access, Notice, PageState, PageStatus, Viewer};
use crate::PRODUCT;

/// Loads the session for a page and applies the page's access rule (redirects or 403). A first
/// visit gets its CSRF cookie here, and no stored session: that waits for a login. A GET, like
/// the pages: a cross-site POST carries no SameSite=Lax cookie, so it would be answered with a
/// new CSRF cookie that replaces the visitor's (staling their open forms).
#[server(prefix = "/api", endpoint = "page", input = leptos::server_fn::codec::GetUrl)]
pub async fn load_page(access: Access) -> Result<PageState, PortalError> {
    use crate::ssr::{cookies, csrf, session, Portal};

    let portal = Portal::current()?;
    let s = session::current().await?;
    let jar = cookies::jar().await?;
    let viewer = session::signed_in(&portal, &s).await?.map(|si| Viewer {
        email: si.user.email,
        admin: si.user.role == tf_core::Role::Admin,
        tenant: si.tenant.map(|t| t.display_name),
    });
    let home = |v: &Viewer| if v.admin { "/admin" } else { "/" };
    let target = match (access, &viewer) {
        (Access::Anyone, _) => None,
        (Access::Public, Some(v)) => Some(home(v)),
        (Access::Public, None) => None,
        (_, None) => Some("/login"),
        (Access::Tenant, Some(v)) if v.admin => Some("/admin"),
        _ => None,
    };
    if let Some(target) = target {
        // The flash (if any) is left for the page redirected to.
        session::redirect(target);
        return Ok(PageState {
            csrf: String::new(),
            flash: None,
            viewer: None,
            status: PageStatus::Redirect,
            ops: None,
        });
    }
    let forbidden = access == Access::Admin && viewer.as_ref().is_some_and(|v| !v.admin);
    if forbidden {
        session::set_status(http::StatusCode::FORBIDDEN);
    }
    let ops = match (&viewer, &portal.deps.ops) {
        (Some(v), Some(read)) if v.admin && access == Access::Admin => Some(read()),
        _ => None,
    };
    Ok(PageState {
        ops,
        csrf: csrf::ensure_token(&jar),
        flash: cookies::take_flash(&jar),
        viewer,
        status: if forbidden {
            PageStatus::Forbidden
        } else {
            PageStatus::Show
        },
    })
}

/// Loads the page's session state under `access` and renders `content` only when the page may be
/// shown; redirects render nothing, a 403 renders the refusal.
#[component]
pub fn Guarded(access: Access, content: fn(PageState) -> AnyView) -> impl IntoView {
    if drop_trailing_slash() {
        return ().into_any();
    }
    view! {
        <Suspense fallback=|| ()>
            // Not a reactive closure: the session is read (and the flash taken) exactly once.
            {Suspend::new(async move {
                match load_page(access).await {
                    Ok(state) => match state.status {
                        PageStatus::Show => content(state),
                        PageStatus::Redirect => ().into_any(),
                        PageStatus::Forbidden => forbidden(state),
                    },
                    Err(e) => failed(e.to_string()),
                }
            })}
        </Suspense>
    }
    .into_any()
}

fn forbidden(state: PageState) -> AnyView {
    view! {
        <Title text=format!("Forbidden · {PRODUCT}")/>
        <TopBar viewer=state.viewer csrf=state.csrf/>
        <main class="content">
            <h1>"Forbidden"</h1>
            <p class="status-code">"403: you do not have access to this page."</p>
            <p>"Your account may not open it. Nothing was shown or changed."</p>
            <p><a class="button" href="/">"Go to your home page"</a></p>
        </main>
    }
    .into_any()
}

/// A page's data failed to load: the message, no details.
pub(crate) fn load_failed(e: &impl std::fmt::Display) -> AnyView {
    view! { <p class="flash" role="alert">{e.to_string()}</p> }.into_any()
}

/// What the page was asked for is not there, or not the viewer's to see (the same answer, so an
/// id says nothing about another tenant): a 404 inside the page's frame.
pub(crate) fn missing(title: &'static str, detail: &'static str) -> AnyView {
    #[cfg(feature = "ssr")]
    crate::ssr::session::set_status(http::StatusCode::NOT_FOUND);
    view! {
        <h1>{title}</h1>
        <p class="muted">{detail}</p>
    }
    .into_any()
}

fn failed(message: String) -> AnyView {
    #[cfg(feature = "ssr")]
    crate::ssr::session::set_status(http::StatusCode::INTERNAL_SERVER_ERROR);
    view! {
        <Title text=PRODUCT/>
        <main class="content">
            <h1>"Something went wrong"</h1>
            <p class="flash" role="alert">{message}</p>
        </main>
    }
    .into_any()
}

/// What an admin may reach, in the top bar's order.
pub const ADMIN_NAV: &[(&str, &str)] = &[
    ("/admin/tenants", "Tenants"),
    ("/admin/users", "Users"),
    ("/admin/audit", "Audit"),
    ("/admin/fleet", "Fleet"),
    ("/admin/prices", "Prices"),
    ("/admin/invoices", "Invoices"),
    ("/admin/economics", "Economics"),
    ("/admin/ops", "Ops"),
];

/// What a tenant user may reach, in the top bar's order.
pub const TENANT_NAV: &[(&str, &str)] = &[
    ("/", "Home"),
    ("/keys", "Keys"),
    ("/usage", "Usage"),
    ("/logs", "Logs"),
    ("/models", "Models"),
    ("/limits", "Limits"),
    ("/invoices", "Invoices"),
    ("/members", "Members"),
    ("/settings", "Settings"),
];

/// The links the signed-in role may follow: a page it cannot open is never offered.
pub fn nav_links(viewer: Option<&Viewer>) -> &'static [(&'static str, &'static str)] {
    match viewer {
        Some(v) if v.admin => ADMIN_NAV,
        Some(_) => TENANT_NAV,
        None => &[],
    }
}

/// The bar at the top of every signed-in page: product name, the role's links, who is signed
/// in, logout.
#[component]
pub fn TopBar(viewer: Option<Viewer>, csrf: String) -> impl IntoView {
    let links = nav_links(viewer.as_ref());
    let home = if viewer.as_ref().is_some_and(|v| v.admin) {
        "/admin"
    } else {
        "/"
    };
    let email = viewer.map(|v| v.email);
    view! {
        <header class="topbar">
            <a class="brand" href=home>{PRODUCT}</a>
            <nav class="nav">
                {links
                    .iter()
                    .map(|(href, label)| view! { <a href=*href>{*label}</a> })
                    .collect_view()}
            </nav>
            <div class="who">
                <span class="email">{email}</span>
                <LogoutForm csrf=csrf/>
            </div>
        </header>
    }
}

/// What a page shows above its loaded body.
pub enum Head {
    /// The page's `h1`.
    Title(&'static str),
    /// A link back to the list a detail page belongs to (the body brings its own `h1`).
    Back(&'static str, &'static str),
    /// Nothing (the body brings its own heading).
    Nothing,
}

impl From<&'static str> for Head {
    fn from(title: &'static str) -> Self {
        Self::Title(title)
    }
}

/// The skeleton of every signed-in page: top bar, flash, head, then `body` with what `load`
/// returned and the CSRF token (or the loader's error in its place). `class` is the `main`
/// element's: [`NARROW`], or [`WIDE`] for wide tables.
pub fn framed<T, E>(
    state: PageState,
    class: &'static str,
    head: impl Into<Head>,
    load: impl std::future::Future<Output = Result<T, E>> + Send + 'static,
    body: impl FnOnce(T, String) -> AnyView + Send + 'static,
) -> AnyView
where
    T: Send + 'static,
    E: std::fmt::Display + Send + 'static,
{
    let csrf = state.csrf.clone();
    let head = match head.into() {
        Head::Title(t) => view! { <h1>{t}</h1> }.into_any(),
        Head::Back(href, label) => view! { <p><a href=href>{label}</a></p> }.into_any(),
        Head::Nothing => ().into_any(),
    };
    view! {
        <TopBar viewer=state.viewer csrf=state.csrf/>
        <main class=class>
            <Flash message=state.flash/>
            {head}
            <Suspense fallback=|| ()>
                {Suspend::new(async move {
                    match load.await {
                        Ok(v) => body(v, csrf),
                        Err(e) => load_failed(&e),
                    }
                })}
            </Suspense>
        </main>
    }
    .into_any()
}

/// The `main` class of most pages.
pub const NARROW: &str = "content";
/// The `main` class of pages with wide tables.
pub const WIDE: &str = "content wide";

/// Logout is a POST with the CSRF token, never a link: a GET must not change state.
#[component]
pub fn LogoutForm(csrf: String) -> impl IntoView {
    let logout = ServerAction::<Logout>::new();
    view! {
        <ActionForm action=logout>
            <CsrfField token=csrf/>
            <button type="submit" class="secondary">"Log out"</button>
        </ActionForm>
    }
}

/// The hidden field every form carries; server functions compare it with the session's token.
#[component]
pub fn CsrfField(token: String) -> impl IntoView {
    view! { <input type="hidden" name="csrf" value=token/> }
}

/// Shows the copy buttons (hidden without JavaScript, where the text stays selectable) and copies
/// the text of the element a button names on a click. Runs under the page's CSP nonce; no inline
/// handlers. One per page, after its buttons.
const COPY_SCRIPT: &str = r#"document.querySelectorAll("button[data-copy]").forEach(function (b) {
  var src = document.getElementById(b.getAttribute("data-copy"));
  if (!src || !navigator.clipboard) { return; }
  b.hidden = false;
  b.addEventListener("click", function () {
    navigator.clipboard.writeText(src.textContent).then(function () { b.textContent = "Copied"; });
  });
});"#;

/// The script behind every [`CopyButton`] of the page (put it once, after them).
#[component]
pub fn CopyScript() -> impl IntoView {
    view! { <script nonce=leptos::nonce::use_nonce() inner_html=COPY_SCRIPT></script> }
}

/// A "Copy" button for the text of the element with id `target`: progressive enhancement, hidden
/// until [`CopyScript`] runs (with JavaScript off the text is selected and copied by hand).
#[component]
pub fn CopyButton(target: String, #[prop(default = "Copy")] label: &'static str) -> impl IntoView {
    view! {
        <button type="button" class="secondary copy" data-copy=target hidden>{label}</button>
    }
}

/// A message left by the previous form post (shown once): green for something done, red for a
/// refusal.
#[component]
pub fn Flash(message: Option<Notice>) -> impl IntoView {
    message.map(|m| {
        if m.ok {
            view! { <p class="flash ok" role="status">{m.text}</p> }.into_any()
        } else {
            view! { <p class="flash" role="alert">{m.text}</p> }.into_any()
        }
    })
}

/// Any path no page answers (`/*any` and the router's fallback): the 404 page inside the frame,
/// so a signed-in user keeps their navigation and a visitor gets the way to sign in.
#[component]
pub fn NotFound() -> impl IntoView {
    view! { <Guarded access=Access::Anyone content=not_found/> }
}

/// The body of the 404 page under the frame the viewer gets (the admin one too).
pub fn not_found(state: PageState) -> AnyView {
    #[cfg(feature = "ssr")]
    crate::ssr::session::set_status(http::StatusCode::NOT_FOUND);
    let (bar, home, go) = match state.viewer {
        Some(v) => {
            let home = if v.admin { "/admin" } else { "/" };
            let bar = view! { <TopBar viewer=Some(v) csrf=state.csrf/> }.into_any();
            (bar, home, "Go to your home page")
        }
        None => {
            let bar = view! {
                <header class="topbar">
                    <a class="brand" href="/login">{PRODUCT}</a>
                </header>
            }
            .into_any();
            (bar, "/login", "Sign in")
        }
    };
    view! {
        <Title text=format!("Not found · {PRODUCT}")/>
        {bar}
        <main class="content">
            <h1>"Not found"</h1>
            <p class="status-code">"404: there is no page at this address."</p>
            <p><a class="button" href=home>{go}</a></p>
        </main>
    }
    .into_any()
}

/// One address per page: `/usage/` answers a permanent redirect to `/usage` (query kept). Only a
/// plain path is redirected (no `//host` or backslash that a browser could read as another site).
/// True when the redirect was set.
fn drop_trailing_slash() -> bool {
    #[cfg(feature = "ssr")]
    {
        let Some(parts) = use_context::<http::request::Parts>() else {
            return false;
        };
        let path = parts.uri.path();
        let trimmed = path.trim_end_matches('/');
        let plain = trimmed.starts_with('/')
            && !trimmed.starts_with("//")
            && trimmed
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"/-_.~%".contains(&b));
        if path.len() > 1 && path.ends_with('/') && plain {
            let target = match parts.uri.query() {
                Some(q) => format!("{trimmed}?{q}"),
                None => trimmed.to_owned(),
            };
            crate::ssr::session::redirect(&target);
            crate::ssr::session::set_status(http::StatusCode::PERMANENT_REDIRECT);
            return true;
        }
    }
    false
}
