//! Server function of `/models`: the bases a tenant may attach adapters to and the tenant's own
//! adapters with their lifecycle state, read from the same rows the lifecycle service and
//! `/api/v1/adapters` use (`tf_core::db::lifecycle`). Scoped by the session's tenant only.

pub mod page;

use leptos::prelude::*;
use serde::{Deserialize, Serialize};

use crate::error::PortalError;

/// A base offered for adapters.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BaseView {
    pub name: String,
    /// The engine's model (what the base is), shown as its description.
    pub model: String,
    pub max_lora_rank: i32,
}

/// One of the tenant's adapters.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdapterView {
    /// The name clients put in `model`.
    pub name: String,
    pub base: String,
    pub version: i32,
    pub state: String,
    /// Why it was rejected or failed, as the lifecycle recorded it.
    pub reason: Option<String>,
    /// Uploaded through the lifecycle (not placed by a fleet file): it can be started, stopped
    /// and deleted.
    pub managed: bool,
}

/// Everything `/models` shows.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelsView {
    pub bases: Vec<BaseView>,
    pub adapters: Vec<AdapterView>,
    /// Whether the viewer's role may upload, start, stop and delete (the forms are shown).
    pub can_manage: bool,
    /// The gateway's OpenAI-compatible base URL as clients reach it (`https://host/v1`).
    pub api_base: String,
}

#[server(prefix = "/api", endpoint = "models", input = leptos::server_fn::codec::GetUrl)]
pub async fn load_models() -> Result<ModelsView, PortalError> {
    use crate::ssr::{internal, member, session, Portal};
    use tf_core::db::lifecycle;

    let portal = Portal::current()?;
    let s = session::current().await?;
    let m = member::required(&portal, &s).await?;
    let pool = &portal.deps.pool;
    let failed = |e| internal("reading models", e);
    let bases = lifecycle::templated_bases(pool)
        .await
        .map_err(failed)?
        .into_iter()
        .filter(|b| b.offered)
        .map(|b| BaseView {
            name: b.name,
            model: b.template.model,
            max_lora_rank: b.template.max_lora_rank,
        })
        .collect();
    let adapters = lifecycle::tenant_adapters(pool, m.tenant.id)
        .await
        .map_err(failed)?
        .into_iter()
        .map(|a| AdapterView {
            name: a.name,
            base: a.base,
            version: a.version,
            state: a.state,
            reason: a.reason,
            managed: a.storage_uri.is_some(),
        })
        .collect();
    Ok(ModelsView {
        bases,
        adapters,
        can_manage: m.role.manages_models(),
        api_base: crate::home::api_base(portal.deps.secure_cookies),
    })
}
