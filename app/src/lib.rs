//! Token Factory's portal: Leptos components and server functions. Pages are rendered on the
//! server only (no hydration scripts) and every form is a plain HTML form posting to a server
//! function, so the portal works with JavaScript off. Server-only code (sessions, CSRF, the
//! login throttle) lives in [`ssr`], compiled only with the `ssr` feature.

pub mod api;
pub mod charts;
pub mod error;
pub mod model;
pub mod money;
pub mod pages;
pub mod ratio_chart;
#[cfg(feature = "ssr")]
pub mod ssr;

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
            <Routes fallback=pages::NotFound>
                <Route path=path!("/") view=pages::home::HomePage ssr=SsrMode::Async/>
                <Route path=path!("/login") view=pages::login::LoginPage ssr=SsrMode::Async/>
                <Route path=path!("/keys") view=pages::keys::KeysPage ssr=SsrMode::Async/>
                <Route path=path!("/usage") view=pages::usage::UsagePage ssr=SsrMode::Async/>
                <Route path=path!("/logs") view=pages::logs::LogsPage ssr=SsrMode::Async/>
                <Route path=path!("/logs/:request_id") view=pages::log_detail::LogDetailPage ssr=SsrMode::Async/>
                <Route path=path!("/limits") view=pages::limits::LimitsPage ssr=SsrMode::Async/>
                <Route path=path!("/invoices") view=pages::invoices::InvoicesPage ssr=SsrMode::Async/>
                <Route path=path!("/invoices/:id") view=pages::invoices::InvoicePage ssr=SsrMode::Async/>
                <Route path=path!("/models") view=pages::models::ModelsPage ssr=SsrMode::Async/>
                <Route path=path!("/members") view=pages::members::MembersPage ssr=SsrMode::Async/>
                <Route path=path!("/settings") view=pages::settings::SettingsPage ssr=SsrMode::Async/>
                <Route path=path!("/invite/:token") view=pages::invite::InvitePage ssr=SsrMode::Async/>
                <Route path=path!("/admin") view=pages::admin::AdminPage ssr=SsrMode::Async/>
                <Route path=path!("/admin/tenants") view=pages::admin::tenants::TenantsPage ssr=SsrMode::Async/>
                <Route path=path!("/admin/tenants/:name") view=pages::admin::tenant::TenantPage ssr=SsrMode::Async/>
                <Route path=path!("/admin/users") view=pages::admin::users::UsersPage ssr=SsrMode::Async/>
                <Route path=path!("/admin/audit") view=pages::admin::audit::AuditPage ssr=SsrMode::Async/>
                <Route path=path!("/admin/ops") view=pages::admin::ops::OpsPage ssr=SsrMode::Async/>
                <Route path=path!("/admin/fleet") view=pages::admin::fleet::FleetPage ssr=SsrMode::Async/>
                <Route path=path!("/admin/economics") view=pages::admin::economics::EconomicsPage ssr=SsrMode::Async/>
                <Route path=path!("/admin/prices") view=pages::admin::prices::PricesPage ssr=SsrMode::Async/>
                <Route path=path!("/admin/invoices") view=pages::admin::invoices::AdminInvoicesPage ssr=SsrMode::Async/>
                <Route path=path!("/admin/invoices/:id") view=pages::admin::invoices::AdminInvoicePage ssr=SsrMode::Async/>
                <Route path=path!("/admin/*any") view=pages::admin::AdminNotFound ssr=SsrMode::Async/>
            </Routes>
        </Router>
    }
}
