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
//! stop = that adapter is deregistered; delete = deregistered, its files removed, its row
//! removed. A graph exists only while an adapter on it is started (or on its way on or off the
//! engines) or its bare base is offered: a bare upload creates none, and the last stop or delete
//! on a base that is not offered tears its graph down (issue 30).
//!
//! Rollouts (issue 30): each graph's spec fingerprint ([`FleetBackend::fingerprint`]) is stored
//! with its rollout state (`rolling`, `rolled_out`, `failed`); a new template (a new
//! fingerprint) is applied to the running graph, an unchanged one is only observed. An adapter is
//! `ready` only while the backend reports it loaded everywhere on a ready graph; otherwise it goes
//! back to `starting` with the backend's message as its reason, and `starting` for longer than
//! the start timeout is `failed` with that reason. An adapter whose rank exceeds its base's
//! (lowered) `max_lora_rank` is stopped with the reason instead of being served.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::{Connection, PgConnection, PgPool};
use tf_core::db::lifecycle::{self as db, AdapterRow, GraphWrite, SleepFacts, TemplatedBase};
use tf_core::db::rollout::{self as rollout_db, Rollout};
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

/// Adapter states that keep their base's graph up: started, or on the way on or off the engines
/// (an idle adapter unloaded for now comes back with the next request). A stopped or failed
/// adapter does not: its GPUs are not held for it.
const KEEPS_GRAPH: [&str; 6] = [
    "starting",
    "ready",
    "stopping",
    "unloading",
    "unloaded",
    "reloading",
];
/// Adapter states that are served (or about to be): those are stopped when their rank no longer
/// fits the base's `max_lora_rank`.
const SERVED: [&str; 5] = ["starting", "ready", "unloading", "unloaded", "reloading"];
/// How long an adapter may stay `starting` by default (`--adapter-start-timeout`).
pub const DEFAULT_START_TIMEOUT: Duration = Duration::from_secs(900);
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

