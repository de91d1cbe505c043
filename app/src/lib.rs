//! Token Factory's portal: Leptos components and server functions. Pages are rendered on the
//! server only (no hydration scripts) and every form is a plain HTML form posting to a server
//! function, so the portal works with JavaScript off. One module per feature (`keys`, `usage`,
//! `invoices`, `admin::billing`, ...) holds its types and `#[server]` functions, its page(s), and
//! its server-only code as a `server` child compiled only with the `ssr` feature; a child may
//! import its parent, nothing imports back. What every feature shares: [`frame`] (the page
//! skeleton and access guard) and [`ssr`] (sessions, cookies, CSRF, the login throttle).

pub mod admin;
pub mod audit;
pub mod error;
pub mod frame;
pub mod home;
pub mod invoices;
pub mod keys;
pub mod limits;
pub mod login;
pub mod members;
pub mod model;
pub mod models;
pub mod money;
pub mod settings;
#[cfg(feature = "ssr")]
pub mod ssr;
pub mod usage;

use leptos::prelude::*;
use leptos_meta::{provide_meta_context, MetaTags};
use leptos_router::components::{Route, Router, Routes};
use leptos_router::{path, SsrMode};

/// URL prefix of every server function; must match the `prefix` in each `#[server]` attribute.
pub const API_PREFIX: &str = "/api";
/// Where the stylesheet is served (from a copy compiled into the binary).
pub const STYLESHEET_PATH: &str = "/style.css";
/// Where the icon is served; browsers ask for this path on their own.
pub const ICON_PATH: &str = "/favicon.ico";
/// Name in the top bar and page titles.
pub const PRODUCT: &str = "Token Factory";

/// The HTML document around the app. No `HydrationScripts`: the pages need no JavaScript.
pub fn shell() -> impl IntoView {
    #[cfg(feature = "ssr")]
    ssr::set_page_policy();
    view! {
        <!DOCTYPE html>
        <html lang="en">
            <head>
                <meta charset="utf-8"/>
                <meta name="viewport" content="width=device-width, initial-scale=1"/>
                <link rel="stylesheet" href=STYLESHEET_PATH/>
                <link rel="icon" type="image/svg+xml" href=ICON_PATH/>
                <MetaTags/>
            </head>
            <body>
                <App/>
            </body>
        </html>
    }
}

/// The portal's routes. Each renders asynchronously so the session is read and any redirect or
/// status is set before the first byte is sent.
#[component]
pub fn App() -> impl IntoView {
    provide_meta_context();
    view! {
        <Router>
            <Routes fallback=frame::NotFound>
                <Route path=path!("/") view=home::page::HomePage ssr=SsrMode::Async/>
                <Route path=path!("/login") view=login::page::LoginPage ssr=SsrMode::Async/>
                <Route path=path!("/keys") view=keys::page::KeysPage ssr=SsrMode::Async/>
                <Route path=path!("/usage") view=usage::page::UsagePage ssr=SsrMode::Async/>
                <Route path=path!("/logs") view=usage::logs::LogsPage ssr=SsrMode::Async/>
                <Route path=path!("/logs/:request_id") view=usage::log_detail::LogDetailPage ssr=SsrMode::Async/>
                <Route path=path!("/limits") view=limits::page::LimitsPage ssr=SsrMode::Async/>
                <Route path=path!("/invoices") view=invoices::page::InvoicesPage ssr=SsrMode::Async/>
                <Route path=path!("/invoices/:id") view=invoices::page::InvoicePage ssr=SsrMode::Async/>
                <Route path=path!("/models") view=models::page::ModelsPage ssr=SsrMode::Async/>
                <Route path=path!("/members") view=members::page::MembersPage ssr=SsrMode::Async/>
                <Route path=path!("/settings") view=settings::page::SettingsPage ssr=SsrMode::Async/>
                <Route path=path!("/audit") view=audit::page::TenantAuditPage ssr=SsrMode::Async/>
                <Route path=path!("/invite/:token") view=members::invite::InvitePage ssr=SsrMode::Async/>
                <Route path=path!("/admin") view=admin::page::AdminPage ssr=SsrMode::Async/>
                <Route path=path!("/admin/tenants") view=admin::tenants::page::TenantsPage ssr=SsrMode::Async/>
                <Route path=path!("/admin/tenants/:name") view=admin::tenants::detail::TenantPage ssr=SsrMode::Async/>
                <Route path=path!("/admin/users") view=admin::users::page::UsersPage ssr=SsrMode::Async/>
                <Route path=path!("/admin/audit") view=admin::audit::page::AuditPage ssr=SsrMode::Async/>
                <Route path=path!("/admin/ops") view=admin::ops::page::OpsPage ssr=SsrMode::Async/>
                <Route path=path!("/admin/fleet") view=admin::fleet::page::FleetPage ssr=SsrMode::Async/>
                <Route path=path!("/admin/economics") view=admin::economics::page::EconomicsPage ssr=SsrMode::Async/>
                <Route path=path!("/admin/prices") view=admin::billing::prices::PricesPage ssr=SsrMode::Async/>
                <Route path=path!("/admin/invoices") view=admin::billing::invoices::AdminInvoicesPage ssr=SsrMode::Async/>
                <Route path=path!("/admin/invoices/:id") view=admin::billing::invoices::AdminInvoicePage ssr=SsrMode::Async/>
                <Route path=path!("/admin/*any") view=admin::page::AdminNotFound ssr=SsrMode::Async/>
                // Every other path: registered with the server (a fallback alone is not), so an
                // unknown URL gets the 404 page inside the frame, not an empty answer.
                <Route path=path!("/*any") view=frame::NotFound ssr=SsrMode::Async/>
            </Routes>
        </Router>
    }
}
