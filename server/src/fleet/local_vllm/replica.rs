//! One `vllm serve` process and what is loaded on it. A supervisor task keeps the process running
//! like a Deployment keeps a pod: start, wait for `/health`, load every adapter its graph wants,
//! restart with backoff when it exits, and terminate it (its whole process group, so vLLM's
//! engine-core children go too) when the graph is deleted or Token Factory shuts down.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde_json::json;
use tokio::process::{Child, Command};
use tokio_util::sync::CancellationToken;

/// First restart delay; doubled after each failure up to [`MAX_BACKOFF`].
const BACKOFF: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Consecutive failed starts after which the replica (and so its graph) reports failed.
pub const FAILED_AFTER: u32 = 3;
/// Time a process gets between SIGTERM and SIGKILL.
const GRACE: Duration = Duration::from_secs(10);
/// How often `/health` is polled while a process starts.
const HEALTH_POLL: Duration = Duration::from_millis(100);

/// Locks a std mutex, ignoring poisoning (every critical section leaves the state consistent).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// How to start one replica's process.
#[derive(Debug, Clone)]
pub struct Launch {
    pub program: PathBuf,
    pub args: Vec<String>,
    /// `CUDA_VISIBLE_DEVICES`, when GPUs are handed out.
    pub gpus: Option<String>,
    pub startup_timeout: Duration,
}

/// What the backend knows of one replica.
#[derive(Debug, Default)]
pub struct ReplicaState {
    /// Answering `/health`, with every wanted adapter offered to it.
    pub ready: bool,
    /// LoRA names the engine has confirmed loaded since its process started.
    pub loaded: BTreeSet<String>,
    /// LoRA names the engine refused, with its message (retrying will not help).
    pub refused: BTreeMap<String, String>,
    /// Consecutive failed starts and the last reason.
    pub failures: u32,
    pub last_error: Option<String>,
}

/// A replica: its fixed loopback port and state. The ops lock orders load/unload calls with the
/// supervisor's reloads, so an adapter removed while a process restarts is never loaded again.
#[derive(Debug)]
pub struct Replica {
    pub port: u16,
    pub state: Mutex<ReplicaState>,
    pub ops: tokio::sync::Mutex<()>,
}

/// Why a LoRA call did not take.
pub enum LoraError {
    /// The engine refused the adapter (4xx): its message.
    Refused(String),
    /// The engine could not be reached or answered 5xx.
    Unreachable(String),
}

