//! Drains the capture queue into `stored_bodies`, a batch per statement, decoding the bodies to
//! text here rather than on the request path. A failed insert loses that batch (logged): stored
//! bodies are a convenience, never part of metering or billing.

use sqlx::PgPool;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::capture::Captured;

/// Most captures inserted by one statement.
const BATCH: usize = 256;

/// Runs until `cancel` (then writes what is already queued) or until every sender is gone.
pub async fn run(pool: PgPool, mut rx: mpsc::Receiver<Captured>, cancel: CancellationToken) {
    let mut batch = Vec::with_capacity(BATCH);
    loop {
        let got = tokio::select! {
            () = cancel.cancelled() => break,
            n = rx.recv_many(&mut batch, BATCH) => n,
        };
        if got == 0 {
            return;
        }
        write(&pool, &mut batch).await;
    }
    while let Ok(c) = rx.try_recv() {
        batch.push(c);
        if batch.len() == BATCH {
            write(&pool, &mut batch).await;
        }
    }
    write(&pool, &mut batch).await;
}

async fn write(pool: &PgPool, batch: &mut Vec<Captured>) {
    if batch.is_empty() {
        return;
    }
    let rows: Vec<_> = batch.drain(..).map(Captured::into_row).collect();
    if let Err(e) = tf_core::db::bodies::insert_batch(pool, &rows).await {
        tracing::warn!(error = %e, count = rows.len(), "stored bodies not written");
    }
}
