//! The journal writer: appends copy whole records into the active segment, a file written
//! through a shared mapping (`mapped`); a group committer thread makes them durable on disk, one
//! fsync for everything written since the last one.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::PgPool;

use super::durability::Durability;
use super::inflight::InflightLog;
use super::mapped::MappedFile;
use super::metrics::JournalMetrics;
use super::nudge::Nudge;
use super::{record, segment};
use crate::usage::{SinkFuture, SpendBarrier, UsageEvent, UsageSink};
use crate::usage_store;

/// A segment's size, reserved on disk when it is made: it is closed, cut to its records and a new
/// one started when a record does not fit.
const SEGMENT_BYTES: usize = 32 * 1024 * 1024;

/// The segments being appended to.
struct Active {
    /// The segment appended to, and its number (`None` after a new one could not be made: the
    /// next append tries again).
    map: Option<(u64, MappedFile)>,
    /// The next segment's number.
    next_seq: u64,
}

/// Handle to the journal of one process.
///
/// An append copies its record into the mapped segment under a short lock, on the caller's task:
/// the record is in the page cache (it survives a crash of this process) when `append` returns,
/// with no system call and no thread hop. Disk durability comes from the group committer thread:
/// in `process` mode it fsyncs at most every group-commit interval while writes come (and sleeps
/// while none do); in `machine` mode an append waits for the first fsync that started after its
/// copy, so one fsync covers every request waiting at that moment.
pub struct Journal {
    active: Mutex<Active>,
    committer: Arc<Committer>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    pub metrics: Arc<JournalMetrics>,
    pub dir: PathBuf,
    pub durability: Durability,
    segment_bytes: usize,
    /// Requests forwarded and not yet journaled (`inflight`): what a crash would otherwise forget.
    pub inflight: Arc<InflightLog>,
    /// Notified on every append: wakes a caught-up shipper ([`super::Shipper::waking_on`]).
    pub appended: Arc<tokio::sync::Notify>,
    /// Held for the process' lifetime: two processes must never append to one directory.
    _lock: File,
}

/// State shared with the group committer thread.
struct Committer {
    /// The active segment, as the committer fsyncs it (a clone of the writer's handle).
    file: Mutex<File>,
    /// Generation of the last write, and of the last write covered by an fsync.
    written: AtomicU64,
    synced: tokio::sync::watch::Sender<u64>,
    /// Ends its idle wait: a write in `process` mode, a waiter in `machine` mode.
    nudge: Arc<Nudge>,
    stop: AtomicBool,
    every: Duration,
    durability: Durability,
    metrics: Arc<JournalMetrics>,
}

/// Longest idle wait: nothing depends on it (work nudges the committer); it bounds what a missed
/// nudge could cost.
const IDLE_WAIT: Duration = Duration::from_secs(1);

impl Committer {
    fn run(&self) {
        loop {
            let stopping = self.stop.load(Ordering::SeqCst);
            let target = self.written.load(Ordering::SeqCst);
            if target > *self.synced.borrow() {
                let result = self
                    .file
                    .lock()
                    .map_err(|_| io::Error::other("journal poisoned"))
                    .and_then(|f| f.sync_data());
                self.metrics.fsyncs.fetch_add(1, Ordering::Relaxed);
                match result {
                    Ok(()) => {
                        self.synced.send_replace(target);
                    }
                    Err(e) => tracing::error!(error = %e, "journal fsync failed"),
                }
                if self.durability == Durability::Process {
                    std::thread::sleep(self.every);
                }
                continue;
            }
            if stopping {
                return;
            }
            // Idle: nothing to fsync. Sleep until a write or a stop.
            self.nudge.wait_idle(IDLE_WAIT, || {
                self.written.load(Ordering::SeqCst) != target || self.stop.load(Ordering::SeqCst)
            });
        }
    }

    /// Waits until an fsync covers write generation `gen`.
    async fn covered(&self, gen: u64) -> io::Result<()> {
        // The write nudged an idle committer; a busy one fsyncs again when it is done.
        let mut rx = self.synced.subscribe();
        rx.wait_for(|synced| *synced >= gen)
            .await
            .map(|_| ())
            .map_err(|_| io::Error::other("journal committer stopped"))
    }
}

impl Journal {
    /// Opens (creating) the journal in `dir`: takes the directory lock, cuts a torn tail off the
    /// newest segment, and starts the group committer.
    pub fn open(
        dir: &Path,
        durability: Durability,
        group_commit: Duration,
        metrics: Arc<JournalMetrics>,
    ) -> io::Result<Self> {
        Self::open_sized(dir, durability, group_commit, metrics, SEGMENT_BYTES)
    }

