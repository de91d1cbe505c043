//! Open-streams benchmark: N streams held open at once through the gateway, the engine sending
//! one token per second to each, and what that costs the gateway: resident memory and file
//! descriptors per open stream, CPU per streamed chunk. The gateway and the engine simulator run
//! as processes of their own (the release binary: `serve --fleet static:FILE` and `engine-sim`),
//! so the memory and descriptors counted are the gateway's alone; this process is the client
//! (raw TCP, hand-written HTTP/1.1, one small buffer per stream).
//!
//! `cargo build --release -p tokenfactory && cargo bench -p tokenfactory --bench streams`
//! (needs PostgreSQL and Redis; uses database `tokenfactory_bench_streams`, recreated each run).
//! Env: `TF_STREAMS` (open streams, default 1000; 10000 for the issue's figure),
//! `TF_STREAMS_WINDOW_SECS` (CPU sampling window once all are open, default 10),
//! `TF_BENCH_BIN` (the binary to measure, default `target/release/tokenfactory`).
//!
//! The same streams then go through a bare relay (`common::passthrough`, hyper on both sides, no
//! auth or metering; this binary run again as a process of its own) and the two are printed side
//! by side: issue 35 asks the gateway's CPU per streamed chunk to be within 1.2x of it.
//!
//! Open files: this process raises its soft limit to the hard one, and, when it may (root or
//! CAP_SYS_RESOURCE), the hard limit to what N streams need (the gateway needs 2 per stream, 3
//! before issue 19, and the simulator and this client 1 each); the children inherit it. When it
//! may not, it says so.

#![allow(
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::disallowed_methods
)]

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Streams that have received their first event.
static OPENED: AtomicU64 = AtomicU64::new(0);
/// SSE events received by all streams.
static CHUNKS: AtomicU64 = AtomicU64::new(0);
/// Streams that failed (connect error, non-200, early end).
static FAILED: AtomicU64 = AtomicU64::new(0);

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// Raises this process's open-files limits for `need` descriptors; returns what it could not do.
fn raise_nofile(need: u64) -> Option<String> {
    let (soft, hard) = rlimit::Resource::NOFILE.get().unwrap();
    let mut note = None;
    let mut hard_now = hard;
    if hard < need {
        match rlimit::Resource::NOFILE.set(need, need) {
            Ok(()) => hard_now = need,
            Err(e) => {
                note = Some(format!(
                    "hard open-files limit {hard} < {need} needed and cannot be raised ({e}); \
                     raise it (ulimit -Hn, limits.conf) or use fewer streams"
                ));
            }
        }
    }
    if soft < hard_now {
        if let Err(e) = rlimit::Resource::NOFILE.set(hard_now, hard_now) {
            note = Some(format!("cannot raise the soft open-files limit: {e}"));
        }
    }
    let (soft, hard) = rlimit::Resource::NOFILE.get().unwrap();
    println!("open-files limit: soft {soft}, hard {hard} (need about {need} in the gateway)");
    note
}

/// Resident set size of `pid` in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn fd_count(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count() as u64)
        .unwrap_or(0)
}

fn free_port() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

