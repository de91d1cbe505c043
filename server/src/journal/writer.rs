//! The journal writer: one thread owns the active segment; appends arrive over a channel and are
//! written in batches (one `write` for everything waiting), so one fsync covers many requests.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::PgPool;
use tokio::sync::oneshot;

use super::metrics::JournalMetrics;
use super::{record, segment, Durability};
use crate::metering::usage::{self, SinkFuture, UsageEvent, UsageSink};

/// A segment is closed and a new one started past this size.
const SEGMENT_BYTES: u64 = 32 * 1024 * 1024;
/// Most appends written by one `write`.
const MAX_BATCH: usize = 4096;

enum Msg {
    Append(Vec<u8>, oneshot::Sender<io::Result<()>>),
    /// fsync now; answered when done.
    Sync(oneshot::Sender<io::Result<()>>),
}

/// Handle to the journal of one process.
pub struct Journal {
    tx: Mutex<Option<mpsc::Sender<Msg>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    pub metrics: Arc<JournalMetrics>,
    pub dir: PathBuf,
    pub durability: Durability,
    /// Held for the process' lifetime: two processes must never append to one directory.
    _lock: File,
}

impl Journal {
    /// Opens (creating) the journal in `dir`: takes the directory lock, cuts a torn tail off the
    /// newest segment, and starts the writer thread.
    pub fn open(dir: &Path, durability: Durability, group_commit: Duration, metrics: Arc<JournalMetrics>) -> io::Result<Self> {
        fs::create_dir_all(dir)?;
        let lock = OpenOptions::new().create(true).truncate(false).write(true).open(dir.join("lock"))?;
        lock.try_lock().map_err(|_| {
            io::Error::new(
                io::ErrorKind::WouldBlock,
                format!("journal directory {} is in use by another process", dir.display()),
            )
        })?;
        let cursor = segment::read_cursor(dir)?;
        let seq = segment::list(dir)?.last().copied().unwrap_or(0).max(cursor.seq);
        let path = segment::path(dir, seq);
        let file = OpenOptions::new().create(true).truncate(false).write(true).open(&path)?;
        let valid = segment::valid_len(&path)?;
        if file.metadata()?.len() > valid {
            tracing::warn!(segment = %path.display(), valid, "dropping a torn tail from the journal");
            file.set_len(valid)?;
            file.sync_all()?;
        }
        let mut file = file;
        io::Seek::seek(&mut file, io::SeekFrom::Start(valid))?;
        let (tx, rx) = mpsc::channel();
        let state = WriterState {
            dir: dir.to_owned(),
            seq,
            file,
            len: valid,
            durability,
            group_commit,
            metrics: metrics.clone(),
        };
        let thread = std::thread::Builder::new()
            .name("tf-journal".into())
            .spawn(move || state.run(rx))?;
        Ok(Self {
            tx: Mutex::new(Some(tx)),
            thread: Mutex::new(Some(thread)),
            metrics,
            dir: dir.to_owned(),
            durability,
            _lock: lock,
        })
    }

    fn send(&self, msg: Msg) -> io::Result<()> {
        let guard = self.tx.lock().map_err(|_| io::Error::other("journal poisoned"))?;
        match guard.as_ref() {
            Some(tx) => tx.send(msg).map_err(|_| io::Error::other("journal writer stopped")),
            None => Err(io::Error::other("journal closed")),
        }
    }

    /// Appends one event; resolves when it is as durable as the journal's level promises.
    pub async fn append(&self, event: &UsageEvent) -> io::Result<()> {
        let bytes = record::encode(event).map_err(io::Error::other)?;
        let (ack, done) = oneshot::channel();
        self.send(Msg::Append(bytes, ack))?;
        done.await.map_err(|_| io::Error::other("journal writer stopped"))?
    }

    /// Forces an fsync of everything appended so far.
    pub async fn sync(&self) -> io::Result<()> {
        let (ack, done) = oneshot::channel();
        self.send(Msg::Sync(ack))?;
        done.await.map_err(|_| io::Error::other("journal writer stopped"))?
    }

    /// Stops the writer after fsyncing what it has (graceful shutdown).
    pub fn close(&self) {
        if let Ok(mut tx) = self.tx.lock() {
            tx.take();
        }
        if let Some(t) = self.thread.lock().ok().and_then(|mut t| t.take()) {
            let _ = t.join();
        }
    }
}

