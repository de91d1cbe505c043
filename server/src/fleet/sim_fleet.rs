//! The `local-sim` [`FleetBackend`], the embedded default: a graph is N simulated engine
//! replicas on loopback behind one frontend; an adapter is loaded on every replica through
//! vLLM's runtime LoRA endpoints (`/v1/load_lora_adapter`, `/v1/unload_lora_adapter`), the
//! calls the Dynamo operator and the `local-vllm` backend make on real workers.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde_json::json;
use tf_engine_sim::{EngineSim, SimConfig};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::backend::{
    AdapterObserved, AdapterSpec, FleetBackend, FleetError, GraphObserved, GraphSpec, Phase,
};
use super::sim_frontend::{self, Replicas};

/// One simulated replica.
#[derive(Clone)]
pub struct SimReplica {
    pub addr: SocketAddr,
    pub sim: EngineSim,
    stop: CancellationToken,
    /// When it takes requests (its start-up delay after it was started).
    ready_at: Instant,
}

struct SimGraph {
    base: String,
    replicas: Vec<SimReplica>,
    front: Arc<Replicas>,
    frontend: SocketAddr,
    stop: CancellationToken,
    /// Adapters registered on the graph (lora name -> source), loaded on replicas as they start.
    loras: BTreeMap<String, String>,
}

pub struct SimFleet {
    tracker: TaskTracker,
    cancel: CancellationToken,
    /// Pacing of every replica (its `models` and `loras` are set per graph).
    pacing: SimConfig,
    graphs: Mutex<HashMap<String, SimGraph>>,
    http: reqwest::Client,
    /// How long a new replica takes before it serves (a model loading its weights).
    startup_delay: Duration,
    /// Fault injection: replicas fail to start (a wake that fails).
    fail_starts: AtomicBool,
    /// How long loading an adapter takes (reported `Pending` until then).
    adapter_load_delay: Duration,
    /// When each adapter not yet registered began loading, by (graph, LoRA name).
    loading: std::sync::Mutex<HashMap<(String, String), Instant>>,
    /// Fault injection: adapters fail to load (a reload that fails).
    fail_adapter_loads: AtomicBool,
}

impl SimFleet {
    /// A fleet whose engines stop when `cancel` fires.
    pub fn new(tracker: TaskTracker, cancel: CancellationToken, pacing: SimConfig) -> Self {
        Self {
            tracker,
            cancel,
            pacing,
            graphs: Mutex::new(HashMap::new()),
            http: reqwest::Client::new(),
            startup_delay: Duration::ZERO,
            fail_starts: AtomicBool::new(false),
            adapter_load_delay: Duration::ZERO,
            loading: std::sync::Mutex::new(HashMap::new()),
            fail_adapter_loads: AtomicBool::new(false),
        }
    }

    /// New replicas serve only `delay` after they start (reported `Pending` until then).
    #[must_use]
    pub fn with_startup_delay(mut self, delay: Duration) -> Self {
        self.startup_delay = delay;
        self
    }

    /// Adapters not yet registered take `delay` to load (reported `Pending` until then).
    #[must_use]
    pub fn with_adapter_load_delay(mut self, delay: Duration) -> Self {
        self.adapter_load_delay = delay;
        self
    }

    /// From now on, adapters fail to load (`true`) or load normally (`false`).
    pub fn fail_adapter_loads(&self, fail: bool) {
        self.fail_adapter_loads.store(fail, Ordering::Relaxed);
    }

    /// Whether `lora` is registered on `graph` (loaded on its replicas as they start).
    pub async fn has_adapter(&self, graph: &str, lora: &str) -> bool {
        self.graphs
            .lock()
            .await
            .get(graph)
            .is_some_and(|g| g.loras.contains_key(lora))
    }

    /// An adapter not yet registered is still loading (its delay not over).
    fn still_loading(&self, a: &AdapterSpec) -> bool {
        if self.adapter_load_delay.is_zero() {
            return false;
        }
        let Ok(mut loading) = self.loading.lock() else {
            return false;
        };
        let key = (a.graph.clone(), a.lora_name.clone());
        let began = *loading.entry(key.clone()).or_insert_with(Instant::now);
        if began.elapsed() < self.adapter_load_delay {
            return true;
        }
        loading.remove(&key);
        false
    }

    /// From now on, replicas fail to start (`true`) or start normally (`false`).
    pub fn fail_starts(&self, fail: bool) {
        self.fail_starts.store(fail, Ordering::Relaxed);
    }

    /// A graph's replicas (tests read their ledgers and LoRA lists).
    pub async fn replicas(&self, graph: &str) -> Vec<SimReplica> {
        self.graphs
            .lock()
            .await
            .get(graph)
            .map(|g| g.replicas.clone())
            .unwrap_or_default()
    }

