//! The `local-vllm` backend: `vllm serve` processes on one GPU machine. A graph is N replicas on
//! loopback ports behind a round-robin frontend; a started adapter is loaded on every replica with
//! vLLM's runtime LoRA endpoints (`/v1/load_lora_adapter`, `/v1/unload_lora_adapter`), the
//! fan-out the Dynamo operator does on Kubernetes. A replica that restarts gets every wanted
//! adapter again before it counts as ready. State lives in memory: after a restart of Token
//! Factory the controller re-applies the whole desired state, which starts everything again.
//! Processes stop when their graph is deleted, when it is scaled to zero replicas (asleep; the
//! frontend stays, with nothing to forward to) and when the app's cancellation token fires.

mod frontend;
mod replica;

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use self::frontend::Replicas;
use self::replica::{lock, Launch, LoraError, Replica, Wanted, FAILED_AFTER};
use super::backend::{
    AdapterObserved, AdapterSpec, FleetBackend, FleetError, GraphObserved, GraphSpec, Phase,
};

/// How `local-vllm` starts engines.
#[derive(Debug, Clone)]
pub struct LocalVllmOptions {
    /// The engine executable, run as `<bin> serve <model> --host 127.0.0.1 --port <port> ...`.
    pub vllm_bin: PathBuf,
    /// GPUs on this machine, handed to replicas as `CUDA_VISIBLE_DEVICES` in order; `None`
    /// leaves the variable alone (one replica, or a CPU build).
    pub gpus: Option<u32>,
    /// Longest wait for a new process to answer `/health` (loading weights takes minutes).
    pub startup_timeout: Duration,
}

impl LocalVllmOptions {
    pub fn new(vllm_bin: PathBuf) -> Self {
        Self {
            vllm_bin,
            gpus: None,
            startup_timeout: Duration::from_secs(600),
        }
    }
}

/// The backend; cheap to share (`Arc`).
pub struct LocalVllm {
    opts: LocalVllmOptions,
    http: reqwest::Client,
    tracker: TaskTracker,
    shutdown: CancellationToken,
    /// Held across a graph's start or replacement, so two applies of one graph never race.
    graphs: tokio::sync::Mutex<HashMap<String, Arc<Graph>>>,
    free_gpus: Mutex<BTreeSet<u32>>,
}

struct Graph {
    spec: Mutex<GraphSpec>,
    frontend: SocketAddr,
    frontend_stop: CancellationToken,
    replicas: Replicas,
    wanted: Wanted,
    set: Mutex<ReplicaSet>,
}

/// The processes of one version of a graph's template.
#[derive(Default)]
struct ReplicaSet {
    stop: CancellationToken,
    tasks: TaskTracker,
    gpus: Vec<u32>,
}

