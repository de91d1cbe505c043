//! Whole-answer assembly benchmark (issue 35): the CPU a non-streamed chat answer costs the
//! gateway between the engine's stream and the client's JSON, by the two ways the code can take
//! it, in one run: the meter assembling as it meters (one parse per event, the gateway's path),
//! against the meter emitting edited chunks that are parsed again and assembled (the path before).
//! The streams are the engine simulator's own bytes for a small and a 64-token answer, with
//! running usage on every chunk as the gateway asks for it. Single-threaded and CPU-bound; the
//! two ways alternate in rounds, and the ratio is the result.
//!
//! `cargo bench -p tokenfactory --bench assemble` (no database). Env: `TF_BENCH_ROUNDS`
//! (default 6), `TF_BENCH_ROUND_MS` (per way and round, default 300).

#![allow(
    clippy::disallowed_methods,
    reason = "the simulator serves until the benchmark ends"
)]
#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::json;
use tf_engine_sim::{EngineSim, SimConfig};
use tokenfactory::metering::assemble::{Assembler, Shape};
use tokenfactory::metering::meter::{ClientWants, Outgoing, StreamMeter};
use tokenfactory::metering::sse::SseParser;

const WANTS: ClientWants = ClientWants {
    usage: true,
    continuous: false,
};

/// The engine simulator's stream for a chat request of `max_tokens`, as the gateway asks for it.
async fn engine_stream(max_tokens: u32) -> Bytes {
    let sim = EngineSim::new(SimConfig {
        models: vec!["bench-base".into()],
        ..SimConfig::default()
    });
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(tf_engine_sim::serve(l, sim, std::future::pending()));
    reqwest::Client::new()
        .post(format!("http://{addr}/v1/chat/completions"))
        .json(&json!({
            "model": "bench-base",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": max_tokens,
            "stream": true,
            "stream_options": {"include_usage": true, "continuous_usage_stats": true},
        }))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap()
}

/// The path before: the meter emits the client's chunks, which are parsed again and assembled.
fn emit_then_assemble(stream: &Bytes) -> Vec<u8> {
    let mut meter = StreamMeter::new(WANTS).with_served_model("mine");
    let (mut upstream, mut sent, mut out) =
        (SseParser::default(), SseParser::default(), Vec::new());
    upstream.push(stream.clone());
    while let Some(event) = upstream.next_event() {
        meter.on_event(event, &mut out);
    }
    let mut answer = Assembler::new(Shape::Chat);
    for o in out {
        let (Outgoing::Send(b) | Outgoing::Done(b)) = o;
        sent.push(b);
        while let Some(event) = sent.next_event() {
            if let Some(data) = event.data {
                answer.push(&data);
            }
        }
    }
    answer.finish().unwrap()
}

/// The gateway's path: the meter assembles as it meters.
fn assemble_while_metering(stream: &Bytes) -> Vec<u8> {
    let mut meter = StreamMeter::new(WANTS)
        .with_served_model("mine")
        .assembling(Assembler::new(Shape::Chat).with_served_model("mine"));
    let (mut upstream, mut out) = (SseParser::default(), Vec::new());
    upstream.push(stream.clone());
    while let Some(event) = upstream.next_event() {
        meter.on_event(event, &mut out);
    }
    meter.take_assembler().unwrap().finish().unwrap()
}

/// Answers per second of `f` over `dur`.
fn rate(stream: &Bytes, dur: Duration, f: fn(&Bytes) -> Vec<u8>) -> f64 {
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < dur {
        for _ in 0..64 {
            black_box(f(black_box(stream)));
        }
        n += 64;
    }
    n as f64 / start.elapsed().as_secs_f64()
}

fn main() {
    let env = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(default)
    };
    let (rounds, round) = (
        env("TF_BENCH_ROUNDS", 6),
        Duration::from_millis(env("TF_BENCH_ROUND_MS", 300)),
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    println!("whole-answer assembly: {rounds} rounds of {round:?} per way");
    for max_tokens in [1, 64] {
        let stream = rt.block_on(engine_stream(max_tokens));
        // Both ways give the same answer, byte for byte.
        assert_eq!(
            emit_then_assemble(&stream),
            assemble_while_metering(&stream)
        );
        let (mut before, mut now) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            before.push(rate(&stream, round, emit_then_assemble));
            now.push(rate(&stream, round, assemble_while_metering));
        }
        let best = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
        let (b, n) = (best(&before), best(&now));
        println!(
            "max_tokens {max_tokens:>2} ({} bytes): emit+parse again {:>6.2} us, assemble while metering {:>6.2} us per answer; time now/before {:.2}",
            stream.len(),
            1e6 / b,
            1e6 / n,
            b / n
        );
    }
}