    /// [`Self::open`] with segments of `segment_bytes` (tests fill a few).
    fn open_sized(
        dir: &Path,
        durability: Durability,
        group_commit: Duration,
        metrics: Arc<JournalMetrics>,
        segment_bytes: usize,
    ) -> io::Result<Self> {
        // The metrics publish a segment's length in 32 bits (`JournalMetrics::active_segment`).
        if u32::try_from(segment_bytes).is_err() {
            return Err(io::Error::other("journal segments must be under 4 GiB"));
        }
        fs::create_dir_all(dir)?;
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join("lock"))?;
        lock.try_lock().map_err(|_| {
            io::Error::new(
                io::ErrorKind::WouldBlock,
                format!(
                    "journal directory {} is in use by another process",
                    dir.display()
                ),
            )
        })?;
        let cursor = segment::read_cursor(dir)?;
        // The newest segment is an earlier process's: cut to its whole records (a crash leaves
        // the reserved tail's zeros, perhaps after a torn record), and appends go to a new one.
        let next_seq = match segment::list(dir)?.last() {
            Some(&last) => {
                cut_torn_tail(&segment::path(dir, last))?;
                last + 1
            }
            None => 0,
        }
        .max(cursor.seq);
        let map = MappedFile::create(&segment::path(dir, next_seq), segment_bytes)?;
        metrics.set_active(Some((next_seq, 0)));
        let nudge = Arc::new(Nudge::default());
        let (inflight, recovered) = InflightLog::open(dir)?;
        let inflight = Arc::new(inflight);
        let committer = Arc::new(Committer {
            file: Mutex::new(map.file().try_clone()?),
            written: AtomicU64::new(0),
            synced: tokio::sync::watch::Sender::new(0),
            nudge,
            stop: AtomicBool::new(false),
            every: group_commit,
            durability,
            metrics: metrics.clone(),
        });
        let runner = committer.clone();
        let thread = std::thread::Builder::new()
            .name("tf-journal-fsync".into())
            .spawn(move || runner.run())?;
        let journal = Self {
            active: Mutex::new(Active {
                map: Some((next_seq, map)),
                next_seq: next_seq + 1,
            }),
            committer,
            thread: Mutex::new(Some(thread)),
            metrics,
            dir: dir.to_owned(),
            durability,
            segment_bytes,
            inflight,
            appended: Arc::new(tokio::sync::Notify::new()),
            _lock: lock,
        };
        journal.journal_recovered(&recovered)?;
        Ok(journal)
    }

    /// Journals, durably, the `interrupted` events of requests a previous process forwarded and
    /// never finished, then forgets them. INVARIANT: each is billed once: a crash before the
    /// forget journals it again under the same request id, which PostgreSQL absorbs (test:
    /// journal_faults::a_sigkill_bills_what_was_in_flight_once).
    fn journal_recovered(&self, events: &[UsageEvent]) -> io::Result<()> {
        if events.is_empty() {
            return self.inflight.forget_recovered();
        }
        for event in events {
            self.write(&record::encode(event))?;
        }
        if let Some((_, map)) = &self
            .active
            .lock()
            .map_err(|_| io::Error::other("journal poisoned"))?
            .map
        {
            map.file().sync_data()?;
        }
        self.metrics
            .journaled
            .fetch_add(events.len() as u64, Ordering::Relaxed);
        tracing::warn!(
            events = events.len(),
            "journaled requests a previous process left in flight, as interrupted"
        );
        self.inflight.forget_recovered()
    }

    /// Appends one event; returns once it is as durable as the journal's level promises.
    pub async fn append(&self, event: &UsageEvent) -> io::Result<()> {
        let bytes = record::encode(event);
        let gen = self.write(&bytes)?;
        self.metrics.journaled.fetch_add(1, Ordering::Relaxed);
        self.appended.notify_one();
        match self.durability {
            Durability::Machine => self.committer.covered(gen).await,
            // `process`: the write nudged the committer; it fsyncs within `group_commit`.
            _ => Ok(()),
        }
    }

    /// One whole record copied into the mapped segment under the lock (no system call, unless
    /// the segment is full).
    fn write(&self, bytes: &[u8]) -> io::Result<u64> {
        let mut active = self
            .active
            .lock()
            .map_err(|_| io::Error::other("journal poisoned"))?;
        if self.committer.stop.load(Ordering::SeqCst) {
            return Err(io::Error::other("journal closed"));
        }
        // INVARIANT: a record is in the OS before its request's final bytes leave (the request
        // path awaits `append`); test: journal_faults::sigkill_loses_no_answered_request_and_invents_none.
        let appended = |active: &mut Active| {
            let (seq, map) = active.map.as_mut()?;
            map.append(bytes).then(|| (*seq, map.written()))
        };
        let (seq, len) = match appended(&mut active) {
            Some(at) => at,
            None => {
                self.rotate(&mut active)?;
                appended(&mut active)
                    .ok_or_else(|| io::Error::other("journal record larger than a segment"))?
            }
        };
        self.metrics.set_active(Some((seq, len as u64)));
        let gen = self.committer.written.fetch_add(1, Ordering::SeqCst) + 1;
        // An idle committer sleeps until told; a busy one sees the write on its next round.
        self.committer.nudge.nudge();
        Ok(gen)
    }

    /// Closes the full segment (durable, then cut to its records) and starts the next one.
    fn rotate(&self, active: &mut Active) -> io::Result<()> {
        if let Some((seq, old)) = active.map.take() {
            // Everything in the old segment is fsynced before the committer moves to the new one.
            if let Err(e) = old.file().sync_data() {
                active.map = Some((seq, old));
                return Err(e);
            }
            // Cut before the next segment exists: a shipper that sees a later segment reads this
            // one's records and nothing after them (no zeros to take for a corrupt record).
            old.trim()?;
        }
        let seq = active.next_seq;
        let map = MappedFile::create(&segment::path(&self.dir, seq), self.segment_bytes)?;
        if let Ok(mut f) = self.committer.file.lock() {
            *f = map.file().try_clone()?;
        }
        active.map = Some((seq, map));
        active.next_seq = seq + 1;
        Ok(())
    }

    /// Stops appends and the committer after a last fsync (graceful shutdown), and cuts the
    /// active segment to its records.
    pub fn close(&self) {
        if let Ok(_active) = self.active.lock() {
            self.committer.stop.store(true, Ordering::SeqCst);
        }
        self.committer.nudge.wake_now();
        if let Some(t) = self.thread.lock().ok().and_then(|mut t| t.take()) {
            let _ = t.join();
        }
        if let Some((seq, map)) = self.active.lock().ok().and_then(|mut a| a.map.take()) {
            // Durable already (the committer's last fsync); this only drops the reserved tail.
            if let Err(e) = map.trim() {
                tracing::warn!(segment = seq, error = %e, "could not cut the journal's reserved tail; the next start will");
            }
        }
        self.metrics.set_active(None);
    }
}