    async fn serve(
        &self,
        router: axum::Router,
        stop: CancellationToken,
    ) -> Result<SocketAddr, FleetError> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| FleetError::Unavailable(format!("binding a loopback port: {e}")))?;
        let addr = listener
            .local_addr()
            .map_err(|e| FleetError::Unavailable(e.to_string()))?;
        self.tracker.spawn(async move {
            let shutdown = async move { stop.cancelled().await };
            if let Err(e) = axum::serve(listener, router)
                .with_graceful_shutdown(shutdown)
                .await
            {
                tracing::error!(error = %e, "simulated fleet server stopped");
            }
        });
        Ok(addr)
    }

    async fn start_replica(
        &self,
        base: &str,
        loras: &BTreeMap<String, String>,
        graph_stop: &CancellationToken,
    ) -> Result<SimReplica, FleetError> {
        let config = SimConfig {
            models: vec![base.to_owned()],
            loras: loras.iter().map(|(n, p)| (n.clone(), p.clone())).collect(),
            ..self.pacing.clone()
        };
        let sim = EngineSim::new(config);
        let stop = graph_stop.child_token();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| FleetError::Unavailable(format!("binding a loopback port: {e}")))?;
        let addr = listener
            .local_addr()
            .map_err(|e| FleetError::Unavailable(e.to_string()))?;
        let (s, token) = (sim.clone(), stop.clone());
        self.tracker.spawn(async move {
            if let Err(e) =
                tf_engine_sim::serve(listener, s, async move { token.cancelled().await }).await
            {
                tracing::error!(error = %e, "simulated replica stopped");
            }
        });
        Ok(SimReplica {
            addr,
            sim,
            stop,
            ready_at: Instant::now() + self.startup_delay,
        })
    }

    /// POSTs a LoRA call to one replica; `ok_also` is the status and message vLLM answers when
    /// it is already done ("has already been loaded", "cannot be found").
    async fn lora_call(
        &self,
        addr: SocketAddr,
        path: &str,
        body: serde_json::Value,
        ok_also: (u16, &str),
    ) -> Result<(), FleetError> {
        let answer = self
            .http
            .post(format!("http://{addr}{path}"))
            .json(&body)
            .send()
            .await
            .map_err(|e| FleetError::Unavailable(format!("replica {addr}: {e}")))?;
        let status = answer.status().as_u16();
        if answer.status().is_success() {
            return Ok(());
        }
        let text = answer.text().await.unwrap_or_default();
        if status == ok_also.0 && text.contains(ok_also.1) {
            return Ok(());
        }
        if status >= 500 {
            Err(FleetError::Unavailable(format!(
                "replica {addr}: {status} {text}"
            )))
        } else {
            Err(FleetError::Rejected(format!(
                "replica {addr}: {status} {text}"
            )))
        }
    }

    async fn listed(&self, addr: SocketAddr, lora: &str) -> Result<bool, FleetError> {
        let models: serde_json::Value = self
            .http
            .get(format!("http://{addr}/v1/models"))
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .map_err(|e| FleetError::Unavailable(format!("replica {addr}: {e}")))?
            .json()
            .await
            .map_err(|e| FleetError::Unavailable(format!("replica {addr}: {e}")))?;
        Ok(models["data"]
            .as_array()
            .is_some_and(|d| d.iter().any(|m| m["id"] == lora)))
    }
}

/// What the graph looks like now; the frontend sends to the replicas that finished starting.
fn observed(g: &SimGraph, desired: u32) -> GraphObserved {
    let now = Instant::now();
    let ready: Vec<SocketAddr> = g
        .replicas
        .iter()
        .filter(|r| r.ready_at <= now)
        .map(|r| r.addr)
        .collect();
    let n = u32::try_from(ready.len()).unwrap_or(u32::MAX);
    g.front.set(ready);
    GraphObserved {
        phase: match (desired, n) {
            (0, 0) => Phase::Asleep,
            (d, n) if n >= d => Phase::Ready,
            _ => Phase::Pending,
        },
        replicas_ready: n,
        replicas_desired: desired,
        frontend_url: format!("http://{}/v1", g.frontend),
    }
}

