//! The fleet controller: one leader per cluster (a PostgreSQL advisory lock held on a connection
//! of its own) reconciles the desired state in PostgreSQL into a [`FleetBackend`] and writes what
//! it observes back, with history. Every pass re-sends the whole desired state, so a pass that
//! failed half-way is finished by the next; a failing graph or adapter backs off on its own
//! without holding up the others, and every error is counted by kind.
//!
//! Scale to zero (issue 18): a graph whose base has an idle policy and saw no request for that
//! long goes `asleep` (routes first: requests are held; replicas stopped after a grace), and a
//! held request's wake request takes it through `waking` back to `ready`; a wake that fails
//! goes back to `asleep` with the reason.
//!
//! An idle adapter on a warm graph (its base's adapter policy) goes `unloading` (routes first:
//! its requests are held), leaves the engines after the same grace (`unloaded`), and a held
//! request's reload request takes it through `reloading` back to `ready` (waking its graph first
//! if that sleeps too); a reload that fails goes back to `unloaded` with the reason. The graph and
//! its other adapters are not touched.
//!
//! Start = the base's graph exists (created if needed), then the adapter is registered on it;
//! stop = that adapter is deregistered, nothing else; delete = deregistered, its files removed,
//! its row removed, and the graph torn down when no model is left on it (unless the bare base is
//! offered).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::{Connection, PgConnection, PgPool};
use tf_core::db::lifecycle::{self as db, AdapterRow, GraphWrite, SleepFacts, TemplatedBase};
use tf_core::db::sleep as sleep_db;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::metrics::FleetMetrics;
use super::service::record_adapter;
use super::storage::AdapterStore;
use crate::fleet::backend::{
    AdapterSpec, FleetBackend, FleetError, GraphObserved, GraphSpec, Phase,
};
use crate::fleet::dynamo_render::ServingTemplate;

/// The advisory lock key of the fleet controller ("tffleet").
pub const LEADER_KEY: i64 = 0x0074_6666_6c65_6574;
/// First retry delay after an error; doubles per consecutive error up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(250);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// How long a replica that is not the leader waits before trying to take the lock again.
const FOLLOWER_RETRY: Duration = Duration::from_secs(2);
/// How long an asleep graph keeps its replicas before they stop: longer than a gateway's
/// activity flush (`gateway::activity`), so a request forwarded just before the routes changed
/// is seen, and the graph goes back to ready instead of losing replicas under it.
const SLEEP_GRACE_SECS: f64 = 2.5;

/// Adapter states that keep a model on its base (so its graph stays up).
const ON_BASE: [&str; 8] = [
    "stopped",
    "starting",
    "ready",
    "stopping",
    "failed",
    "unloading",
    "unloaded",
    "reloading",
];
/// Adapter states of an idle adapter: on its way off the engines, off them, or on its way back.
const IDLE: [&str; 3] = ["unloading", "unloaded", "reloading"];
/// Adapter states in which the engines may have it loaded (a delete or stop deregisters it).
const MAYBE_LOADED: [&str; 5] = ["starting", "ready", "stopping", "unloading", "reloading"];

#[derive(Debug, Clone, Copy)]
pub struct ControllerOptions {
    /// How often the leader reconciles.
    pub tick: Duration,
}

impl Default for ControllerOptions {
    fn default() -> Self {
        Self {
            tick: Duration::from_millis(250),
        }
    }
}

/// A failing entity's retry schedule.
#[derive(Debug, Clone, Copy)]
struct Backoff {
    failures: u32,
    next: Instant,
}

pub struct Controller {
    pool: PgPool,
    backend: Arc<dyn FleetBackend>,
    metrics: Arc<FleetMetrics>,
    options: ControllerOptions,
    backoff: HashMap<String, Backoff>,
    /// Where deleted adapters' files are removed from; `None`: they are left in place.
    store: Option<AdapterStore>,
}

impl Controller {
    pub fn new(
        pool: PgPool,
        backend: Arc<dyn FleetBackend>,
        metrics: Arc<FleetMetrics>,
        options: ControllerOptions,
    ) -> Self {
        Self {
            pool,
            backend,
            metrics,
            options,
            backoff: HashMap::new(),
            store: None,
        }
    }