impl Replica {
    pub fn new(port: u16) -> Arc<Self> {
        Arc::new(Self {
            port,
            state: Mutex::new(ReplicaState::default()),
            ops: tokio::sync::Mutex::new(()),
        })
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn is_ready(&self) -> bool {
        lock(&self.state).ready
    }

    /// `POST /v1/load_lora_adapter`; "already loaded" is success (the call is idempotent here).
    pub async fn load(
        &self,
        http: &reqwest::Client,
        name: &str,
        path: &str,
    ) -> Result<(), LoraError> {
        let body = json!({"lora_name": name, "lora_path": path});
        match call(http, &format!("{}/v1/load_lora_adapter", self.url()), &body).await? {
            (s, _) if s.is_success() => {}
            (s, msg) if s == 400 && msg.contains("already been loaded") => {}
            (_, msg) => {
                lock(&self.state)
                    .refused
                    .insert(name.to_owned(), msg.clone());
                return Err(LoraError::Refused(msg));
            }
        }
        let mut state = lock(&self.state);
        state.refused.remove(name);
        state.loaded.insert(name.to_owned());
        Ok(())
    }

    /// `POST /v1/unload_lora_adapter`; "not found" is success.
    pub async fn unload(&self, http: &reqwest::Client, name: &str) -> Result<(), LoraError> {
        let body = json!({"lora_name": name});
        match call(
            http,
            &format!("{}/v1/unload_lora_adapter", self.url()),
            &body,
        )
        .await?
        {
            (s, _) if s.is_success() || s == 404 => {}
            (s, msg) if s == 400 && msg.contains("cannot be found") => {}
            (_, msg) => return Err(LoraError::Refused(msg)),
        }
        let mut state = lock(&self.state);
        state.loaded.remove(name);
        state.refused.remove(name);
        Ok(())
    }
}

async fn call(
    http: &reqwest::Client,
    url: &str,
    body: &serde_json::Value,
) -> Result<(reqwest::StatusCode, String), LoraError> {
    let resp = http
        .post(url)
        .json(body)
        .send()
        .await
        .map_err(|e| LoraError::Unreachable(e.to_string()))?;
    let status = resp.status();
    let text = resp.text().await.unwrap_or_default();
    if status.is_server_error() {
        return Err(LoraError::Unreachable(format!("{status}: {text}")));
    }
    Ok((status, text))
}

/// The adapters a graph wants on every replica, as lora_name -> lora_path.
pub type Wanted = Arc<Mutex<BTreeMap<String, String>>>;

/// Keeps the replica's process running until `stop`; then terminates it and returns.
pub async fn supervise(
    replica: Arc<Replica>,
    launch: Launch,
    wanted: Wanted,
    http: reqwest::Client,
    stop: CancellationToken,
) {
    let mut backoff = BACKOFF;
    while !stop.is_cancelled() {
        let outcome = run_once(&replica, &launch, &wanted, &http, &stop).await;
        {
            let mut state = lock(&replica.state);
            state.ready = false;
            state.loaded.clear();
            state.refused.clear();
            match outcome {
                Outcome::Stopped => return,
                Outcome::ExitedAfterReady(why) => {
                    state.failures = 0;
                    backoff = BACKOFF;
                    state.last_error = Some(why);
                }
                Outcome::Failed(why) => {
                    state.failures += 1;
                    state.last_error = Some(why);
                }
            }
            tracing::warn!(port = replica.port, error = ?state.last_error, "vllm replica stopped; restarting");
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

enum Outcome {
    Stopped,
    ExitedAfterReady(String),
    Failed(String),
}

async fn run_once(
    replica: &Replica,
    launch: &Launch,
    wanted: &Wanted,
    http: &reqwest::Client,
    stop: &CancellationToken,
) -> Outcome {
    let mut cmd = Command::new(&launch.program);
    cmd.args(&launch.args)
        .env("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True")
        .stdin(Stdio::null())
        // Its own process group, so termination reaches vLLM's worker processes as well.
        .process_group(0)
        .kill_on_drop(true);
    if let Some(gpus) = &launch.gpus {
        cmd.env("CUDA_VISIBLE_DEVICES", gpus);
    }
    let mut child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) => {
            return Outcome::Failed(format!("cannot start {}: {e}", launch.program.display()))
        }
    };
    let started = tokio::select! {
        () = stop.cancelled() => { terminate(&mut child).await; return Outcome::Stopped; }
        status = child.wait() => return Outcome::Failed(format!("exited while starting: {}", describe(status))),
        healthy = wait_healthy(http, replica, launch.startup_timeout) => healthy,
    };
    if !started {
        terminate(&mut child).await;
        return Outcome::Failed(format!(
            "no answer on /health within {} s",
            launch.startup_timeout.as_secs()
        ));
    }
    {
        // Offer every wanted adapter before the replica counts as ready, under the ops lock so a
        // concurrent remove is ordered before or after, never in between.
        let _ops = replica.ops.lock().await;
        let snapshot: Vec<(String, String)> = lock(wanted)
            .iter()
            .map(|(n, p)| (n.clone(), p.clone()))
            .collect();
        for (name, path) in snapshot {
            if let Err(LoraError::Unreachable(e)) = replica.load(http, &name, &path).await {
                tracing::warn!(port = replica.port, lora = %name, error = %e, "adapter load failed");
            }
        }
        let mut state = lock(&replica.state);
        state.ready = true;
        state.failures = 0;
        state.last_error = None;
    }
    tokio::select! {
        () = stop.cancelled() => { terminate(&mut child).await; Outcome::Stopped }
        status = child.wait() => Outcome::ExitedAfterReady(format!("exited: {}", describe(status))),
    }
}

async fn wait_healthy(http: &reqwest::Client, replica: &Replica, within: Duration) -> bool {
    let url = format!("{}/health", replica.url());
    let deadline = tokio::time::Instant::now() + within;
    while tokio::time::Instant::now() < deadline {
        if let Ok(resp) = http.get(&url).send().await {
            if resp.status().is_success() {
                return true;
            }
        }
        tokio::time::sleep(HEALTH_POLL).await;
    }
    false
}

fn describe(status: std::io::Result<std::process::ExitStatus>) -> String {
    match status {
        Ok(s) => s.to_string(),
        Err(e) => e.to_string(),
    }
}

/// SIGTERM to the process group, SIGKILL after [`GRACE`].
async fn terminate(child: &mut Child) {
    let group = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .and_then(rustix::process::Pid::from_raw);
    if let Some(pid) = group {
        let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::TERM);
        if tokio::time::timeout(GRACE, child.wait()).await.is_ok() {
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
            return;
        }
        let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
    }
    let _ = child.kill().await;
}