/// Cuts a segment left by an earlier process to its whole records, durably.
fn cut_torn_tail(path: &Path) -> io::Result<()> {
    let bytes = fs::read(path)?;
    let valid = segment::valid_prefix(&bytes);
    if bytes.len() > valid {
        // A crash leaves the reserved tail's zeros; anything else there is a torn record.
        if bytes[valid..].iter().any(|b| *b != 0) {
            tracing::warn!(segment = %path.display(), valid, "dropping a torn tail from the journal");
        }
        let file = OpenOptions::new().write(true).open(path)?;
        file.set_len(valid as u64)?;
        file.sync_all()?;
    }
    Ok(())
}

/// The production usage sink: the journal, or PostgreSQL directly if the journal fails.
pub struct JournalSink {
    pub journal: Arc<Journal>,
    pub pool: PgPool,
    /// Waited on before an event written directly reaches PostgreSQL.
    pub spend: Option<SpendBarrier>,
}

impl UsageSink for JournalSink {
    fn record<'a>(&'a self, event: &'a UsageEvent) -> SinkFuture<'a> {
        Box::pin(async move {
            match self.journal.append(event).await {
                Ok(()) => Ok(()),
                Err(e) => {
                    tracing::error!(error = %e, request_id = %event.request_id, "journal append failed; writing to PostgreSQL directly");
                    usage_store::store(
                        &self.pool,
                        self.spend.as_ref(),
                        std::slice::from_ref(event),
                    )
                    .await?;
                    Ok(())
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::journal::codec::tests::event;

    /// In-flight records are copies into their own mapped file: they never wake the committer
    /// into an fsync (idle means idle without a journal write).
    #[test]
    fn in_flight_records_cost_no_fsync() {
        let dir = tempfile::tempdir().unwrap();
        let metrics = Arc::new(JournalMetrics::default());
        let journal = in_process_mode(dir.path(), &metrics, SEGMENT_BYTES);
        let fsyncs = metrics.fsyncs.load(Ordering::Relaxed);
        for n in 0..20 {
            drop(journal.inflight.start(&event(n), 3));
        }
        // Several group-commit intervals: a committer that fsynced for them would have by now.
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(metrics.fsyncs.load(Ordering::Relaxed), fsyncs);
        // A journal write does (the counter is live).
        journal.write(&record::encode(&event(99))).unwrap();
        let t = Instant::now();
        while metrics.fsyncs.load(Ordering::Relaxed) == fsyncs {
            assert!(t.elapsed() < IDLE_WAIT * 2, "a write was never fsynced");
            std::thread::sleep(Duration::from_millis(1));
        }
        journal.close();
    }

    /// A journal of `process` durability in `dir`, with segments of `segment_bytes`.
    fn in_process_mode(dir: &Path, metrics: &Arc<JournalMetrics>, segment_bytes: usize) -> Journal {
        Journal::open_sized(
            dir,
            Durability::Process,
            Duration::from_millis(5),
            metrics.clone(),
            segment_bytes,
        )
        .unwrap()
    }

    /// The records of `dir`'s segments, in order, and each segment's length on disk.
    fn on_disk(dir: &Path) -> (Vec<i64>, Vec<u64>) {
        let mut seen = Vec::new();
        let mut lens = Vec::new();
        for seq in segment::list(dir).unwrap() {
            let path = segment::path(dir, seq);
            let batch = segment::read_from(&path, 0, usize::MAX, usize::MAX, None).unwrap();
            seen.extend(batch.events.iter().map(|e| e.prompt_tokens));
            lens.push(fs::metadata(&path).unwrap().len());
        }
        (seen, lens)
    }

    /// A full segment is closed cut to its records (a shipper that sees the next one finds no
    /// zeros to take for a corrupt record) and the next one takes the record that did not fit;
    /// the backlog counts the writer's segment by its records, not its reserved length.
    #[test]
    fn full_segments_are_cut_to_their_records_and_nothing_is_lost() {
        let dir = tempfile::tempdir().unwrap();
        let metrics = Arc::new(JournalMetrics::default());
        let journal = in_process_mode(dir.path(), &metrics, 4096);
        let mut bytes = 0;
        for n in 0..100 {
            let record = record::encode(&event(n));
            bytes += record.len() as u64;
            journal.write(&record).unwrap();
        }
        let segments = segment::list(dir.path()).unwrap();
        assert!(segments.len() > 3, "{segments:?}");
        let (active, len) = metrics.active_segment().unwrap();
        assert_eq!(active, *segments.last().unwrap());
        assert_eq!(
            segment::backlog_bytes(dir.path(), segment::Cursor::default(), Some((active, len)))
                .unwrap(),
            bytes
        );
        let (seen, lens) = on_disk(dir.path());
        assert_eq!(seen, (0..100).collect::<Vec<i64>>());
        for (seq, len) in segments.iter().zip(&lens).rev().skip(1) {
            assert_eq!(
                *len,
                segment::valid_len(&segment::path(dir.path(), *seq)).unwrap()
            );
        }
        assert_eq!(
            *lens.last().unwrap(),
            4096,
            "the writer's segment is reserved whole"
        );
        journal.close();
        assert_eq!(metrics.active_segment(), None);
        let (_, lens) = on_disk(dir.path());
        assert_eq!(
            lens.iter().sum::<u64>(),
            bytes,
            "closed, every segment is its records"
        );
    }

    /// A crash leaves the writer's segment with its reserved tail of zeros: the next start cuts
    /// it to its records and appends to a new segment.
    #[test]
    fn after_a_crash_the_next_start_cuts_the_reserved_tail() {
        let dir = tempfile::tempdir().unwrap();
        let open = || in_process_mode(dir.path(), &Arc::default(), SEGMENT_BYTES);
        let journal = open();
        for n in 0..10 {
            journal.write(&record::encode(&event(n))).unwrap();
        }
        // The crash: no close, the mapping simply goes.
        drop(journal);
        let (seen, lens) = on_disk(dir.path());
        assert_eq!(seen.len(), 10);
        assert_eq!(lens, [SEGMENT_BYTES as u64]);
        let journal = open();
        journal.write(&record::encode(&event(10))).unwrap();
        journal.close();
        let (seen, lens) = on_disk(dir.path());
        assert_eq!(seen, (0..11).collect::<Vec<i64>>());
        assert_eq!(segment::list(dir.path()).unwrap(), [0, 1]);
        assert_eq!(
            lens[0],
            segment::valid_len(&segment::path(dir.path(), 0)).unwrap()
        );
    }

    /// A write wakes the idle committer: `machine` durability returns once fsynced, long before
    /// the idle wait's limit (a lost nudge would wait about the whole second: the committer went
    /// idle 2 ms before each append; the bound leaves a slow disk room).
    #[tokio::test]
    async fn a_write_wakes_the_idle_committer() {
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::open(
            dir.path(),
            Durability::Machine,
            Duration::from_millis(5),
            Arc::new(JournalMetrics::default()),
        )
        .unwrap();
        for n in 0..20 {
            // Idle between appends, so each one must wake the committer.
            tokio::time::sleep(Duration::from_millis(2)).await;
            let t = Instant::now();
            journal.append(&event(n)).await.unwrap();
            assert!(
                t.elapsed() < IDLE_WAIT * 9 / 10,
                "append {n} waited for the idle limit"
            );
        }
        journal.close();
    }
}