    /// Removes a deleted adapter's stored files from `store` (the one its uploads went to).
    #[must_use]
    pub fn with_store(mut self, store: AdapterStore) -> Self {
        self.store = Some(store);
        self
    }

    /// Runs until `cancel`: waits for the lock, then reconciles every tick while it holds it.
    pub async fn run(mut self, cancel: CancellationToken) {
        loop {
            match self.lead(&cancel).await {
                Ok(()) => {}
                Err(e) => {
                    self.metrics.error("database");
                    tracing::warn!(error = %e, "fleet controller lost its database connection");
                }
            }
            self.metrics.set_leader(false);
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(FOLLOWER_RETRY) => {}
            }
        }
    }

    /// Takes the lock if free and reconciles until `cancel` or until the connection fails.
    async fn lead(&mut self, cancel: &CancellationToken) -> sqlx::Result<()> {
        let mut conn = PgConnection::connect_with(&self.pool.connect_options()).await?;
        if !tf_core::db::leader::try_lock(&mut conn, LEADER_KEY).await? {
            return conn.close().await;
        }
        self.metrics.set_leader(true);
        tracing::info!(backend = self.backend.kind(), "fleet controller leading");
        let mut tick = tokio::time::interval(self.options.tick);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = cancel.cancelled() => break,
                _ = tick.tick() => {}
            }
            tf_core::db::leader::ping(&mut conn).await?;
            if let Err(e) = self.reconcile_once().await {
                self.metrics.error("database");
                tracing::warn!(error = %e, "fleet reconcile pass failed");
            }
        }
        tf_core::db::leader::unlock(&mut conn, LEADER_KEY).await?;
        conn.close().await
    }

    /// One pass over the whole desired state (public so tests can drive passes themselves).
    pub async fn reconcile_once(&mut self) -> sqlx::Result<()> {
        self.metrics.pass();
        let kind = self.backend.kind();
        let bases: Vec<TemplatedBase> = db::templated_bases(&self.pool)
            .await?
            .into_iter()
            .filter(|b| b.fleet == kind)
            .collect();
        let ours: HashSet<Uuid> = bases.iter().map(|b| b.id).collect();
        let adapters: Vec<AdapterRow> = db::managed_adapters(&self.pool)
            .await?
            .into_iter()
            .filter(|a| ours.contains(&a.base_model_id))
            .collect();
        // Only an adapter policy, or an adapter idle under one, needs the adapters' use: without
        // either (the usual fleet) a pass reads nothing more.
        let adapter_sleep = if bases.iter().any(|b| b.adapter_idle_after_secs.is_some())
            || adapters.iter().any(|a| IDLE.contains(&a.state.as_str()))
        {
            sleep_db::adapter_sleep(&self.pool).await?
        } else {
            HashMap::new()
        };
        let sleep_of = |a: &AdapterRow| adapter_sleep.get(&a.id).copied().unwrap_or_default();
        let needed = |base: &TemplatedBase| {
            base.offered
                || adapters.iter().any(|a| {
                    a.base_model_id == base.id
                        && a.desired != "deleted"
                        && ON_BASE.contains(&a.state.as_str())
                })
        };
        // An adapter started or reloaded on an asleep base wakes it, like a request.
        let wake = |base: &TemplatedBase| {
            base.sleep.wake_requested
                || adapters.iter().any(|a| {
                    a.base_model_id == base.id
                        && a.desired == "running"
                        && (matches!(a.state.as_str(), "starting" | "reloading")
                            || (a.state == "unloaded" && sleep_of(a).wake_requested))
                })
        };
        let mut ready_graphs = HashSet::new();
        for base in bases.iter().filter(|b| needed(b)) {
            if self.ensure_graph(base, wake(base)).await? {
                ready_graphs.insert(base.id);
            }
        }
        for adapter in &adapters {
            let Some(base) = bases.iter().find(|b| b.id == adapter.base_model_id) else {
                continue;
            };
            self.reconcile_adapter(
                base,
                adapter,
                ready_graphs.contains(&base.id),
                sleep_of(adapter),
            )
            .await?;
        }
        for base in bases
            .iter()
            .filter(|b| !needed(b) && b.graph_state.is_some())
        {
            self.tear_down(base).await?;
        }
        Ok(())
    }

    /// Makes the base's graph exist (and sleep or wake per its policy); returns whether it is
    /// ready to take adapters.
    async fn ensure_graph(&mut self, base: &TemplatedBase, wake: bool) -> sqlx::Result<bool> {
        let key = format!("graph:{}", base.id);
        if self.waiting(&key) {
            return Ok(base.graph_state.as_deref() == Some("ready"));
        }
        match base.graph_state.as_deref() {
            Some("ready") if base.sleep.idle && !wake => {
                self.fall_asleep(base).await?;
                return Ok(false);
            }
            Some("asleep") => return self.asleep(base, wake).await,
            Some("waking") => return self.waking(base).await,
            _ => {}
        }
        let spec = graph_spec(base);
        let observed = if base.graph_state.as_deref() == Some("ready") {
            match self.backend.observe_graph(&spec.graph).await {
                Ok(Some(o)) if o.phase == Phase::Ready => Ok(o),
                Ok(_) => self.backend.apply_graph(&spec).await,
                Err(e) => Err(e),
            }
        } else {
            self.backend.apply_graph(&spec).await
        };
        match observed {
            Ok(o) => {
                self.succeeded(&key);
                let (state, reason) = match &o.phase {
                    Phase::Pending => ("pending", None),
                    Phase::Ready => ("ready", None),
                    Phase::Asleep => ("asleep", None),
                    Phase::Failed(r) => ("failed", Some(r.as_str())),
                };
                self.write_graph(base, state, reason, &o).await?;
                Ok(o.phase == Phase::Ready)
            }
            Err(e) => {
                self.failed(&key, &e);
                Ok(false)
            }
        }
    }

    /// Idle past its policy: the routes first (new requests are held from now on), the replicas
    /// after [`SLEEP_GRACE_SECS`] ([`Self::asleep`]).
    async fn fall_asleep(&self, base: &TemplatedBase) -> sqlx::Result<()> {
        let reason = idle_reason(base);
        db::set_graph(
            &self.pool,
            &GraphWrite {
                base_model_id: base.id,
                name: &base.graph,
                state: "asleep",
                reason: Some(&reason),
                replicas_ready: base.replicas_ready.unwrap_or(0),
                replicas_desired: base.replicas_desired.unwrap_or(0),
                floor: base.template.replicas_min,
            },
        )
        .await?;
        tracing::info!(graph = %base.graph, "graph idle: going to sleep");
        Ok(())
    }

    /// An asleep graph: woken when asked; else its replicas stop once the grace is over, unless
    /// a request reached it meanwhile (forwarded before this replica's routes changed), which
    /// puts it back to ready.
    async fn asleep(&mut self, base: &TemplatedBase, wake: bool) -> sqlx::Result<bool> {
        let key = format!("graph:{}", base.id);
        if wake {
            if sleep_db::begin_wake(&self.pool, base.id, &base.graph, base.template.replicas_min)
                .await?
            {
                self.metrics.wake();
                tracing::info!(graph = %base.graph, "waking graph");
            }
            return self.waking(base).await;
        }
        let (ready, desired) = (
            base.replicas_ready.unwrap_or(0),
            base.replicas_desired.unwrap_or(0),
        );
        if desired == 0 && ready == 0 {
            return Ok(false);
        }
        if base.sleep.used_since_change && desired > 0 {
            let o = GraphObserved {
                phase: Phase::Ready,
                replicas_ready: u32::try_from(ready).unwrap_or(0),
                replicas_desired: u32::try_from(desired).unwrap_or(0),
                frontend_url: base.upstream_url.clone(),
            };
            self.write_graph(base, "ready", None, &o).await?;
            return Ok(false);
        }
        if base.sleep.changed_secs_ago < SLEEP_GRACE_SECS {
            return Ok(false);
        }
        let mut spec = graph_spec(base);
        spec.template.replicas = 0;
        match self.backend.apply_graph(&spec).await {
            Ok(o) => {
                self.succeeded(&key);
                let reason = idle_reason(base);
                self.write_graph(base, "asleep", Some(&reason), &o).await?;
            }
            Err(e) => self.failed(&key, &e),
        }
        Ok(false)
    }

    /// A waking graph: scaled back to its floor until the backend reports it ready; a wake that
    /// cannot succeed puts it back to sleep, and every held request gives up.
    async fn waking(&mut self, base: &TemplatedBase) -> sqlx::Result<bool> {
        let key = format!("graph:{}", base.id);
        let spec = graph_spec(base);
        let failure = match self.backend.apply_graph(&spec).await {
            Ok(o) => match &o.phase {
                Phase::Ready => {
                    self.succeeded(&key);
                    self.write_graph(base, "ready", None, &o).await?;
                    return Ok(true);
                }
                Phase::Failed(r) => r.clone(),
                Phase::Pending | Phase::Asleep => {
                    self.succeeded(&key);
                    self.write_graph(base, "waking", None, &o).await?;
                    return Ok(false);
                }
            },
            Err(FleetError::Rejected(r)) => r,
            Err(e) => {
                self.failed(&key, &e);
                return Ok(false);
            }
        };
        let mut down = spec;
        down.template.replicas = 0;
        if let Err(e) = self.backend.apply_graph(&down).await {
            tracing::warn!(graph = %base.graph, error = %e, "could not stop a failed wake's replicas");
        }
        let reason = format!("wake failed: {failure}");
        sleep_db::wake_failed(&self.pool, base.id, &base.graph, &reason).await?;
        self.metrics.wake_failed();
        self.failed(&key, &FleetError::Rejected(reason));
        Ok(false)
    }

    async fn write_graph(
        &self,
        base: &TemplatedBase,
        state: &str,
        reason: Option<&str>,
        o: &GraphObserved,
    ) -> sqlx::Result<()> {
        let desired = i32::try_from(o.replicas_desired).unwrap_or(i32::MAX);
        let ready = i32::try_from(o.replicas_ready).unwrap_or(i32::MAX);
        let unchanged = base.graph_state.as_deref() == Some(state)
            && base.replicas_desired == Some(desired)
            && base.replicas_ready == Some(ready);
        if !unchanged {
            db::set_graph(
                &self.pool,
                &GraphWrite {
                    base_model_id: base.id,
                    name: &base.graph,
                    state,
                    reason,
                    replicas_ready: ready,
                    replicas_desired: desired,
                    floor: base.template.replicas_min,
                },
            )
            .await?;
        }
        if o.phase == Phase::Ready && base.upstream_url != o.frontend_url {
            db::set_base_upstream(&self.pool, base.id, &o.frontend_url).await?;
        }
        Ok(())
    }

    async fn tear_down(&mut self, base: &TemplatedBase) -> sqlx::Result<()> {
        let key = format!("graph:{}", base.id);
        if self.waiting(&key) {
            return Ok(());
        }
        match self.backend.delete_graph(&base.graph).await {
            Ok(()) => {
                self.succeeded(&key);
                db::delete_graph_row(&self.pool, base.id, &base.graph).await
            }
            Err(e) => {
                self.failed(&key, &e);
                Ok(())
            }
        }
    }

    async fn reconcile_adapter(
        &mut self,
        base: &TemplatedBase,
        a: &AdapterRow,
        graph_ready: bool,
        sleep: SleepFacts,
    ) -> sqlx::Result<()> {
        let key = format!("adapter:{}", a.id);
        if self.waiting(&key) {
            return Ok(());
        }
        let Some(spec) = adapter_spec(base, a) else {
            return Ok(());
        };
        let outcome = match (a.desired.as_str(), a.state.as_str()) {
            ("running", "starting") if graph_ready => {
                match self.backend.apply_adapter(&spec).await {
                    Ok(o) => match o.phase {
                        Phase::Ready => self.transition(a, "ready", None).await.map(|()| Ok(())),
                        Phase::Pending | Phase::Asleep => Ok(Ok(())),
                        Phase::Failed(r) => self
                            .transition(a, "failed", Some(&r))
                            .await
                            .map(|()| Ok(())),
                    },
                    Err(FleetError::Rejected(r)) => self
                        .transition(a, "failed", Some(&r))
                        .await
                        .map(|()| Ok(())),
                    Err(e) => Ok(Err(e)),
                }
            }
            ("running", "ready")
                if graph_ready && base.adapter_idle_after_secs.is_some() && sleep.idle =>
            {
                let reason = adapter_idle_reason(base);
                tracing::info!(model = %a.name, "adapter idle: unloading");
                self.transition(a, "unloading", Some(&reason))
                    .await
                    .map(|()| Ok(()))
            }
            ("running", "unloading") if sleep.wake_requested || sleep.used_since_change => {
                // Asked for, or used by a request forwarded before the routes changed: it never
                // left the engines.
                self.transition(a, "ready", None).await.map(|()| Ok(()))
            }
            ("running", "unloading") if sleep.changed_secs_ago >= SLEEP_GRACE_SECS => {
                match self.backend.remove_adapter(&spec).await {
                    Ok(()) => {
                        let reason = adapter_idle_reason(base);
                        self.transition(a, "unloaded", Some(&reason))
                            .await
                            .map(|()| Ok(()))
                    }
                    Err(e) => Ok(Err(e)),
                }
            }
            ("running", "unloaded") if sleep.wake_requested => {
                self.metrics.reload();
                tracing::info!(model = %a.name, "reloading an idle adapter");
                self.transition(a, "reloading", Some("a request arrived"))
                    .await
                    .map(|()| Ok(()))
            }
            ("running", "reloading") if graph_ready => {
                let failure = match self.backend.apply_adapter(&spec).await {
                    Ok(o) => match o.phase {
                        Phase::Ready => None,
                        Phase::Pending | Phase::Asleep => return Ok(()),
                        Phase::Failed(r) => Some(r),
                    },
                    Err(FleetError::Rejected(r)) => Some(r),
                    Err(e) => {
                        self.failed(&key, &e);
                        return Ok(());
                    }
                };
                match failure {
                    None => self.transition(a, "ready", None).await.map(|()| Ok(())),
                    Some(r) => {
                        self.metrics.reload_failed();
                        // Whatever half-loaded stays off the engines until the next reload.
                        if let Err(e) = self.backend.remove_adapter(&spec).await {
                            tracing::warn!(model = %a.name, error = %e, "could not unload a failed reload");
                        }
                        let reason = format!("reload failed: {r}");
                        self.transition(a, "unloaded", Some(&reason))
                            .await
                            .map(|()| Ok(()))
                    }
                }
            }
            ("running", "ready") if graph_ready => {
                match self.backend.observe_adapter(&spec).await {
                    Ok(Some(o)) if o.phase == Phase::Ready => Ok(Ok(())),
                    // Lost on a replica (restarted): register it again.
                    Ok(_) => Ok(self.backend.apply_adapter(&spec).await.map(|_| ())),
                    Err(e) => Ok(Err(e)),
                }
            }
            ("stopped", "stopping") => match self.backend.remove_adapter(&spec).await {
                Ok(()) => self.transition(a, "stopped", None).await.map(|()| Ok(())),
                Err(e) => Ok(Err(e)),
            },
            ("deleted", state) if !matches!(state, "uploading" | "validating") => {
                let removed = if MAYBE_LOADED.contains(&state) {
                    self.backend.remove_adapter(&spec).await
                } else {
                    Ok(())
                };
                match removed {
                    Ok(()) => self.forget(a).await,
                    Err(e) => Ok(Err(e)),
                }
            }
            _ => Ok(Ok(())),
        }?;
        match outcome {
            Ok(()) => self.succeeded(&key),
            Err(e) => self.failed(&key, &e),
        }
        Ok(())
    }

    /// Moves an adapter from the state this pass read to `to`, unless its owner changed it since
    /// (with an idle adapter's reload counters and request, `sleep_db::adapter_stepped`).
    async fn transition(&self, a: &AdapterRow, to: &str, reason: Option<&str>) -> sqlx::Result<()> {
        let mut tx = self.pool.begin().await?;
        if let Some(row) = db::lock_adapter_by_id(&mut tx, a.id).await? {
            if row.state == a.state && row.desired == a.desired && row.version == a.version {
                db::set_adapter(&mut tx, row.id, &row.desired, to, reason).await?;
                record_adapter(&mut tx, &row, to, reason).await?;
                let failed_reload = a.state == "reloading" && to == "unloaded";
                sleep_db::adapter_stepped(&mut tx, row.id, to, failed_reload).await?;
            }
        }
        tx.commit().await
    }

    /// A deleted adapter, deregistered: its files (every version) and its row go; its history
    /// stays. A store that cannot be reached leaves the row, so the next pass tries again.
    async fn forget(&self, a: &AdapterRow) -> sqlx::Result<Result<(), FleetError>> {
        if let (Some(store), Some(uri)) = (&self.store, a.storage_uri.as_deref()) {
            match store.remove_adapter(uri, &a.id.simple().to_string()).await {
                Ok(()) => {}
                // Kept in a store this replica is not configured with: nothing to retry.
                Err(e @ super::storage::StoreError::Config { .. }) => {
                    tracing::warn!(error = %e, uri, "an adapter's files are not in this store");
                }
                Err(e) => return Ok(Err(FleetError::Unavailable(format!("adapter store: {e}")))),
            }
        }
        let mut tx = self.pool.begin().await?;
        if let Some(row) = db::lock_adapter_by_id(&mut tx, a.id).await? {
            if row.desired == "deleted" {
                db::delete_adapter_row(&mut tx, row.id).await?;
                record_adapter(&mut tx, &row, "deleted", None).await?;
            }
        }
        tx.commit().await?;
        Ok(Ok(()))
    }

    fn waiting(&self, key: &str) -> bool {
        self.backoff
            .get(key)
            .is_some_and(|b| Instant::now() < b.next)
    }

    fn succeeded(&mut self, key: &str) {
        self.backoff.remove(key);
    }

    fn failed(&mut self, key: &str, e: &FleetError) {
        self.metrics.error(e.kind());
        let failures = self.backoff.get(key).map_or(0, |b| b.failures) + 1;
        let delay = FIRST_BACKOFF
            .saturating_mul(1 << failures.min(8))
            .min(MAX_BACKOFF);
        tracing::warn!(entity = key, error = %e, retry_in = ?delay, "fleet backend call failed");
        self.backoff.insert(
            key.to_owned(),
            Backoff {
                failures,
                next: Instant::now() + delay,
            },
        );
    }
}