#[async_trait]
impl FleetBackend for SimFleet {
    fn kind(&self) -> &'static str {
        "local-sim"
    }

    async fn apply_graph(&self, spec: &GraphSpec) -> Result<GraphObserved, FleetError> {
        // Zero is a graph asleep (issue 18): its replicas stop, its frontend stays, so its URL
        // and registered adapters survive the wake.
        let want = spec.template.replicas;
        let mut graphs = self.graphs.lock().await;
        if !graphs.contains_key(&spec.graph) {
            let stop = self.cancel.child_token();
            let front = Arc::new(Replicas::default());
            let frontend = self
                .serve(
                    sim_frontend::router(front.clone(), self.http.clone()),
                    stop.clone(),
                )
                .await?;
            graphs.insert(
                spec.graph.clone(),
                SimGraph {
                    base: spec.base.clone(),
                    replicas: Vec::new(),
                    front,
                    frontend,
                    stop,
                    loras: BTreeMap::new(),
                },
            );
        }
        let Some(g) = graphs.get_mut(&spec.graph) else {
            return Err(FleetError::Unavailable("graph vanished".into()));
        };
        if g.base != spec.base {
            return Err(FleetError::Conflict(format!(
                "graph {} serves {}, not {}",
                spec.graph, g.base, spec.base
            )));
        }
        if g.replicas.len() < want as usize && self.fail_starts.load(Ordering::Relaxed) {
            let mut o = observed(g, want);
            o.phase = Phase::Failed("the engine exited while loading the model (simulated)".into());
            return Ok(o);
        }
        while g.replicas.len() < want as usize {
            let r = self.start_replica(&g.base, &g.loras, &g.stop).await?;
            g.replicas.push(r);
        }
        while g.replicas.len() > want as usize {
            if let Some(r) = g.replicas.pop() {
                r.stop.cancel();
            }
        }
        Ok(observed(g, want))
    }

    async fn delete_graph(&self, graph: &str) -> Result<(), FleetError> {
        if let Some(g) = self.graphs.lock().await.remove(graph) {
            g.front.set(Vec::new());
            g.stop.cancel();
        }
        Ok(())
    }

    async fn observe_graph(&self, graph: &str) -> Result<Option<GraphObserved>, FleetError> {
        Ok(self
            .graphs
            .lock()
            .await
            .get(graph)
            .map(|g| observed(g, u32::try_from(g.replicas.len()).unwrap_or(u32::MAX))))
    }

    async fn apply_adapter(&self, a: &AdapterSpec) -> Result<AdapterObserved, FleetError> {
        let addrs = {
            let mut graphs = self.graphs.lock().await;
            let g = graphs
                .get_mut(&a.graph)
                .ok_or_else(|| FleetError::Unavailable(format!("graph {} not up", a.graph)))?;
            if !g.loras.contains_key(&a.lora_name) {
                if self.fail_adapter_loads.load(Ordering::Relaxed) {
                    return Err(FleetError::Rejected(format!(
                        "{} failed to load (simulated)",
                        a.lora_name
                    )));
                }
                if self.still_loading(a) {
                    let n = u32::try_from(g.replicas.len()).unwrap_or(u32::MAX);
                    return Ok(AdapterObserved {
                        phase: Phase::Pending,
                        ready_endpoints: 0,
                        total_endpoints: n,
                        message: None,
                    });
                }
            }
            g.loras.insert(a.lora_name.clone(), a.source_uri.clone());
            g.replicas.iter().map(|r| r.addr).collect::<Vec<_>>()
        };
        let body = json!({"lora_name": a.lora_name, "lora_path": a.source_uri});
        for addr in &addrs {
            // 400 "already loaded" is success: every call is re-sent on every pass.
            self.lora_call(
                *addr,
                "/v1/load_lora_adapter",
                body.clone(),
                (400, "already"),
            )
            .await?;
        }
        let n = u32::try_from(addrs.len()).unwrap_or(u32::MAX);
        Ok(AdapterObserved {
            phase: Phase::Ready,
            ready_endpoints: n,
            total_endpoints: n,
            message: None,
        })
    }

    async fn remove_adapter(&self, a: &AdapterSpec) -> Result<(), FleetError> {
        // A load cut short starts its delay again next time.
        if let Ok(mut loading) = self.loading.lock() {
            loading.remove(&(a.graph.clone(), a.lora_name.clone()));
        }
        let addrs = {
            let mut graphs = self.graphs.lock().await;
            let Some(g) = graphs.get_mut(&a.graph) else {
                return Ok(());
            };
            g.loras.remove(&a.lora_name);
            g.replicas.iter().map(|r| r.addr).collect::<Vec<_>>()
        };
        let body = json!({"lora_name": a.lora_name});
        for addr in addrs {
            // 404 "cannot be found" is success: it is already gone.
            self.lora_call(
                addr,
                "/v1/unload_lora_adapter",
                body.clone(),
                (404, "cannot be found"),
            )
            .await?;
        }
        Ok(())
    }

    async fn observe_adapter(
        &self,
        a: &AdapterSpec,
    ) -> Result<Option<AdapterObserved>, FleetError> {
        let addrs = {
            let graphs = self.graphs.lock().await;
            let Some(g) = graphs.get(&a.graph) else {
                return Ok(None);
            };
            g.replicas.iter().map(|r| r.addr).collect::<Vec<_>>()
        };
        let mut ready = 0u32;
        for addr in &addrs {
            if self.listed(*addr, &a.lora_name).await? {
                ready += 1;
            }
        }
        if ready == 0 {
            return Ok(None);
        }
        let total = u32::try_from(addrs.len()).unwrap_or(u32::MAX);
        Ok(Some(AdapterObserved {
            phase: if ready == total {
                Phase::Ready
            } else {
                Phase::Pending
            },
            ready_endpoints: ready,
            total_endpoints: total,
            message: None,
        }))
    }
}
