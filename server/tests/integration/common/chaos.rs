//! A TCP proxy the test controls (crates.io's ChaosProxy idea): `cut` drops every connection and
//! refuses new ones until `restore`.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct ChaosProxy {
    pub addr: SocketAddr,
    up: Arc<watch::Sender<bool>>,
    /// Connections accepted and forwarded so far.
    pub accepted: Arc<std::sync::atomic::AtomicUsize>,
    /// Connections dropped at once because the proxy was cut (attempts during an outage).
    pub refused: Arc<std::sync::atomic::AtomicUsize>,
}

impl ChaosProxy {
    pub async fn start(target: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (up, _) = watch::channel(true);
        let up = Arc::new(up);
        let target = target.to_owned();
        let state = up.clone();
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = accepted.clone();
        let refused = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let refused_counter = refused.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut client, _)) = listener.accept().await else {
                    return;
                };
                if !*state.borrow() {
                    refused_counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    drop(client);
                    continue;
                }
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let mut down = state.subscribe();
                let target = target.clone();
                tokio::spawn(async move {
                    let Ok(mut server) = TcpStream::connect(&target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        _ = down.wait_for(|up| !*up) => {}
                    }
                });
            }
        });
        Self {
            addr,
            up,
            accepted,
            refused,
        }
    }

    pub fn cut(&self) {
        self.up.send_replace(false);
    }

    pub fn restore(&self) {
        self.up.send_replace(true);
    }
}