/// Why an asleep graph sleeps, for the admin page.
fn idle_reason(base: &TemplatedBase) -> String {
    format!(
        "idle for {} s",
        base.template.idle_after_secs.unwrap_or_default()
    )
}

/// Why an idle adapter is unloaded, for its owner and the admin page.
fn adapter_idle_reason(base: &TemplatedBase) -> String {
    format!(
        "idle for {} s; the next request loads it again",
        base.adapter_idle_after_secs.unwrap_or_default()
    )
}

/// The backend's view of a templated base.
pub fn graph_spec(base: &TemplatedBase) -> GraphSpec {
    let t = &base.template;
    let u = |v: i32| u32::try_from(v).unwrap_or(1);
    GraphSpec {
        base: base.name.clone(),
        graph: base.graph.clone(),
        template: ServingTemplate {
            model: t.model.clone(),
            image: t.image.clone(),
            gpus_per_replica: u(t.gpus_per_replica),
            replicas: u(t.replicas_min),
            tensor_parallel_size: u(t.tensor_parallel_size),
            quantization: t.quantization.clone(),
            max_loras: u(t.max_loras),
            max_lora_rank: u64::from(u(t.max_lora_rank)),
            extra_args: t.extra_args.clone(),
            env_from_secret: t.env_from_secret.clone(),
        },
    }
}

fn adapter_spec(base: &TemplatedBase, a: &AdapterRow) -> Option<AdapterSpec> {
    Some(AdapterSpec {
        graph: base.graph.clone(),
        base: base.name.clone(),
        lora_name: a.upstream_model.clone(),
        source_uri: a.storage_uri.clone()?,
    })
}