/// Stops the child processes when the benchmark ends, however it ends: SIGTERM first (the
/// gateway drains and exits, so a profiler wrapped around it writes its output), then SIGKILL.
struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in self.0.iter_mut().rev() {
            let _ = Command::new("kill")
                .args(["-TERM", &c.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(60);
            while Instant::now() < deadline && matches!(c.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

async fn wait_for_port(addr: SocketAddr, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while TcpStream::connect(addr).await.is_err() {
        assert!(Instant::now() < deadline, "{what} did not start on {addr}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The bench database (recreated) with one tenant; returns its URL and the tenant's key.
async fn setup_db() -> (String, String) {
    let (pool, url) = common::fresh_database("tokenfactory_bench_streams", 4).await;
    let tenant = tf_core::accounts::create_tenant(&pool, "bench", "Bench")
        .await
        .unwrap();
    let (_, key) = tf_core::keys::issue(&pool, tenant.id, "bench")
        .await
        .unwrap();
    pool.close().await;
    (url, key)
}

fn write_fleet(dir: &Path, sim: SocketAddr) -> PathBuf {
    let denied = tokenfactory::engine_policy::EnginePolicy::denied_except(&["sim"]);
    let denied: Vec<String> = denied.iter().map(|f| format!("{f:?}")).collect();
    let toml = format!(
        "[[base]]\nname = \"bench-base\"\nupstream = \"http://{sim}/v1\"\n\
         prompt_estimator = \"sim-words\"\ndenied_fields = [{}]\n",
        denied.join(", ")
    );
    let path = dir.join("fleet.toml");
    std::fs::write(&path, toml).unwrap();
    path
}

/// One request, read until the response ends or the benchmark drops the task.
async fn one_stream(gw: SocketAddr, request: Arc<Vec<u8>>) {
    let Ok(mut tcp) = TcpStream::connect(gw).await else {
        FAILED.fetch_add(1, Ordering::Relaxed);
        return;
    };
    if tcp.write_all(&request).await.is_err() {
        FAILED.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let mut buf = [0u8; 1024];
    let mut first = true;
    let mut tail = 0u8;
    loop {
        let n = match tcp.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let data = &buf[..n];
        if first && !data.starts_with(b"HTTP/1.1 200") {
            FAILED.fetch_add(1, Ordering::Relaxed);
            if FAILED.load(Ordering::Relaxed) <= 3 {
                println!(
                    "stream failed: {}",
                    String::from_utf8_lossy(&data[..n.min(300)])
                );
            }
            return;
        }
        // Events end with a blank line; a terminator split across reads still counts once.
        let mut events = data.windows(2).filter(|w| w == b"\n\n").count() as u64;
        if tail == b'\n' && data[0] == b'\n' {
            events += 1;
        }
        tail = data[n - 1];
        if events > 0 {
            if first {
                OPENED.fetch_add(1, Ordering::Relaxed);
                first = false;
            }
            CHUNKS.fetch_add(events, Ordering::Relaxed);
        }
    }
    FAILED.fetch_add(1, Ordering::Relaxed);
}

/// When set (`LISTEN UPSTREAM`), this process is the bare relay the gateway is compared with.
const RELAY_ENV: &str = "TF_STREAMS_RELAY";

/// The bare relay as a process of its own (this bench's binary run again), so its CPU, memory and
/// descriptors are counted as the gateway's are. Serves until it is killed.
fn relay_main(spec: &str) -> ! {
    let (listen, upstream) = spec.split_once(' ').unwrap();
    let (listen, upstream): (SocketAddr, SocketAddr) =
        (listen.parse().unwrap(), upstream.parse().unwrap());
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async move {
        let l = tokio::net::TcpListener::bind(listen).await.unwrap();
        common::passthrough::serve_on(l, upstream).await;
    });
    unreachable!("the relay serves until it is killed")
}

/// A streaming chat request to `addr` for `max_tokens`, one token a second when `paced` (the
/// simulator's knob, which the bench base lets through); the bare relay and the engine ignore
/// the key. The short unpaced ones warm up, on a connection closed after them.
fn stream_request(addr: SocketAddr, key: &str, max_tokens: u32, paced: bool) -> Arc<Vec<u8>> {
    let mut body = serde_json::json!({
        "model": "bench-base",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": max_tokens,
        "stream": true,
    });
    if paced {
        body["sim"] = serde_json::json!({"token_interval_ms": 1000});
    }
    let body = body.to_string();
    let connection = if paced { "" } else { "Connection: close\r\n" };
    Arc::new(
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {key}\r\n\
             Content-Type: application/json\r\n{connection}Content-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes(),
    )
}

/// What N open streams cost one relaying process.
struct Measured {
    open: u64,
    rss_per_stream_kib: f64,
    fds_per_stream: f64,
    chunks_per_s: f64,
    cpu_per_chunk_us: f64,
}

/// Opens `streams` streams through `addr` (served by process `pid`), samples that process's CPU
/// over `window` once all are open, prints and returns what they cost, and hangs up.
async fn measure(
    label: &str,
    pid: u32,
    addr: SocketAddr,
    key: &str,
    streams: u64,
    window: Duration,
) -> Measured {
    for counter in [&OPENED, &CHUNKS, &FAILED] {
        counter.store(0, Ordering::Relaxed);
    }
    let request = stream_request(addr, key, 900, true);
    // Warm up: caches filled, one upstream connection made and one stream billed.
    let warm = stream_request(addr, key, 2, false);
    for _ in 0..3 {
        one_stream(addr, warm.clone()).await;
    }
    let failed_warm = FAILED.swap(0, Ordering::Relaxed);
    assert!(
        OPENED.load(Ordering::Relaxed) > 0,
        "{label}: warm-up streams failed ({failed_warm})"
    );
    OPENED.store(0, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (rss0, fds0) = (rss_kib(pid), fd_count(pid));
    println!("{label} idle: {rss0} KiB RSS, {fds0} descriptors");

    // Open the streams, a batch at a time (the listen backlogs are finite).
    let t0 = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..streams {
        tasks.spawn(one_stream(addr, request.clone()));
        if i % 250 == 249 {
            while OPENED.load(Ordering::Relaxed) + FAILED.load(Ordering::Relaxed) + 500 < i {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while OPENED.load(Ordering::Relaxed) + FAILED.load(Ordering::Relaxed) < streams
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let open = OPENED.load(Ordering::Relaxed);
    println!(
        "{open} of {streams} streams open through the {label} after {:.1} s ({} failed)",
        t0.elapsed().as_secs_f64(),
        FAILED.load(Ordering::Relaxed)
    );
    // Settle (every stream past its first buffers), then sample.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (c0, cpu0, w0) = (
        CHUNKS.load(Ordering::Relaxed),
        common::machine::cpu_of(pid),
        Instant::now(),
    );
    tokio::time::sleep(window).await;
    let (c1, cpu1, elapsed) = (
        CHUNKS.load(Ordering::Relaxed),
        common::machine::cpu_of(pid),
        w0.elapsed(),
    );
    let (rss1, fds1) = (rss_kib(pid), fd_count(pid));
    let open = OPENED.load(Ordering::Relaxed) - FAILED.load(Ordering::Relaxed).min(open);
    let chunks = c1 - c0;
    let cpu = cpu1.saturating_sub(cpu0);
    let m = Measured {
        open,
        rss_per_stream_kib: rss1.saturating_sub(rss0) as f64 / open.max(1) as f64,
        fds_per_stream: fds1.saturating_sub(fds0) as f64 / open.max(1) as f64,
        chunks_per_s: chunks as f64 / elapsed.as_secs_f64(),
        cpu_per_chunk_us: cpu.as_secs_f64() * 1e6 / chunks.max(1) as f64,
    };
    println!("{label} with {open} open streams: {rss1} KiB RSS, {fds1} descriptors");
    println!(
        "  RSS per open stream: {:.1} KiB (target <= 25)",
        m.rss_per_stream_kib
    );
    println!(
        "  descriptors per open stream: {:.2} (target 2)",
        m.fds_per_stream
    );
    println!(
        "  {:.0} chunks/s streamed; {label} CPU {:.1}% of one core, {:.2} us per chunk",
        m.chunks_per_s,
        cpu.as_secs_f64() * 100.0 / elapsed.as_secs_f64(),
        m.cpu_per_chunk_us
    );
    // Hang up: the gateway half-closes upstream and bills what was streamed.
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    tokio::time::sleep(Duration::from_secs(2)).await;
    println!(
        "after hang-up: {} KiB RSS, {} descriptors",
        rss_kib(pid),
        fd_count(pid)
    );
    m
}

fn main() {
    if let Ok(spec) = std::env::var(RELAY_ENV) {
        relay_main(&spec);
    }
    let streams: u64 = env_or("TF_STREAMS", 1000);
    let window = Duration::from_secs(env_or("TF_STREAMS_WINDOW_SECS", 10));
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let bin = std::env::var("TF_BENCH_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|_| manifest.join("../target/release/tokenfactory"));
    assert!(
        bin.exists(),
        "{} missing: cargo build --release -p tokenfactory first",
        bin.display()
    );
    if let Some(note) = raise_nofile(streams * 3 + 2048) {
        println!("note: {note}");
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let (db_url, key) = setup_db().await;
        let scratch = std::env::temp_dir().join(format!("tf-bench-streams-{}", std::process::id()));
        std::fs::create_dir_all(&scratch).unwrap();
        let (sim, gw, relay) = (free_port(), free_port(), free_port());
        let fleet = write_fleet(&scratch, sim);
        let quiet = |c: &mut Command| {
            c.env("RUST_LOG", "warn")
                .stdin(Stdio::null())
                .stdout(Stdio::null());
        };
        let mut sim_cmd = Command::new(&bin);
        sim_cmd.args([
            "engine-sim",
            "--listen",
            &sim.to_string(),
            "--models",
            "bench-base",
        ]);
        quiet(&mut sim_cmd);
        let mut children = Children(vec![sim_cmd.spawn().unwrap()]);
        wait_for_port(sim, "engine-sim").await;
        let mut gw_cmd = Command::new(&bin);
        gw_cmd
            .args(["serve", "--listen", &gw.to_string()])
            .arg(format!("--fleet=static:{}", fleet.display()))
            .env("DATABASE_URL", &db_url)
            .env("TF_REDIS_PREFIX", format!("tfbench{}:", std::process::id()))
            .env("TF_JOURNAL_DIR", scratch.join("journal"))
            .env("TF_DEMO", "false")
            // One machine, the bench database's owner: no separate application role here.
            .env("TF_ALLOW_OWNER_ROLE", "true");
        quiet(&mut gw_cmd);
        children.0.push(gw_cmd.spawn().unwrap());
        let gw_pid = children.0[1].id();
        wait_for_port(gw, "gateway").await;
        let mut relay_cmd = Command::new(std::env::current_exe().unwrap());
        relay_cmd.env(RELAY_ENV, format!("{relay} {sim}"));
        quiet(&mut relay_cmd);
        children.0.push(relay_cmd.spawn().unwrap());
        let relay_pid = children.0[2].id();
        wait_for_port(relay, "bare relay").await;

        let g = measure("gateway", gw_pid, gw, &key, streams, window).await;
        let b = measure("bare relay", relay_pid, relay, &key, streams, window).await;
        println!(
            "gateway / bare relay at {} / {} open streams: CPU per chunk {:.2} / {:.2} us = {:.2} \
             (target <= 1.2); RSS per stream {:.1} / {:.1} KiB; descriptors {:.2} / {:.2}; \
             chunks/s {:.0} / {:.0}",
            g.open,
            b.open,
            g.cpu_per_chunk_us,
            b.cpu_per_chunk_us,
            g.cpu_per_chunk_us / b.cpu_per_chunk_us.max(0.01),
            g.rss_per_stream_kib,
            b.rss_per_stream_kib,
            g.fds_per_stream,
            b.fds_per_stream,
            g.chunks_per_s,
            b.chunks_per_s
        );
        drop(children);
        let _ = std::fs::remove_dir_all(&scratch);
    });
}
