//! `/admin/fleet`: every templated base with its serving template, every graph with its live state
//! and replicas, every tenant's managed adapters with state and reason, as the lifecycle
//! controller last recorded them (with sleep policy and wakes, issue 18) (`tf_core::db::lifecycle`),
//! this replica's cold-start figures, and the form that sets a base's sleep policy (CSRF-checked,
//! audited through `tf_core::operator::set_idle_policy`, the path of `admin fleet idle`).

pub mod page;

use leptos::prelude::*;
use serde::{Deserialize, Serialize};

use crate::error::PortalError;

/// A base and its template.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BaseItem {
    pub name: String,
    pub fleet: String,
    pub offered: bool,
    pub model: String,
    pub image: String,
    /// The engine's arguments beyond the template's fields.
    pub engine_args: String,
    pub tensor_parallel_size: i32,
    pub gpus_per_replica: i32,
    pub replicas_min: i32,
    pub replicas_max: i32,
    pub max_loras: i32,
    pub max_lora_rank: i32,
    /// Seconds idle before the base's graph sleeps; `None`: always on.
    pub idle_after_secs: Option<i32>,
    /// Seconds idle before each of its adapters is unloaded; `None`: they stay loaded.
    pub adapter_idle_after_secs: Option<i32>,
}

/// A graph as last observed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GraphItem {
    pub base: String,
    pub name: String,
    pub state: String,
    pub reason: Option<String>,
    pub replicas_ready: i32,
    pub replicas_desired: i32,
    /// Wakes from zero replicas so far, and how many failed.
    pub wakes: i64,
    pub wake_failures: i64,
    /// Seconds idle before the graph sleeps; `None`: always on.
    pub idle_after_secs: Option<i32>,
    /// Its last template change: `rolling`, `rolled_out` or `failed`, with the reason it failed.
    pub rollout: Option<String>,
    pub rollout_reason: Option<String>,
}

/// A tenant's managed adapter.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdapterItem {
    /// The owning tenant's handle (its admin page is `/admin/tenants/{tenant}`) and display name.
    pub tenant: String,
    pub tenant_display: String,
    pub name: String,
    pub base: String,
    pub version: i32,
    pub state: String,
    pub desired: String,
    pub reason: Option<String>,
    pub engine_name: String,
    /// Reloads after being unloaded for idleness, and how many failed.
    pub reloads: i64,
    pub reload_failures: i64,
}

/// Everything `/admin/fleet` shows.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FleetView {
    pub bases: Vec<BaseItem>,
    pub graphs: Vec<GraphItem>,
    pub adapters: Vec<AdapterItem>,
    /// Requests this replica held for a wake (`None`: not available).
    pub cold: Option<crate::model::ColdSnapshot>,
}

