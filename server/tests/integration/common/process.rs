//! The `tokenfactory` binary as a child process the test can SIGKILL or SIGTERM, in front of an
//! in-process engine simulator (whose ledger is the ground truth).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use sqlx::PgPool;
use tf_engine_sim::EngineSim;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use super::sim::{Sim, BASE};

pub struct Gateway {
    pub child: Child,
    pub addr: SocketAddr,
    /// The `/metrics` listener.
    pub metrics_addr: SocketAddr,
    pub key: String,
}

/// A deployment of `tokenfactory serve` child processes in front of an in-process simulator;
/// made by [`TestAppBuilder::process`](super::TestAppBuilder::process). Every process started
/// from it shares the database, journal directory and fleet, so a second start is a restart.
pub struct Deployment {
    pub sim: EngineSim,
    pub sim_addr: SocketAddr,
    database_url: String,
    journal_dir: PathBuf,
    fleet_file: PathBuf,
    durability: &'static str,
    drain_seconds: u64,
    env: Vec<(String, String)>,
}

impl Deployment {
    /// Adds `env` to every gateway process.
    pub(super) fn with_env(mut self, env: Vec<(String, String)>) -> Self {
        self.env = env;
        self
    }

    pub(super) fn new(
        sim: Sim,
        pool: &PgPool,
        database_via: Option<SocketAddr>,
        dir: &Path,
        durability: &'static str,
        drain_seconds: u64,
        embedding: bool,
    ) -> Self {
        Self {
            database_url: database_url(pool, database_via),
            journal_dir: dir.join("journal"),
            fleet_file: fleet_file(dir, sim.addr, embedding),
            sim: sim.sim,
            sim_addr: sim.addr,
            durability,
            drain_seconds,
            env: Vec::new(),
        }
    }

    /// Starts a gateway process and waits until it serves.
    pub async fn start(&self) -> Gateway {
        Gateway::start(self).await
    }
}

/// The URL of the database a `#[sqlx::test]` pool points at, optionally through another address.
fn database_url(pool: &PgPool, via: Option<SocketAddr>) -> String {
    let db = pool.connect_options().get_database().unwrap().to_owned();
    let host = via.map_or_else(|| "127.0.0.1:5432".to_owned(), |a| a.to_string());
    format!("postgres://postgres@{host}/{db}")
}

/// Writes a static fleet file naming the simulator as base [`BASE`] (and as the embedding base
/// [`EMBED`](super::embed::EMBED) with `embedding`).
fn fleet_file(dir: &Path, sim: SocketAddr, embedding: bool) -> PathBuf {
    let path = dir.join("fleet.toml");
    // The tests drive the simulator through its `sim` block, which the default policy strips.
    let base = |name: &str, kind: &str| {
        format!(
            "[[base]]\nname = \"{name}\"\nupstream = \"http://{sim}/v1\"\nkind = \"{kind}\"\n\
             prompt_estimator = \"sim-words\"\ndenied_fields = [\"priority\", \"request_id\", \
             \"kv_transfer_params\", \"vllm_xargs\", \"logits_processors\"]\n"
        )
    };
    let mut text = base(BASE, "chat");
    if embedding {
        text += &base(super::embed::EMBED, "embedding");
    }
    std::fs::write(&path, text).unwrap();
    path
}

impl Gateway {
    async fn start(spec: &Deployment) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_tokenfactory"))
            .arg("serve")
            .env("DATABASE_URL", &spec.database_url)
            .env("TF_LISTEN", "127.0.0.1:0")
            .env("TF_METRICS_LISTEN", "127.0.0.1:0")
            .env("TF_FLEET", format!("static:{}", spec.fleet_file.display()))
            .env("TF_JOURNAL_DIR", &spec.journal_dir)
            .env("TF_JOURNAL_DURABILITY", spec.durability)
            .env("TF_DRAIN_SECONDS", spec.drain_seconds.to_string())
            .env("TF_REDIS_PREFIX", format!("test:{}:", uuid::Uuid::new_v4()))
            .env("RUST_LOG", "warn")
            // The banner prints the demo key; kept beside the journal, so a restart reprints it.
            .env("TF_DEMO", "true")
            // Connected as the test cluster's superuser, like the demo.
            .env("TF_ALLOW_OWNER_ROLE", "true")
            .env(
                "TF_DEMO_STATE",
                spec.journal_dir.with_extension("demo.json"),
            )
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let (mut addr, mut key, mut metrics) = (None, None, None);
        let read = async {
            while let Some(line) = lines.next_line().await.unwrap() {
                if let Some(rest) = line.trim().strip_prefix("API:") {
                    let url = rest
                        .trim()
                        .trim_start_matches("http://")
                        .trim_end_matches("/v1");
                    addr = Some(url.parse().unwrap());
                }
                if let Some(rest) = line.trim().strip_prefix("Metrics:") {
                    let url = rest.trim().trim_start_matches("http://");
                    metrics = Some(url.trim_end_matches("/metrics").parse().unwrap());
                }
                if let Some(rest) = line.trim().strip_prefix("API key:") {
                    key = Some(rest.trim().to_owned());
                    break;
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(60), read)
            .await
            .expect("gateway did not start");
        // Keep draining stdout so the child never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Self {
            child,
            addr: addr.unwrap(),
            metrics_addr: metrics.unwrap(),
            key: key.unwrap(),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    pub async fn kill(mut self) {
        self.child.kill().await.unwrap();
    }

    pub fn terminate(&self) {
        let pid = self.child.id().unwrap();
        std::process::Command::new("kill")
            .arg("-TERM")
            .arg(pid.to_string())
            .status()
            .unwrap();
    }

    /// Waits for exit after `terminate`; returns the exit code.
    pub async fn wait(mut self) -> Option<i32> {
        tokio::time::timeout(Duration::from_secs(60), self.child.wait())
            .await
            .unwrap()
            .unwrap()
            .code()
    }

    /// A counter from `/metrics`.
    pub async fn metric(&self, name: &str) -> f64 {
        let text = reqwest::get(format!("http://{}/metrics", self.metrics_addr))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
            .unwrap_or(f64::NAN)
    }
}