/// Where a base's graph is after this pass's look at it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GraphNow {
    /// Ready to take adapters.
    Ready,
    /// Asleep or waking on purpose: its adapters keep their state.
    Resting,
    /// Not there or not ready: its adapters are not served.
    NotReady,
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
    /// How long an adapter may stay `starting` before it is `failed`.
    start_timeout: Duration,
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
            start_timeout: DEFAULT_START_TIMEOUT,
        }
    }

    /// How long an adapter may stay `starting` before it is `failed` with the backend's reason.
    #[must_use]
    pub fn with_start_timeout(mut self, timeout: Duration) -> Self {
        self.start_timeout = timeout;
        self
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
                        && KEEPS_GRAPH.contains(&a.state.as_str())
                })
        };
        let rollouts = rollout_db::rollouts(&self.pool).await?;
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
        let mut graphs_now = HashMap::new();
        for base in bases.iter().filter(|b| needed(b)) {
            let now = self
                .ensure_graph(base, wake(base), rollouts.get(&base.id))
                .await?;
            graphs_now.insert(base.id, now);
        }
        for adapter in &adapters {
            let Some(base) = bases.iter().find(|b| b.id == adapter.base_model_id) else {
                continue;
            };
            let now = graphs_now
                .get(&base.id)
                .copied()
                .unwrap_or(GraphNow::NotReady);
            self.reconcile_adapter(base, adapter, now, sleep_of(adapter))
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

    /// Makes the base's graph exist (and sleep or wake per its policy) with its current spec
    /// rolled out; returns where it is.
    async fn ensure_graph(
        &mut self,
        base: &TemplatedBase,
        wake: bool,
        rollout: Option<&Rollout>,
    ) -> sqlx::Result<GraphNow> {
        let key = format!("graph:{}", base.id);
        if self.waiting(&key) {
            return Ok(match base.graph_state.as_deref() {
                Some("ready") => GraphNow::Ready,
                Some("asleep" | "waking") => GraphNow::Resting,
                _ => GraphNow::NotReady,
            });
        }
        let resting = |ready: bool| {
            if ready {
                GraphNow::Ready
            } else {
                GraphNow::Resting
            }
        };
        match base.graph_state.as_deref() {
            Some("ready") if base.sleep.idle && !wake => {
                self.fall_asleep(base).await?;
                return Ok(GraphNow::Resting);
            }
            Some("asleep") => return self.asleep(base, wake).await.map(resting),
            Some("waking") => return self.waking(base).await.map(resting),
            _ => {}
        }
        let spec = graph_spec(base);
        let fingerprint = self.backend.fingerprint(&spec);
        // A rollout that failed is tried again (with backoff) until the spec changes or succeeds.
        let unchanged = rollout.is_some_and(|r| {
            r.spec_hash.as_deref() == Some(fingerprint.as_str())
                && r.state.as_deref() != Some("failed")
        });
        let observed = if base.graph_state.as_deref() == Some("ready") && unchanged {
            match self.backend.observe_graph(&spec.graph).await {
                Ok(Some(o)) if o.phase == Phase::Ready => Ok(o),
                Ok(_) => self.backend.apply_graph(&spec).await,
                Err(e) => Err(e),
            }
        } else {
            if !unchanged && base.graph_state.is_some() {
                tracing::info!(graph = %base.graph, "rolling out a new spec");
            }
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
                let (rolled, why) = match &o.phase {
                    Phase::Ready => ("rolled_out", None),
                    Phase::Failed(r) => ("failed", Some(r.as_str())),
                    Phase::Pending | Phase::Asleep => ("rolling", None),
                };
                self.record_rollout(base, rollout, &fingerprint, rolled, why)
                    .await?;
                Ok(if o.phase == Phase::Ready {
                    GraphNow::Ready
                } else {
                    GraphNow::NotReady
                })
            }
            Err(e) => {
                if let FleetError::Rejected(r) = &e {
                    self.record_rollout(base, rollout, &fingerprint, "failed", Some(r))
                        .await?;
                }
                self.failed(&key, &e);
                Ok(if base.graph_state.as_deref() == Some("ready") {
                    // A refused new spec leaves the running graph as it was.
                    GraphNow::Ready
                } else {
                    GraphNow::NotReady
                })
            }
        }
    }

    /// Stores the graph's rollout when it changed (nothing is written on an unchanged pass).
    async fn record_rollout(
        &self,
        base: &TemplatedBase,
        before: Option<&Rollout>,
        fingerprint: &str,
        state: &str,
        reason: Option<&str>,
    ) -> sqlx::Result<()> {
        let now = Rollout {
            spec_hash: Some(fingerprint.to_owned()),
            state: Some(state.to_owned()),
            reason: reason.map(str::to_owned),
        };
        if before == Some(&now) {
            return Ok(());
        }
        if before.and_then(|r| r.state.as_deref()) != Some(state) {
            tracing::info!(graph = %base.graph, rollout = state, reason, "graph rollout");
        }
        rollout_db::set_rollout(&self.pool, base.id, fingerprint, state, reason).await
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
        graph: GraphNow,
        sleep: SleepFacts,
    ) -> sqlx::Result<()> {
        let key = format!("adapter:{}", a.id);
        if self.waiting(&key) {
            return Ok(());
        }
        let Some(spec) = adapter_spec(base, a) else {
            return Ok(());
        };
        let graph_ready = graph == GraphNow::Ready;
        if a.desired == "running" && SERVED.contains(&a.state.as_str()) {
            if let Some(reason) = rank_refused(base, a) {
                tracing::info!(model = %a.name, %reason, "stopping an adapter its base no longer fits");
                return self.stop_with(a, &reason).await;
            }
        }
        let outcome = match (a.desired.as_str(), a.state.as_str()) {
            ("running", "starting") if graph_ready => {
                match self.backend.apply_adapter(&spec).await {
                    Ok(o) => match o.phase {
                        Phase::Ready => self.transition(a, "ready", None).await.map(|()| Ok(())),
                        Phase::Pending | Phase::Asleep => {
                            let why = o.message.unwrap_or_else(|| {
                                format!(
                                    "loaded on {} of {} replicas",
                                    o.ready_endpoints, o.total_endpoints
                                )
                            });
                            self.still_starting(a, &why).await.map(|()| Ok(()))
                        }
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
            ("running", "starting") => {
                let why = format!("its base's graph {} is not ready yet", base.graph);
                self.still_starting(a, &why).await.map(|()| Ok(()))
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
            // Ready only while the backend reports it loaded on every endpoint. A graph rolling
            // out a new spec keeps serving on its old replicas, so a pending graph alone does not
            // take an adapter out of service; a graph deleted or recreated does (its model object
            // goes with it, or finds no endpoints).
            ("running", "ready") if graph != GraphNow::Resting => {
                match self.backend.observe_adapter(&spec).await {
                    Ok(Some(o)) if o.phase == Phase::Ready => Ok(Ok(())),
                    // Lost on a replica (restarted) or its model object recreated: not ready
                    // until it is loaded everywhere again.
                    Ok(o) => {
                        let why = o.and_then(|o| o.message).unwrap_or_else(|| {
                            "no longer registered on its graph; loading it again".to_owned()
                        });
                        self.transition(a, "starting", Some(&why))
                            .await
                            .map(|()| Ok(()))
                    }
                    Err(e) => Ok(Err(e)),
                }
            }
            ("stopped", "stopping") => match self.backend.remove_adapter(&spec).await {
                // A stop the controller decided keeps its reason (a rank the base no longer fits).
                Ok(()) => self
                    .transition(a, "stopped", a.reason.as_deref())
                    .await
                    .map(|()| Ok(())),
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

    /// A starting adapter that is not ready yet: past the start timeout it is `failed` with `why`,
    /// else `why` is kept as its reason (written only when it changed).
    async fn still_starting(&self, a: &AdapterRow, why: &str) -> sqlx::Result<()> {
        let started = time::OffsetDateTime::now_utc() - a.updated_at;
        if started > self.start_timeout {
            let reason = format!("not ready within {} s: {why}", self.start_timeout.as_secs());
            return self.transition(a, "failed", Some(&reason)).await;
        }
        if a.reason.as_deref() != Some(why) {
            rollout_db::set_starting_reason(&self.pool, a.id, why).await?;
        }
        Ok(())
    }

    /// Stops a served adapter on the controller's own decision (its owner's wish becomes
    /// `stopped`): deregistered on the next pass, the reason kept for its owner.
    async fn stop_with(&self, a: &AdapterRow, reason: &str) -> sqlx::Result<()> {
        let mut tx = self.pool.begin().await?;
        if let Some(row) = db::lock_adapter_by_id(&mut tx, a.id).await? {
            if row.state == a.state && row.desired == a.desired && row.version == a.version {
                db::set_adapter(&mut tx, row.id, "stopped", "stopping", Some(reason)).await?;
                record_adapter(&mut tx, &row, "stopping", Some(reason)).await?;
            }
        }
        tx.commit().await
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

/// Why `a` may no longer be served on `base`: its rank (from validation) exceeds the base's
/// current `max_lora_rank` (lowered since it was validated); the engine would refuse it.
fn rank_refused(base: &TemplatedBase, a: &AdapterRow) -> Option<String> {
    let rank = a.validation.as_ref()?["rank"].as_i64()?;
    let max = i64::from(base.template.max_lora_rank);
    (rank > max).then(|| {
        format!(
            "its rank {rank} exceeds the base's max_lora_rank {max}; upload a rank-{max} \
             adapter or ask the operator to raise the limit"
        )
    })
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
        replicas_max: u(t.replicas_max),
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
