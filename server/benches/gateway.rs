//! Gateway benchmark: the same load against the engine simulator directly and through the
//! gateway (auth, resolution and metering on), in one run, printing ratios. Absolute numbers swing
//! between machines; the ratios are the result. Chat completions (whole, streamed, beside a bare
//! pass-through), then Responses and Embeddings (whole), each against the engine's own endpoint.
//! Each load runs in two halves that alternate between the two paths, so a burst from a neighbour
//! on a shared machine weighs on both.
//!
//! `cargo bench -p tokenfactory --bench gateway` (needs PostgreSQL; uses database
//! `tokenfactory_bench`, recreated each run). Env: `TF_BENCH_SECONDS` (per phase, default 5),
//! `TF_BENCH_CONNECTIONS` (default 50), `TF_BENCH_ONLY=bodies` (only the body-capture phases:
//! the same load through the gateway for a tenant without and with body logging, alternating),
//! `TF_BENCH_SIM` (an engine simulator running as a process of its own, see `serve_sim`).

#![allow(
    clippy::disallowed_methods,
    reason = "test scaffolding (fake engines, load generators) runs until the test ends; nothing waits for it at shutdown"
)]
#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{json, Value};
use tf_engine_sim::{EngineSim, SimConfig};
use tokenfactory::app::{self, AppOptions};
use tokenfactory::fleet::{self, BaseRegistration};
use tokenfactory::journal::{Durability, Journal};

struct Phase {
    requests: u64,
    chunks: u64,
    latencies_us: Vec<u64>,
    elapsed: Duration,
    machine: common::machine::Ticks,
}

impl Phase {
    /// Two runs of the same load as one (the runs alternate with the other path's, so a
    /// neighbour's burst on this shared machine lands on both sides).
    fn merge(mut self, other: Phase) -> Phase {
        self.requests += other.requests;
        self.chunks += other.chunks;
        self.latencies_us.extend(other.latencies_us);
        self.elapsed += other.elapsed;
        self.machine = self.machine.add(other.machine);
        self
    }
    fn rps(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64()
    }
    fn pct(&self, p: f64) -> f64 {
        let mut v = self.latencies_us.clone();
        v.sort_unstable();
        if v.is_empty() {
            return 0.0;
        }
        v[((v.len() as f64 - 1.0) * p) as usize] as f64 / 1000.0
    }
    /// This process's CPU (load generator and the path measured) per chunk.
    fn cpu_per_chunk_us(&self) -> f64 {
        common::machine::as_duration(self.machine.this).as_secs_f64() * 1e6
            / self.chunks.max(1) as f64
    }
    /// The whole machine's CPU per request, and its parts.
    fn machine_line(&self) -> String {
        let (all, this, pg, rest) = self.machine.per(self.requests);
        format!(
            "{all:>6.1} us CPU/req on the machine: this process {this:.1}, PostgreSQL {pg:.1}, the rest (engine, kernel, neighbours) {rest:.1}"
        )
    }
}