impl LocalVllm {
    /// A backend whose processes run on `tracker` and stop when `shutdown` fires.
    pub fn new(opts: LocalVllmOptions, tracker: TaskTracker, shutdown: CancellationToken) -> Self {
        let free_gpus = (0..opts.gpus.unwrap_or(0)).collect();
        Self {
            opts,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(120))
                .build()
                .unwrap_or_default(),
            tracker,
            shutdown,
            graphs: tokio::sync::Mutex::new(HashMap::new()),
            free_gpus: Mutex::new(free_gpus),
        }
    }

    async fn graph(&self, name: &str) -> Option<Arc<Graph>> {
        self.graphs.lock().await.get(name).cloned()
    }

    /// Starts one process per replica of `spec` (GPUs handed out first, so a template that does
    /// not fit is refused before anything starts).
    fn start_set(
        &self,
        spec: &GraphSpec,
        wanted: &Wanted,
    ) -> Result<(ReplicaSet, Vec<Arc<Replica>>), FleetError> {
        let t = &spec.template;
        t.validate()
            .map_err(|e| FleetError::Rejected(e.to_string()))?;
        if t.replicas == 0 {
            // Asleep (scale to zero): no process, no GPU. The adapters stay wanted, so the
            // replicas of the next wake load them before they take connections.
            let set = ReplicaSet::default();
            set.tasks.close();
            return Ok((set, Vec::new()));
        }
        let gpus = self.take_gpus(t.replicas * t.gpus_per_replica)?;
        let set = ReplicaSet {
            stop: self.shutdown.child_token(),
            tasks: TaskTracker::new(),
            gpus,
        };
        let mut replicas = Vec::new();
        for i in 0..t.replicas as usize {
            let port = match free_port() {
                Ok(port) => port,
                Err(e) => {
                    set.stop.cancel();
                    self.give_gpus(&set.gpus);
                    return Err(FleetError::Unavailable(format!(
                        "no free loopback port: {e}"
                    )));
                }
            };
            let per = t.gpus_per_replica as usize;
            let launch = Launch {
                program: self.opts.vllm_bin.clone(),
                args: serve_args(spec, port),
                gpus: self.opts.gpus.map(|_| {
                    let mine = set.gpus.iter().skip(i * per).take(per);
                    mine.map(u32::to_string).collect::<Vec<_>>().join(",")
                }),
                startup_timeout: self.opts.startup_timeout,
            };
            let replica = Replica::new(port);
            let task = replica::supervise(
                replica.clone(),
                launch,
                wanted.clone(),
                self.http.clone(),
                set.stop.clone(),
            );
            self.tracker.spawn(set.tasks.track_future(task));
            replicas.push(replica);
        }
        set.tasks.close();
        Ok((set, replicas))
    }

    fn take_gpus(&self, n: u32) -> Result<Vec<u32>, FleetError> {
        if self.opts.gpus.is_none() {
            return Ok(Vec::new());
        }
        let mut free = lock(&self.free_gpus);
        if free.len() < n as usize {
            return Err(FleetError::Rejected(format!(
                "the graph needs {n} GPUs, {} of this machine's are free",
                free.len()
            )));
        }
        let taken: Vec<u32> = free.iter().take(n as usize).copied().collect();
        for g in &taken {
            free.remove(g);
        }
        Ok(taken)
    }

    fn give_gpus(&self, gpus: &[u32]) {
        lock(&self.free_gpus).extend(gpus.iter().copied());
    }

    /// Stops a replica set's processes and waits until they have exited.
    async fn stop_set(&self, set: ReplicaSet) {
        set.stop.cancel();
        set.tasks.wait().await;
        self.give_gpus(&set.gpus);
    }

    fn observe(graph: &Graph) -> GraphObserved {
        let replicas = lock(&graph.replicas).clone();
        let ready = replicas.iter().filter(|r| r.is_ready()).count();
        let failed = replicas.iter().find_map(|r| {
            let s = lock(&r.state);
            (!s.ready && s.failures >= FAILED_AFTER)
                .then(|| s.last_error.clone().unwrap_or_default())
        });
        let phase = match failed {
            Some(why) => Phase::Failed(why),
            None if ready == replicas.len() && ready > 0 => Phase::Ready,
            None => Phase::Pending,
        };
        GraphObserved {
            phase,
            replicas_ready: count(ready),
            replicas_desired: count(replicas.len()),
            frontend_url: format!("http://{}/v1", graph.frontend),
        }
    }

    fn observe_lora(graph: &Graph, name: &str) -> AdapterObserved {
        let replicas = lock(&graph.replicas).clone();
        let mut ready = 0;
        let mut refused = None;
        for r in &replicas {
            let s = lock(&r.state);
            if s.ready && s.loaded.contains(name) {
                ready += 1;
            }
            if let Some(why) = s.refused.get(name) {
                refused = Some(why.clone());
            }
        }
        let phase = match refused {
            Some(why) => Phase::Failed(why),
            None if ready == replicas.len() && ready > 0 => Phase::Ready,
            None => Phase::Pending,
        };
        AdapterObserved {
            phase,
            ready_endpoints: count(ready),
            total_endpoints: count(replicas.len()),
            message: None,
        }
    }
}

/// `vllm serve <model> --host 127.0.0.1 --port <port>` and the template's engine flags.
fn serve_args(spec: &GraphSpec, port: u16) -> Vec<String> {
    let mut args = vec![
        "serve".to_owned(),
        spec.template.model.clone(),
        "--host".into(),
        "127.0.0.1".into(),
        "--port".into(),
        port.to_string(),
    ];
    // `engine_args` starts with `--model <model>`, given above as `serve`'s positional argument.
    args.extend(
        spec.template
            .engine_args_serving(&spec.base)
            .into_iter()
            .skip(2),
    );
    args
}

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// vLLM loads adapters from local paths: `file:///x` or `/x`.
fn lora_path(source_uri: &str) -> Result<String, FleetError> {
    match source_uri.strip_prefix("file://") {
        Some(path) if path.starts_with('/') => Ok(path.to_owned()),
        None if source_uri.starts_with('/') => Ok(source_uri.to_owned()),
        _ => Err(FleetError::Rejected(format!(
            "local-vllm loads adapters from local files; {source_uri:?} is not a file:// URI"
        ))),
    }
}

