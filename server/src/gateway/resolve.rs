//! The resolution table: every served name -> where and how it is served. An immutable snapshot
//! behind an `ArcSwap`, rebuilt from PostgreSQL when it notifies `tf_catalog_changed`; a lookup is
//! two hash probes and no I/O. A name the tenant may not use is simply absent from its view, so it
//! answers exactly like a name that does not exist.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use sqlx::PgPool;
use uuid::Uuid;

use super::upstream::{Upstream, UpstreamOptions};
use crate::base_tokenizer::BaseTokenizer;
use crate::engine_policy::{EnginePolicy, PromptEstimator};

/// How the request's `cache_salt` is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SaltPolicy {
    /// Salt with the tenant id (default): tenants never share prefix-cache blocks.
    PerTenant,
    /// An admin opted this model into a shared cache: the client's salt passes through.
    Shared,
}

/// Everything the request path needs to serve one name.
#[derive(Debug)]
pub struct Route {
    pub served_name: String,
    /// `None` for a public bare base.
    pub owner: Option<Uuid>,
    pub base: String,
    /// Adapter id and version for a tenant's model.
    pub adapter: Option<(Uuid, i32)>,
    pub graph: String,
    pub upstream: Arc<Upstream>,
    pub upstream_model: String,
    pub price_key: String,
    /// An adapter's own price key, which admission prices before `price_key` (as the rater).
    pub own_price_key: Option<String>,
    pub salt: SaltPolicy,
    pub continuous_usage: bool,
    /// Fields stripped from client bodies, and how prompts are estimated, for this base.
    pub policy: EnginePolicy,
    /// A chat or an embedding base: which endpoints may call it.
    pub kind: tf_core::endpoint::ModelKind,
    /// Unix seconds the name was registered (for `/v1/models`).
    pub created: i64,
    /// An adapter being loaded: answered 503 with `retry-after` until it is ready.
    pub starting: bool,
    /// The graph is asleep or waking, or the adapter is unloaded for idleness (or on its way
    /// out or back): requests are held until it serves (`gateway::hold`).
    pub asleep: bool,
    /// The graph's failed wakes plus the adapter's failed reloads so far (a held request that
    /// sees this grow gives up).
    pub wake_failures: i64,
    /// The graph's use mark on this replica, shared by all its routes (`super::activity`).
    pub activity: Arc<super::activity::UseMark>,
    /// The adapter's own use mark, for a tenant's model.
    pub adapter_activity: Option<Arc<super::activity::UseMark>>,
}

/// One immutable snapshot.
#[derive(Default)]
pub struct RouteSnapshot {
    public: HashMap<String, Arc<Route>>,
    owned: HashMap<Uuid, HashMap<String, Arc<Route>>>,
}

impl RouteSnapshot {
    /// The route for `name` as `tenant` sees it: its own models first, then public bases.
    pub fn get(&self, tenant: Uuid, name: &str) -> Option<&Arc<Route>> {
        self.owned
            .get(&tenant)
            .and_then(|m| m.get(name))
            .or_else(|| self.public.get(name))
    }

    /// Every route `tenant` may use, public bases first, each sorted by name.
    pub fn visible(&self, tenant: Uuid) -> Vec<&Arc<Route>> {
        let mut public: Vec<_> = self.public.values().collect();
        public.sort_by(|a, b| a.served_name.cmp(&b.served_name));
        let mut own: Vec<_> = self
            .owned
            .get(&tenant)
            .map(|m| m.values().collect())
            .unwrap_or_default();
        own.sort_by(|a, b| a.served_name.cmp(&b.served_name));
        public.extend(own);
        public
    }
}

/// A base's tokenizer as loaded, with the template version it was loaded from (`None`: the
/// template's `tokenizer.json` could not be loaded; its prompts are estimated).
struct LoadedTokenizer {
    version: time::OffsetDateTime,
    tokenizer: Option<Arc<BaseTokenizer>>,
}

/// The live table plus the pooled clients and base tokenizers it hands out (kept across rebuilds
/// so warm connections survive a catalog change and a tokenizer is parsed once per version).
pub struct RouteTable {
    pool: PgPool,
    current: ArcSwap<RouteSnapshot>,
    upstreams: Mutex<HashMap<String, Arc<Upstream>>>,
    tokenizers: Mutex<HashMap<String, LoadedTokenizer>>,
    options: UpstreamOptions,
    /// Serialises rebuilds so an older read never overwrites a newer one.
    reload_lock: tokio::sync::Mutex<()>,
    /// Bumped after every rebuild: held requests wait on it for their graph to wake.
    reloaded: tokio::sync::watch::Sender<u64>,
    /// Every graph's use mark (kept across rebuilds, read by the activity flusher).
    activity: Arc<super::activity::Activity>,
}

impl RouteTable {
    pub fn new(pool: PgPool, options: UpstreamOptions) -> Self {
        Self {
            pool,
            current: ArcSwap::from_pointee(RouteSnapshot::default()),
            upstreams: Mutex::new(HashMap::new()),
            tokenizers: Mutex::new(HashMap::new()),
            options,
            reload_lock: tokio::sync::Mutex::new(()),
            reloaded: tokio::sync::watch::Sender::new(0),
            activity: Arc::default(),
        }
    }