async fn run_phase(
    url: String,
    key: Option<String>,
    body: Value,
    stream: bool,
    conns: usize,
    dur: Duration,
) -> Phase {
    let body = Arc::new(serde_json::to_vec(&body).unwrap());
    let deadline = Instant::now() + dur;
    let machine0 = common::machine::Ticks::now();
    let start = Instant::now();
    let tasks: Vec<_> = (0..conns)
        .map(|_| {
            let (url, key, body) = (url.clone(), key.clone(), body.clone());
            tokio::spawn(async move {
                let client = reqwest::Client::builder()
                    .pool_max_idle_per_host(1)
                    .tcp_nodelay(true)
                    .build()
                    .unwrap();
                let (mut n, mut chunks, mut lat) = (0u64, 0u64, Vec::new());
                while Instant::now() < deadline {
                    let t0 = Instant::now();
                    let mut req = client
                        .post(&url)
                        .header("content-type", "application/json")
                        .body(body.to_vec());
                    if let Some(k) = &key {
                        req = req.bearer_auth(k);
                    }
                    let resp = req.send().await.unwrap();
                    assert!(resp.status().is_success(), "{}", resp.status());
                    if stream {
                        let mut s = resp.bytes_stream();
                        while let Some(b) = s.next().await {
                            chunks += memchr_count(&b.unwrap());
                        }
                    } else {
                        resp.bytes().await.unwrap();
                        chunks += 1;
                    }
                    lat.push(t0.elapsed().as_micros() as u64);
                    n += 1;
                }
                (n, chunks, lat)
            })
        })
        .collect();
    let mut phase = Phase {
        requests: 0,
        chunks: 0,
        latencies_us: Vec::new(),
        elapsed: Duration::ZERO,
        machine: Default::default(),
    };
    for t in tasks {
        let (n, c, l) = t.await.unwrap();
        phase.requests += n;
        phase.chunks += c;
        phase.latencies_us.extend(l);
    }
    phase.elapsed = start.elapsed();
    phase.machine = common::machine::Ticks::now().since(machine0);
    phase
}

/// SSE events in a buffer (`\n\n` terminators); chunks of a response arrive whole from the sim.
fn memchr_count(b: &[u8]) -> u64 {
    b.windows(2).filter(|w| w == b"\n\n").count() as u64
}

/// The engine: `TF_BENCH_SIM=host:port` names one running as a process of its own
/// (`tokenfactory engine-sim --models bench-base,bench-embed`), so this process's CPU is the load
/// generator's and the gateway's alone; otherwise a simulator in this process.
async fn serve_sim() -> SocketAddr {
    if let Ok(addr) = std::env::var("TF_BENCH_SIM") {
        return addr.parse().expect("TF_BENCH_SIM is host:port");
    }
    let sim = EngineSim::new(SimConfig {
        models: vec!["bench-base".into(), "bench-embed".into()],
        ..SimConfig::default()
    });
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(tf_engine_sim::serve(l, sim, std::future::pending()));
    addr
}

/// The gateway's address, a key of a tenant without body logging, one of a tenant with it, and
/// the capture counters.
struct Gw {
    addr: SocketAddr,
    key: String,
    bodies_key: String,
    bodies: Arc<tokenfactory::bodies::capture::BodyCapture>,
}

async fn setup_gateway(sim: SocketAddr) -> Gw {
    let (pool, _) = common::fresh_database("tokenfactory_bench", 16).await;
    fleet::register_bases(
        &pool,
        "static",
        &[
            BaseRegistration {
                name: "bench-base".into(),
                graph: "bench".into(),
                upstream_url: format!("http://{sim}/v1"),
                upstream_model: "bench-base".into(),
                continuous_usage: true,
                denied_fields: Some(tokenfactory::engine_policy::EnginePolicy::denied_except(&[
                    "sim",
                ])),
                prompt_estimator: tokenfactory::engine_policy::PromptEstimator::SimWords,
                kind: tf_core::endpoint::ModelKind::Chat,
                nvext_allowed: None,
            },
            BaseRegistration {
                name: "bench-embed".into(),
                graph: "bench-embed".into(),
                upstream_url: format!("http://{sim}/v1"),
                upstream_model: "bench-embed".into(),
                continuous_usage: true,
                denied_fields: None,
                prompt_estimator: tokenfactory::engine_policy::PromptEstimator::SimWords,
                kind: tf_core::endpoint::ModelKind::Embedding,
                nvext_allowed: None,
            },
        ],
    )
    .await
    .unwrap();
    let tenant = tf_core::accounts::create_tenant(&pool, "bench", "Bench")
        .await
        .unwrap();
    let (_, key) = tf_core::keys::issue(&pool, tenant.id, "bench")
        .await
        .unwrap();
    let logged = tf_core::accounts::create_tenant(&pool, "bench-bodies", "Bench bodies")
        .await
        .unwrap();
    sqlx::query("UPDATE tenants SET body_logging = true WHERE id = $1")
        .bind(logged.id)
        .execute(&pool)
        .await
        .unwrap();
    let (_, bodies_key) = tf_core::keys::issue(&pool, logged.id, "bench")
        .await
        .unwrap();
    // The production sink: the local journal (process durability, the default group commit),
    // shipped in batches.
    let dir = std::env::temp_dir().join(format!("tf-bench-journal-{}", std::process::id()));
    let journal = Journal::open(
        &dir,
        Durability::Process,
        Duration::from_millis(tokenfactory::journal::durability::DEFAULT_GROUP_COMMIT_MS),
        Default::default(),
    )
    .unwrap();
    let built = app::build(
        pool,
        AppOptions {
            journal: Some(Arc::new(journal)),
            ..AppOptions::default()
        },
    )
    .await
    .unwrap();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(tokenfactory::http_server::serve(
        l,
        built.router.clone(),
        Default::default(),
        built.http_metrics.clone(),
        std::future::pending(),
    ));
    Gw {
        addr,
        key,
        bodies_key,
        bodies: built.gateway.bodies.clone(),
    }
}

