//! Drains the capture queue into `stored_bodies`, a batch per statement. A failed insert loses
//! that batch (logged): stored bodies are a convenience, never part of billing.

use sqlx::PgPool;
use tf_core::db::bodies::StoredBody;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Most captures inserted by one statement.
const BATCH: usize = 256;

/// Runs until `cancel` (then writes what is already queued) or until every sender is gone.
pub async fn run(pool: PgPool, mut rx: mpsc::Receiver<StoredBody>, cancel: CancellationToken) {
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
    while let Ok(row) = rx.try_recv() {
        batch.push(row);
        if batch.len() == BATCH {
            write(&pool, &mut batch).await;
        }
    }
    write(&pool, &mut batch).await;
}

async fn write(pool: &PgPool, batch: &mut Vec<StoredBody>) {
    if batch.is_empty() {
        return;
    }
    if let Err(e) = tf_core::db::bodies::insert_batch(pool, batch).await {
        tracing::warn!(error = %e, count = batch.len(), "stored bodies not written");
    }
    batch.clear();
}