#[async_trait]
impl FleetBackend for LocalVllm {
    fn kind(&self) -> &'static str {
        "local-vllm"
    }

    async fn apply_graph(&self, spec: &GraphSpec) -> Result<GraphObserved, FleetError> {
        let mut graphs = self.graphs.lock().await;
        if let Some(graph) = graphs.get(&spec.graph) {
            if *lock(&graph.spec) == *spec {
                return Ok(Self::observe(graph));
            }
            // A changed template: new processes replace the old ones; adapters and the frontend
            // stay, and each new replica loads the adapters before it takes connections.
            let (set, replicas) = self.start_set(spec, &graph.wanted)?;
            let old = std::mem::replace(&mut *lock(&graph.set), set);
            *lock(&graph.replicas) = replicas;
            *lock(&graph.spec) = spec.clone();
            self.stop_set(old).await;
            return Ok(Self::observe(graph));
        }
        let wanted = Wanted::default();
        let (set, replicas) = self.start_set(spec, &wanted)?;
        let replicas: Replicas = Arc::new(Mutex::new(replicas));
        let frontend_stop = self.shutdown.child_token();
        let frontend =
            match frontend::start(replicas.clone(), &self.tracker, frontend_stop.clone()).await {
                Ok(addr) => addr,
                Err(e) => {
                    self.stop_set(set).await;
                    return Err(FleetError::Unavailable(format!("frontend: {e}")));
                }
            };
        let graph = Arc::new(Graph {
            spec: Mutex::new(spec.clone()),
            frontend,
            frontend_stop,
            replicas,
            wanted,
            set: Mutex::new(set),
        });
        let observed = Self::observe(&graph);
        graphs.insert(spec.graph.clone(), graph);
        Ok(observed)
    }

    async fn delete_graph(&self, name: &str) -> Result<(), FleetError> {
        let Some(graph) = self.graphs.lock().await.remove(name) else {
            return Ok(());
        };
        graph.frontend_stop.cancel();
        let set = std::mem::take(&mut *lock(&graph.set));
        self.stop_set(set).await;
        Ok(())
    }

    async fn observe_graph(&self, name: &str) -> Result<Option<GraphObserved>, FleetError> {
        Ok(self.graph(name).await.map(|g| Self::observe(&g)))
    }

    async fn apply_adapter(&self, a: &AdapterSpec) -> Result<AdapterObserved, FleetError> {
        let path = lora_path(&a.source_uri)?;
        let Some(graph) = self.graph(&a.graph).await else {
            return Err(FleetError::Unavailable(format!(
                "graph {} is not running",
                a.graph
            )));
        };
        lock(&graph.wanted).insert(a.lora_name.clone(), path.clone());
        let replicas = lock(&graph.replicas).clone();
        let loads = replicas.iter().map(|r| {
            let (http, name, path, wanted) = (&self.http, &a.lora_name, &path, &graph.wanted);
            async move {
                let _ops = r.ops.lock().await;
                let needed = r.is_ready() && !lock(&r.state).loaded.contains(name);
                // Still wanted: a remove that ran first must win.
                if needed && lock(wanted).contains_key(name) {
                    return r.load(http, name, path).await;
                }
                Ok(())
            }
        });
        for result in futures::future::join_all(loads).await {
            if let Err(LoraError::Unreachable(e)) = result {
                return Err(FleetError::Unavailable(e));
            }
        }
        Ok(Self::observe_lora(&graph, &a.lora_name))
    }

    async fn remove_adapter(&self, a: &AdapterSpec) -> Result<(), FleetError> {
        let Some(graph) = self.graph(&a.graph).await else {
            return Ok(());
        };
        lock(&graph.wanted).remove(&a.lora_name);
        let replicas = lock(&graph.replicas).clone();
        let unloads = replicas.iter().map(|r| async move {
            let _ops = r.ops.lock().await;
            let loaded = {
                let mut s = lock(&r.state);
                s.refused.remove(&a.lora_name);
                s.loaded.contains(&a.lora_name)
            };
            if loaded {
                return r.unload(&self.http, &a.lora_name).await;
            }
            Ok(())
        });
        for result in futures::future::join_all(unloads).await {
            match result {
                Ok(()) => {}
                Err(LoraError::Unreachable(e) | LoraError::Refused(e)) => {
                    return Err(FleetError::Unavailable(e))
                }
            }
        }
        Ok(())
    }

    async fn observe_adapter(
        &self,
        a: &AdapterSpec,
    ) -> Result<Option<AdapterObserved>, FleetError> {
        let Some(graph) = self.graph(&a.graph).await else {
            return Ok(None);
        };
        if !lock(&graph.wanted).contains_key(&a.lora_name) {
            return Ok(None);
        }
        Ok(Some(Self::observe_lora(&graph, &a.lora_name)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adapters_load_from_local_paths_only() {
        assert_eq!(
            lora_path("file:///srv/a/v1").ok().as_deref(),
            Some("/srv/a/v1")
        );
        assert_eq!(lora_path("/srv/a/v1").ok().as_deref(), Some("/srv/a/v1"));
        assert!(matches!(
            lora_path("s3://b/a"),
            Err(FleetError::Rejected(_))
        ));
        assert!(matches!(
            lora_path("file://relative"),
            Err(FleetError::Rejected(_))
        ));
    }
}