/// The same load for a tenant without and with body logging, alternating halves; prints the
/// ratios (capture should cost next to nothing) and the captures dropped by the bounded queue.
async fn body_capture_phases(
    gw: &Gw,
    conns: usize,
    dur: Duration,
    small: &Value,
    streaming: &Value,
) {
    let url = format!("http://{}/v1/chat/completions", gw.addr);
    let half = dur / 2;
    for (label, body, stream) in [
        ("non-streaming", small, false),
        ("streaming 64 ", streaming, true),
    ] {
        let off = || {
            run_phase(
                url.clone(),
                Some(gw.key.clone()),
                body.clone(),
                stream,
                conns,
                half,
            )
        };
        let on = || {
            run_phase(
                url.clone(),
                Some(gw.bodies_key.clone()),
                body.clone(),
                stream,
                conns,
                half,
            )
        };
        let (q0, d0) = (gw.bodies.queued(), gw.bodies.dropped());
        let a = off().await;
        let b = on().await;
        let b = b.merge(on().await);
        let a = a.merge(off().await);
        println!(
            "{label} bodies off {:>9.0} req/s  p50 {:>6.2} ms  p99 {:>6.2} ms  {:.2} us CPU/chunk",
            a.rps(),
            a.pct(0.5),
            a.pct(0.99),
            a.cpu_per_chunk_us()
        );
        println!(
            "{label} bodies on  {:>9.0} req/s  p50 {:>6.2} ms  p99 {:>6.2} ms  {:.2} us CPU/chunk",
            b.rps(),
            b.pct(0.5),
            b.pct(0.99),
            b.cpu_per_chunk_us()
        );
        println!(
            "  throughput ratio on/off: {:.2}; captures queued {}, dropped {} (queue full)",
            b.rps() / a.rps(),
            gw.bodies.queued() - q0,
            gw.bodies.dropped() - d0
        );
    }
}

