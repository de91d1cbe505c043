//! A graph's frontend on one machine: a loopback TCP listener that hands each new connection to
//! the next ready replica, round robin (the job Dynamo's frontend does in a cluster). It balances
//! connections, not requests: the gateway's keep-alive pool holds several, which spreads load.
//! A connection that finds no ready replica is closed, which the gateway reports as unavailable.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::replica::{lock, Replica};

/// The replicas a frontend forwards to; replaced whole when the graph is re-applied.
pub type Replicas = Arc<Mutex<Vec<Arc<Replica>>>>;

/// Binds the frontend and serves it until `stop`.
pub async fn start(
    replicas: Replicas,
    tracker: &TaskTracker,
    stop: CancellationToken,
) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let next = Arc::new(AtomicUsize::new(0));
    let conns = tracker.clone();
    tracker.spawn(async move {
        loop {
            let accepted = tokio::select! {
                () = stop.cancelled() => return,
                accepted = listener.accept() => accepted,
            };
            let Ok((client, _)) = accepted else { continue };
            let Some(port) = pick(&replicas, &next) else {
                drop(client);
                continue;
            };
            let stop = stop.clone();
            conns.spawn(async move {
                tokio::select! {
                    () = stop.cancelled() => {}
                    () = forward(client, port) => {}
                }
            });
        }
    });
    Ok(addr)
}

/// The next ready replica's port, starting after the last one chosen.
fn pick(replicas: &Replicas, next: &AtomicUsize) -> Option<u16> {
    let replicas = lock(replicas);
    let n = replicas.len();
    let start = next.fetch_add(1, Ordering::Relaxed);
    (0..n)
        .map(|i| &replicas[(start + i) % n])
        .find(|r| r.is_ready())
        .map(|r| r.port)
}

async fn forward(mut client: TcpStream, port: u16) {
    let Ok(mut upstream) = TcpStream::connect(("127.0.0.1", port)).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
}