    /// The graphs' use marks the routes carry (the activity flusher reads them).
    pub fn activity(&self) -> &Arc<super::activity::Activity> {
        &self.activity
    }

    /// Changes whenever a new snapshot is swapped in.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.reloaded.subscribe()
    }

    /// The database the table is read from (held requests ask it for wakes).
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The current snapshot; hold it for the whole request so one request sees one table.
    pub fn snapshot(&self) -> arc_swap::Guard<Arc<RouteSnapshot>> {
        self.current.load()
    }

    /// Rebuilds the snapshot from PostgreSQL and swaps it in.
    pub async fn reload(&self) -> anyhow::Result<()> {
        let _serial = self.reload_lock.lock().await;
        let tokenizers = self.tokenizers().await?;
        let rows = tf_core::db::catalog::routes(&self.pool).await?;
        let mut next = RouteSnapshot::default();
        for row in rows {
            let tokenizer = tokenizers.get(&row.base).cloned();
            let route = Arc::new(Route {
                upstream: self.upstream(&row.upstream_url)?,
                activity: self.activity.graph(&row.graph),
                adapter_activity: row.adapter_id.map(|id| self.activity.adapter(id)),
                served_name: row.served_name.clone(),
                owner: row.owner,
                base: row.base,
                adapter: row.adapter_id.zip(row.adapter_version),
                graph: row.graph,
                upstream_model: row.upstream_model,
                price_key: row.price_key,
                own_price_key: row.own_price_key,
                salt: if row.shared_cache {
                    SaltPolicy::Shared
                } else {
                    SaltPolicy::PerTenant
                },
                continuous_usage: row.continuous_usage,
                policy: EnginePolicy::new(
                    row.denied_fields,
                    PromptEstimator::parse(&row.prompt_estimator).unwrap_or_default(),
                )
                .with_tokenizer(tokenizer)
                .with_nvext_allowed(row.nvext_allowed),
                kind: tf_core::endpoint::ModelKind::parse(&row.kind).unwrap_or_default(),
                created: row.created,
                starting: row.state == "starting",
                asleep: row.asleep,
                wake_failures: row.wake_failures,
            });
            match row.owner {
                None => {
                    next.public.insert(row.served_name, route);
                }
                Some(owner) => {
                    next.owned
                        .entry(owner)
                        .or_default()
                        .insert(row.served_name, route);
                }
            }
        }
        self.current.store(Arc::new(next));
        self.reloaded.send_modify(|n| *n = n.wrapping_add(1));
        Ok(())
    }

    /// Every base's tokenizer, by base name: each loaded once per template version (parsed off
    /// the runtime's threads) and reused by later rebuilds. A `tokenizer.json` that does not
    /// load is logged and its base falls back to its estimator.
    async fn tokenizers(&self) -> anyhow::Result<HashMap<String, Arc<BaseTokenizer>>> {
        let versions = tf_core::db::lifecycle::tokenizer_versions(&self.pool).await?;
        let mut out = HashMap::new();
        for (base, version) in versions {
            let cached = self
                .tokenizers
                .lock()
                .map_err(|_| anyhow::anyhow!("tokenizer cache poisoned"))?
                .get(&base)
                .filter(|t| t.version == version)
                .map(|t| t.tokenizer.clone());
            let tokenizer = match cached {
                Some(t) => t,
                None => {
                    let Some((json, version)) =
                        tf_core::db::lifecycle::tokenizer_json(&self.pool, &base).await?
                    else {
                        continue;
                    };
                    let parsed =
                        tokio::task::spawn_blocking(move || BaseTokenizer::from_json(&json))
                            .await?;
                    let tokenizer = match parsed {
                        Ok(t) => Some(Arc::new(t)),
                        Err(reason) => {
                            tracing::warn!(
                                base = %base,
                                reason = %reason,
                                "prompt estimates fall back: the base's tokenizer.json does not load"
                            );
                            None
                        }
                    };
                    self.tokenizers
                        .lock()
                        .map_err(|_| anyhow::anyhow!("tokenizer cache poisoned"))?
                        .insert(
                            base.clone(),
                            LoadedTokenizer {
                                version,
                                tokenizer: tokenizer.clone(),
                            },
                        );
                    tokenizer
                }
            };
            if let Some(t) = tokenizer {
                out.insert(base, t);
            }
        }
        Ok(out)
    }

    fn upstream(&self, url: &str) -> anyhow::Result<Arc<Upstream>> {
        let mut map = self
            .upstreams
            .lock()
            .map_err(|_| anyhow::anyhow!("upstream registry poisoned"))?;
        if let Some(u) = map.get(url) {
            return Ok(u.clone());
        }
        let u = Arc::new(Upstream::new(url, &self.options)?);
        map.insert(url.to_owned(), u.clone());
        Ok(u)
    }
}

/// Deletes a tenant's model and removes its route from this replica before returning (other
/// replicas follow on NOTIFY). Returns whether it existed.
pub async fn delete_adapter(
    pool: &PgPool,
    table: &RouteTable,
    tenant: Uuid,
    name: &str,
) -> anyhow::Result<bool> {
    let existed = tf_core::db::catalog::delete_adapter(pool, tenant, name).await?;
    table.reload().await?;
    Ok(existed)
}