fn main() {
    let secs: u64 = std::env::var("TF_BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let conns: usize = std::env::var("TF_BENCH_CONNECTIONS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(50);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let sim = serve_sim().await;
        let setup = setup_gateway(sim).await;
        let (gw, key) = (setup.addr, setup.key.clone());
        let dur = Duration::from_secs(secs);
        let small = json!({"model": "bench-base", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1});
        let streaming = json!({"model": "bench-base", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 64, "stream": true});
        let direct_url = format!("http://{sim}/v1/chat/completions");
        let gw_url = format!("http://{gw}/v1/chat/completions");
        // Warm both paths (connections, caches).
        run_phase(gw_url.clone(), Some(key.clone()), small.clone(), false, 4, Duration::from_millis(300)).await;
        run_phase(gw_url.clone(), Some(setup.bodies_key.clone()), small.clone(), false, 4, Duration::from_millis(300)).await;
        if std::env::var("TF_BENCH_ONLY").as_deref() == Ok("bodies") {
            println!("body capture benchmark: {conns} connections, {secs} s per phase");
            body_capture_phases(&setup, conns, dur, &small, &streaming).await;
            return;
        }

        println!("gateway benchmark: {conns} connections, {secs} s per phase");
        let bare = common::passthrough::serve(sim).await;
        let bare_url = format!("http://{bare}/v1/chat/completions");
        run_phase(bare_url.clone(), None, small.clone(), false, 4, Duration::from_millis(300)).await;
        // One path alone for a profiler (`perf record -p`, `valgrind --tool=callgrind`):
        // `TF_BENCH_ONLY=gateway|bare|direct`, non-streamed chat, `TF_BENCH_STREAM=1` streamed;
        // `TF_BENCH_ONLY=responses`: the gateway's non-streamed Responses.
        if let Ok(only @ ("gateway" | "bare" | "direct" | "responses")) = std::env::var("TF_BENCH_ONLY").as_deref() {
            let (url, k) = match only {
                "gateway" => (gw_url, Some(key)),
                "responses" => (format!("http://{gw}/v1/responses"), Some(key)),
                "bare" => (bare_url, None),
                _ => (direct_url, None),
            };
            let stream = std::env::var("TF_BENCH_STREAM").is_ok();
            let body = match (stream, only) {
                (true, _) => streaming,
                (false, "responses") => json!({"model": "bench-base", "input": "hi", "max_output_tokens": 1}),
                (false, _) => small,
            };
            let p = run_phase(url, k, body, stream, conns, dur).await;
            println!("{only}: {:.0} req/s, {:.2} us CPU per {}", p.rps(), p.cpu_per_chunk_us(), if stream { "chunk" } else { "request" });
            if !stream {
                println!("  {}", p.machine_line());
            }
            return;
        }
        // Each load runs as two halves, alternating direct, the bare pass-through and gateway.
        let half = dur / 2;
        // The gateway asks the engine for a stream (issue 31: an abandoned answer is billed what
        // the engine made), so the engine works more for it than for `direct` and `bare`. The
        // engine shares this process: `engine streams` is the same request as the gateway sends
        // it, straight to the engine, read whole, to take the engine's extra work out of the
        // gateway's figure (on a real fleet it runs on the GPU hosts, not the gateway's).
        let mut small_streamed = small.clone();
        small_streamed["stream"] = json!(true);
        small_streamed["stream_options"] = json!({"include_usage": true});
        let d = run_phase(direct_url.clone(), None, small.clone(), false, conns, half).await;
        let e = run_phase(direct_url.clone(), None, small_streamed.clone(), false, conns, half).await;
        let b = run_phase(bare_url.clone(), None, small.clone(), false, conns, half).await;
        let g = run_phase(gw_url.clone(), Some(key.clone()), small.clone(), false, conns, half).await;
        let g = g.merge(run_phase(gw_url.clone(), Some(key.clone()), small.clone(), false, conns, half).await);
        let b = b.merge(run_phase(bare_url.clone(), None, small.clone(), false, conns, half).await);
        let e = e.merge(run_phase(direct_url.clone(), None, small_streamed, false, conns, half).await);
        let d = d.merge(run_phase(direct_url.clone(), None, small.clone(), false, conns, half).await);
        println!("non-streaming  direct  {:>9.0} req/s  p50 {:>6.2} ms  p99 {:>6.2} ms  {:>6.1} us CPU/req", d.rps(), d.pct(0.5), d.pct(0.99), d.cpu_per_chunk_us());
        println!("non-streaming  bare    {:>9.0} req/s  p50 {:>6.2} ms  p99 {:>6.2} ms  {:>6.1} us CPU/req", b.rps(), b.pct(0.5), b.pct(0.99), b.cpu_per_chunk_us());
        println!("non-streaming  gateway {:>9.0} req/s  p50 {:>6.2} ms  p99 {:>6.2} ms  {:>6.1} us CPU/req", g.rps(), g.pct(0.5), g.pct(0.99), g.cpu_per_chunk_us());
        println!("  throughput ratio gateway/direct: {:.2}; bare/direct: {:.2}; gateway/bare: {:.2} (target >= 0.95)", g.rps() / d.rps(), b.rps() / d.rps(), g.rps() / b.rps());
        // The load saturates this machine, so throughput follows what a request costs all of it:
        // the gateway's PostgreSQL work (the shipper's inserts, the rollup, the rater) included.
        println!("  bare    {}", b.machine_line());
        println!("  gateway {}", g.machine_line());
        println!("  machine CPU per request, bare/gateway: {:.2} (the throughput ratio's bound on a saturated machine)", b.machine.per(b.requests).0 / g.machine.per(g.requests).0);
        println!("engine streams direct  {:>9.0} req/s  p50 {:>6.2} ms  p99 {:>6.2} ms  {:>6.1} us CPU/req (the gateway's upstream request, read whole)", e.rps(), e.pct(0.5), e.pct(0.99), e.cpu_per_chunk_us());
        let engine_extra = e.cpu_per_chunk_us() - d.cpu_per_chunk_us();
        println!("  CPU per request above the bare pass-through: {:.1} us; without the engine's extra {:.1} us for streaming: {:.1} us (target <= 15)", g.cpu_per_chunk_us() - b.cpu_per_chunk_us(), engine_extra, g.cpu_per_chunk_us() - b.cpu_per_chunk_us() - engine_extra);
        let (chat_ratio, chat_cpu) = (g.rps() / d.rps(), g.cpu_per_chunk_us() - d.cpu_per_chunk_us());

        // The other endpoints' non-streamed answers, against the engine's own endpoint in the
        // same run (halves alternating): Responses (typed JSON, usage in `response.usage`) and
        // Embeddings (two inputs of a few words; usage input only).
        let typed = [
            ("responses", "/v1/responses", json!({"model": "bench-base", "input": "hi", "max_output_tokens": 1})),
            ("embeddings", "/v1/embeddings", json!({"model": "bench-embed", "input": ["hi there", "a second input"]})),
        ];
        for (label, path, body) in typed {
            let (direct, via) = (format!("http://{sim}{path}"), format!("http://{gw}{path}"));
            run_phase(via.clone(), Some(key.clone()), body.clone(), false, 4, Duration::from_millis(300)).await;
            // Responses stream upstream as chat does (`engine streams` above): the engine's own
            // extra work for that stream is measured the same way. Embeddings never stream.
            let streamed = (label == "responses").then(|| {
                let mut b = body.clone();
                b["stream"] = json!(true);
                b
            });
            let d = run_phase(direct.clone(), None, body.clone(), false, conns, half).await;
            let e = match &streamed {
                Some(sb) => Some(run_phase(direct.clone(), None, sb.clone(), false, conns, half).await),
                None => None,
            };
            let g = run_phase(via.clone(), Some(key.clone()), body.clone(), false, conns, half).await;
            let g = g.merge(run_phase(via, Some(key.clone()), body.clone(), false, conns, half).await);
            let e = match (e, streamed) {
                (Some(e), Some(sb)) => Some(e.merge(run_phase(direct.clone(), None, sb, false, conns, half).await)),
                _ => None,
            };
            let d = d.merge(run_phase(direct, None, body, false, conns, half).await);
            println!("{label:<14} direct  {:>9.0} req/s  p50 {:>6.2} ms  p99 {:>6.2} ms  {:>6.1} us CPU/req", d.rps(), d.pct(0.5), d.pct(0.99), d.cpu_per_chunk_us());
            println!("{label:<14} gateway {:>9.0} req/s  p50 {:>6.2} ms  p99 {:>6.2} ms  {:>6.1} us CPU/req", g.rps(), g.pct(0.5), g.pct(0.99), g.cpu_per_chunk_us());
            println!("  throughput ratio gateway/direct: {:.2} (chat: {:.2}); CPU per request above direct: {:.1} us (chat: {:.1})", g.rps() / d.rps(), chat_ratio, g.cpu_per_chunk_us() - d.cpu_per_chunk_us(), chat_cpu);
            if let Some(e) = e {
                let extra = e.cpu_per_chunk_us() - d.cpu_per_chunk_us();
                println!("  the engine's stream read whole: {:.1} us CPU/req; above direct without the engine's extra {extra:.1} us for streaming: {:.1} us", e.cpu_per_chunk_us(), g.cpu_per_chunk_us() - d.cpu_per_chunk_us() - extra);
            }
        }

        let d1 = run_phase(direct_url.clone(), None, small.clone(), false, 1, dur / 2).await;
        let g1 = run_phase(gw_url.clone(), Some(key.clone()), small.clone(), false, 1, dur / 2).await;
        println!("unloaded (1 connection) direct p50 {:.3} ms p99 {:.3} ms; gateway p50 {:.3} ms p99 {:.3} ms", d1.pct(0.5), d1.pct(0.99), g1.pct(0.5), g1.pct(0.99));
        println!("  added latency by the gateway: p50 {:.3} ms, p99 {:.3} ms (target p99 <= 1 ms)", g1.pct(0.5) - d1.pct(0.5), g1.pct(0.99) - d1.pct(0.99));

        let ds = run_phase(direct_url.clone(), None, streaming.clone(), true, conns, half).await;
        let bs = run_phase(bare_url.clone(), None, streaming.clone(), true, conns, half).await;
        let gs = run_phase(gw_url.clone(), Some(key.clone()), streaming.clone(), true, conns, half).await;
        let gs = gs.merge(run_phase(gw_url, Some(key), streaming.clone(), true, conns, half).await);
        let bs = bs.merge(run_phase(bare_url, None, streaming.clone(), true, conns, half).await);
        let ds = ds.merge(run_phase(direct_url, None, streaming.clone(), true, conns, half).await);
        println!("streaming 64   direct  {:>9.0} chunks/s  {:.2} us CPU/chunk (load generator + engine)", ds.chunks as f64 / ds.elapsed.as_secs_f64(), ds.cpu_per_chunk_us());
        println!("streaming 64   bare    {:>9.0} chunks/s  {:.2} us CPU/chunk (load generator + engine + bare pass-through)", bs.chunks as f64 / bs.elapsed.as_secs_f64(), bs.cpu_per_chunk_us());
        println!("streaming 64   gateway {:>9.0} chunks/s  {:.2} us CPU/chunk (load generator + engine + gateway)", gs.chunks as f64 / gs.elapsed.as_secs_f64(), gs.cpu_per_chunk_us());
        println!("  CPU per streamed chunk, gateway/bare relay: {:.2} (target <= 1.2 for the relay part: {:.2} vs {:.2} us above direct)", (gs.cpu_per_chunk_us() - ds.cpu_per_chunk_us()) / (bs.cpu_per_chunk_us() - ds.cpu_per_chunk_us()).max(0.01), gs.cpu_per_chunk_us() - ds.cpu_per_chunk_us(), bs.cpu_per_chunk_us() - ds.cpu_per_chunk_us());
        println!("  streaming throughput ratio: {:.2}; gateway CPU per streamed chunk: {:.2} us (target <= 5)", gs.chunks as f64 / gs.elapsed.as_secs_f64() / (ds.chunks as f64 / ds.elapsed.as_secs_f64()), gs.cpu_per_chunk_us() - ds.cpu_per_chunk_us());

        body_capture_phases(&setup, conns, dur, &small, &streaming).await;
    });
}