#[server(prefix = "/api", endpoint = "admin_fleet", input = leptos::server_fn::codec::GetUrl)]
pub async fn admin_fleet() -> Result<FleetView, PortalError> {
    use crate::admin::server as admin;
    use crate::ssr::{internal, Portal};
    use tf_core::db::lifecycle;

    let portal = Portal::current()?;
    admin::required(&portal).await?;
    let pool = &portal.deps.pool;
    let failed = |e| internal("reading the fleet", e);
    let templated = lifecycle::templated_bases(pool).await.map_err(failed)?;
    let rollouts = tf_core::db::rollout::rollouts(pool).await.map_err(failed)?;
    // A graph's rollout, by its name (the rollouts are kept per base).
    let rollout_of: std::collections::HashMap<String, tf_core::db::rollout::Rollout> = templated
        .iter()
        .filter_map(|b| rollouts.get(&b.id).map(|r| (b.graph.clone(), r.clone())))
        .collect();
    let bases = templated
        .into_iter()
        .map(|b| BaseItem {
            name: b.name,
            fleet: b.fleet,
            offered: b.offered,
            model: b.template.model,
            image: b.template.image,
            engine_args: b.template.extra_args.join(" "),
            tensor_parallel_size: b.template.tensor_parallel_size,
            gpus_per_replica: b.template.gpus_per_replica,
            replicas_min: b.template.replicas_min,
            replicas_max: b.template.replicas_max,
            max_loras: b.template.max_loras,
            max_lora_rank: b.template.max_lora_rank,
            idle_after_secs: b.template.idle_after_secs,
            adapter_idle_after_secs: b.adapter_idle_after_secs,
        })
        .collect();
    let graphs = lifecycle::graphs(pool)
        .await
        .map_err(failed)?
        .into_iter()
        .map(|g| {
            let rollout = rollout_of.get(&g.name).cloned();
            GraphItem {
                base: g.base,
                rollout: rollout.as_ref().and_then(|r| r.state.clone()),
                rollout_reason: rollout.and_then(|r| r.reason),
                name: g.name,
                state: g.state,
                reason: g.reason,
                replicas_ready: g.replicas_ready,
                replicas_desired: g.replicas_desired,
                wakes: g.wakes,
                wake_failures: g.wake_failures,
                idle_after_secs: g.idle_after_secs,
            }
        })
        .collect();
    let reloads = tf_core::db::sleep::reload_counts(pool)
        .await
        .map_err(failed)?;
    let managed = lifecycle::managed_adapters(pool).await.map_err(failed)?;
    // The owners' names (a handful of tenants: one lookup each).
    let mut owners = std::collections::HashMap::new();
    for a in &managed {
        if let std::collections::hash_map::Entry::Vacant(slot) = owners.entry(a.tenant_id) {
            let t = tf_core::db::accounts::tenant_by_id(pool, a.tenant_id)
                .await
                .map_err(failed)?;
            slot.insert(t);
        }
    }
    let adapters = managed
        .into_iter()
        .map(|a| {
            let (reloads, reload_failures) = reloads.get(&a.id).copied().unwrap_or_default();
            let (tenant, tenant_display) = match owners.get(&a.tenant_id) {
                Some(Some(t)) => (t.name.clone(), t.display_name.clone()),
                _ => (a.tenant_id.to_string(), a.tenant_id.to_string()),
            };
            AdapterItem {
                tenant,
                tenant_display,
                name: a.name,
                base: a.base,
                version: a.version,
                state: a.state,
                desired: a.desired,
                reason: a.reason,
                engine_name: a.upstream_model,
                reloads,
                reload_failures,
            }
        })
        .collect();
    Ok(FleetView {
        bases,
        graphs,
        adapters,
        cold: portal.deps.cold.as_ref().map(|read| read()),
    })
}

/// `90` as `1m30s`, `3600` as `1h` (what the idle form accepts back).
pub fn duration(secs: i32) -> String {
    let mut out = String::new();
    let mut left = secs.max(0);
    for (unit, size) in [("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1)] {
        if left >= size {
            out.push_str(&format!("{}{unit}", left / size));
            left %= size;
        }
    }
    if out.is_empty() {
        out.push_str("0s");
    }
    out
}

/// Sets a base's sleep policy: `policy` `always-on`, or `idle-after` with `after` a duration
/// (`90`, `90s`, `10m`, `1h30m`; 1 s to 30 days), for its graph, or for its adapters when `scope`
/// is `adapters`. Audited as `fleet.idle_policy`.
#[server(prefix = "/api", endpoint = "admin_set_idle_policy")]
pub async fn admin_set_idle_policy(
    #[server(default)] csrf: String,
    #[server(default)] base: String,
    #[server(default)] policy: String,
    #[server(default)] after: String,
    #[server(default)] scope: String,
) -> Result<(), PortalError> {
    use crate::ssr::admin_flash::AdminFlash;
    use crate::ssr::internal;
    use tf_core::accounts::AccountError;
    use tf_core::operator::{self, IdleScope};

    const BACK: &str = "/admin/fleet";
    let Some(f) = super::form(&csrf, BACK).await? else {
        return Ok(());
    };
    let scope = match scope.as_str() {
        "" | "graph" => IdleScope::Graph,
        "adapters" => IdleScope::Adapters,
        _ => return f.back(BACK, Some(AdminFlash::IdleInvalid)),
    };
    let secs = match policy.as_str() {
        "always-on" | "always-loaded" => None,
        "idle-after" => match operator::parse_idle_after(&after) {
            Some(s) => Some(s),
            None => return f.back(BACK, Some(AdminFlash::IdleInvalid)),
        },
        _ => return f.back(BACK, Some(AdminFlash::IdleInvalid)),
    };
    let pool = &f.portal.deps.pool;
    match operator::set_idle_policy(pool, &f.actor(), base.trim(), scope, secs).await {
        Ok(()) => f.back(BACK, Some(AdminFlash::IdleSaved)),
        Err(AccountError::Invalid(_)) => f.back(BACK, Some(AdminFlash::IdleInvalid)),
        Err(AccountError::NotFound(_)) => f.back(BACK, Some(AdminFlash::NoSuchBase)),
        Err(e) => Err(internal("setting a sleep policy", e)),
    }
}