struct WriterState {
    dir: PathBuf,
    seq: u64,
    file: File,
    len: u64,
    durability: Durability,
    group_commit: Duration,
    metrics: Arc<JournalMetrics>,
}

impl WriterState {
    fn run(mut self, rx: mpsc::Receiver<Msg>) {
        let mut dirty = false;
        let mut last_sync = Instant::now();
        loop {
            let first = if dirty {
                match rx.recv_timeout(self.group_commit.saturating_sub(last_sync.elapsed())) {
                    Ok(m) => Some(m),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => break,
                }
            } else {
                match rx.recv() {
                    Ok(m) => Some(m),
                    Err(_) => break,
                }
            };
            let Some(first) = first else {
                let _ = self.fsync();
                dirty = false;
                last_sync = Instant::now();
                continue;
            };
            let mut appends = Vec::new();
            let mut syncs = Vec::new();
            let mut buf = Vec::new();
            let mut next = Some(first);
            while let Some(m) = next.take() {
                match m {
                    Msg::Append(bytes, ack) => {
                        buf.extend_from_slice(&bytes);
                        appends.push(ack);
                    }
                    Msg::Sync(ack) => syncs.push(ack),
                }
                if appends.len() < MAX_BATCH {
                    next = rx.try_recv().ok();
                }
            }
            let written = self.write(&buf);
            let must_sync = self.durability == Durability::Machine || !syncs.is_empty();
            let synced = if must_sync && written.is_ok() { self.fsync() } else { Ok(()) };
            let result = match (&written, &synced) {
                (Err(e), _) | (Ok(()), Err(e)) => Err(io::Error::new(e.kind(), e.to_string())),
                _ => Ok(()),
            };
            if result.is_ok() {
                self.metrics.journaled.fetch_add(appends.len() as u64, Ordering::Relaxed);
            }
            for ack in appends {
                let _ = ack.send(clone_result(&result));
            }
            for ack in syncs {
                let _ = ack.send(clone_result(&synced));
            }
            if must_sync {
                dirty = false;
                last_sync = Instant::now();
            } else if !buf.is_empty() {
                if !dirty {
                    last_sync = Instant::now();
                }
                dirty = true;
                if last_sync.elapsed() >= self.group_commit {
                    let _ = self.fsync();
                    dirty = false;
                    last_sync = Instant::now();
                }
            }
            if self.len >= SEGMENT_BYTES {
                if let Err(e) = self.rotate() {
                    tracing::error!(error = %e, "journal segment rotation failed");
                }
            }
        }
        let _ = self.fsync();
    }

    fn write(&mut self, buf: &[u8]) -> io::Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        // INVARIANT: a record is in the OS before its request's final bytes leave (the caller
        // awaits this ack); test: journal_survives_sigkill.
        self.file.write_all(buf)?;
        self.len += buf.len() as u64;
        Ok(())
    }

    fn fsync(&mut self) -> io::Result<()> {
        self.metrics.fsyncs.fetch_add(1, Ordering::Relaxed);
        self.file.sync_data()
    }

    fn rotate(&mut self) -> io::Result<()> {
        self.fsync()?;
        self.seq += 1;
        self.file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .append(true)
            .open(segment::path(&self.dir, self.seq))?;
        self.len = 0;
        Ok(())
    }
}

fn clone_result(r: &io::Result<()>) -> io::Result<()> {
    match r {
        Ok(()) => Ok(()),
        Err(e) => Err(io::Error::new(e.kind(), e.to_string())),
    }
}

/// The production usage sink: the journal, or PostgreSQL directly if the journal fails.
pub struct JournalSink {
    pub journal: Arc<Journal>,
    pub pool: PgPool,
}

impl UsageSink for JournalSink {
    fn record<'a>(&'a self, event: &'a UsageEvent) -> SinkFuture<'a> {
        Box::pin(async move {
            match self.journal.append(event).await {
                Ok(()) => Ok(()),
                Err(e) => {
                    tracing::error!(error = %e, request_id = %event.request_id, "journal append failed; writing to PostgreSQL directly");
                    usage::insert_batch(&self.pool, std::slice::from_ref(event)).await?;
                    Ok(())
                }
            }
        })
    }
}
