//! Crash-safe in-flight records (issue 34): a request is written here when it is forwarded, a
//! stream's progress at most once a second, and its end once its usage event is journaled. A
//! SIGKILL keeps what was written in the page cache, so on the next start every request that
//! started and never ended becomes one `interrupted` event billed at its last progress, instead of
//! revenue silently lost. Nothing here is fsynced: the page cache survives a process crash, and
//! after a power loss the worst case is a request billed at an older progress or not at all,
//! never twice (the recovered event has the request's own id, which PostgreSQL's primary key
//! absorbs if the real event was also journaled).
//!
//! The log is a series of generation files `inflight/{seq:016}.log` of journal-framed records
//! (length, CRC-32, payload): binary entries ([`put_entry`]); a file an older binary wrote holds
//! JSON entries, which are still read (an older binary skips the binary ones it cannot read, so a
//! rollback loses only the recovery of what was in flight). A generation past
//! [`GENERATION_BYTES`] is closed for new starts, and its file is deleted once every request
//! started in it has ended, so the log stays small without ever rewriting a record that a crash
//! could tear.
//!
//! Ends and progress are not written on their own: they wait in memory and leave with the next
//! start in the same `write`, or once [`ENDS_WAIT`] has passed (the journal's group committer
//! writes what is due, [`InflightLog::write_due`]) or [`ENDS_BYTES`] are waiting. Under load that
//! halves the log's system calls per request, and a stream's progress no longer costs a `write`
//! of its own each second (issue 35). Losing a waiting end to a crash is harmless: the request's
//! own event is already in the journal, so the recovered `interrupted` copy carries the same
//! request id and PostgreSQL's primary key absorbs it. Losing a waiting progress bills the
//! request at the progress before it: at most [`ENDS_WAIT`] (and a group-commit interval) more
//! behind than the second [`PROGRESS_EVERY`] already allows, never more than was relayed.

use std::borrow::Cow;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::nudge::Nudge;
use super::{codec, record};
use crate::usage::{Provenance, UsageEvent, UsageStatus};

/// A generation is closed for new starts past this size.
const GENERATION_BYTES: u64 = 8 * 1024 * 1024;
/// Progress is written at most this often per request.
pub const PROGRESS_EVERY: Duration = Duration::from_secs(1);
const SUFFIX: &str = ".log";
/// Longest an end or a progress waits for a start to ride with.
pub const ENDS_WAIT: Duration = Duration::from_millis(50);
/// Most bytes of ends and progress kept waiting.
const ENDS_BYTES: usize = 16 * 1024;

/// One record of the log: written in binary ([`put_entry`]); its serde form is the JSON older
/// binaries wrote, still read at recovery.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "k")]
enum Entry<'a> {
    /// Forwarded: the event's identity (tokens zero) and the gateway's prompt estimate; written
    /// from the request's own event (no copy), read back owned.
    #[serde(rename = "s")]
    Start {
        event: Cow<'a, UsageEvent>,
        prompt: u64,
    },
    /// Tokens relayed so far; `prompt`/`cached` once the engine reported them.
    #[serde(rename = "p")]
    Progress {
        id: Uuid,
        prompt: Option<u64>,
        cached: Option<u64>,
        completion: u64,
    },
    /// Its usage event is in the journal (or it was dropped unrecorded on purpose).
    #[serde(rename = "e")]
    End { id: Uuid },
}

/// Counts per request as of the last progress.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Progress {
    /// The engine's prompt count, once reported.
    pub prompt: Option<u64>,
    pub cached: Option<u64>,
    /// Completion tokens relayed to the client so far.
    pub completion: u64,
}

/// A generation file and how many requests started in it have not ended.
struct Generation {
    seq: u64,
    path: PathBuf,
    open: AtomicU64,
}

struct Current {
    file: File,
    len: u64,
    generation: Arc<Generation>,
    /// Framed end and progress records not yet written, then the start written with them.
    pending: Vec<u8>,
    /// When the oldest waiting record was added.
    pending_since: Option<Instant>,
}

impl Current {
    /// Writes what waits (the framed records in `pending`) in one `write`.
    fn write_pending(&mut self) -> io::Result<()> {
        let written = self.file.write_all(&self.pending);
        if written.is_ok() {
            self.len += self.pending.len() as u64;
        }
        self.pending.clear();
        self.pending_since = None;
        written
    }
}

/// The in-flight log of one process (the journal directory's lock holder).
pub struct InflightLog {
    dir: PathBuf,
    current: Mutex<Current>,
    /// Wakes the journal's committer when a record starts waiting (it writes it when due).
    nudge: Option<Arc<Nudge>>,
}

impl InflightLog {
    /// Opens the log in `dir/inflight`, returning the events of requests that a previous process
    /// started and never ended. The caller makes them durable (journal append) and then calls
    /// [`Self::forget_recovered`]; until then the old files stay, so a crash in between recovers
    /// them again (absorbed by the request id).
    pub fn open(journal_dir: &Path) -> io::Result<(Self, Vec<UsageEvent>)> {
        let dir = journal_dir.join("inflight");
        fs::create_dir_all(&dir)?;
        let seqs = list(&dir)?;
        let mut recovered = Recovery::default();
        for seq in &seqs {
            recovered.read(&path(&dir, *seq))?;
        }
        let next = seqs.last().map_or(0, |s| s.saturating_add(1));
        let current = open_generation(&dir, next)?;
        Ok((
            Self {
                dir,
                current: Mutex::new(current),
                nudge: None,
            },
            recovered.events(),
        ))
    }

    /// Nudges `nudge` when a record starts waiting: whoever holds it calls [`Self::write_due`]
    /// at the due time.
    pub(super) fn nudging(mut self, nudge: Arc<Nudge>) -> Self {
        self.nudge = Some(nudge);
        self
    }

    /// Deletes the generations of previous processes (their requests are recovered).
    pub fn forget_recovered(&self) -> io::Result<()> {
        let current = self.lock()?.generation.seq;
        for seq in list(&self.dir)? {
            if seq < current {
                fs::remove_file(path(&self.dir, seq))?;
            }
        }
        Ok(())
    }

    /// Records a forwarded request; the ticket writes its progress and end.
    pub fn start(self: &Arc<Self>, event: &UsageEvent, prompt_estimate: u64) -> Ticket {
        let entry = Entry::Start {
            event: Cow::Borrowed(event),
            prompt: prompt_estimate,
        };
        let generation = match self.write_start(&entry) {
            Ok(g) => Some(g),
            Err(e) => {
                tracing::warn!(error = %e, request_id = %event.request_id, "in-flight record not written");
                None
            }
        };
        Ticket {
            log: self.clone(),
            id: event.request_id,
            generation,
            last: Instant::now(),
        }
    }

    fn lock(&self) -> io::Result<std::sync::MutexGuard<'_, Current>> {
        self.current
            .lock()
            .map_err(|_| io::Error::other("in-flight log poisoned"))
    }

    /// One `write` of a start (and the records waiting for it); it is counted in the generation
    /// it lands in.
    fn write_start(&self, entry: &Entry<'_>) -> io::Result<Arc<Generation>> {
        let mut current = self.lock()?;
        if current.len >= GENERATION_BYTES {
            let next = current.generation.seq.saturating_add(1);
            let fresh = open_generation(&self.dir, next)?;
            let mut old = std::mem::replace(&mut *current, fresh);
            // Waiting ends go with the start into the fresh file (an end is matched by id, in
            // whichever file it lands).
            current.pending = std::mem::take(&mut old.pending);
            current.pending_since = old.pending_since;
            retire(&old.generation);
        }
        record::frame_into(&mut current.pending, |out| put_entry(out, entry));
        current.write_pending()?;
        current.generation.open.fetch_add(1, Ordering::AcqRel);
        Ok(current.generation.clone())
    }

    /// Keeps an end or progress waiting for the next start, or writes what waits when it is old
    /// or large.
    fn wait_or_write(&self, entry: &Entry<'_>) -> io::Result<()> {
        let mut current = self.lock()?;
        record::frame_into(&mut current.pending, |out| put_entry(out, entry));
        let now = Instant::now();
        let first = current.pending_since.is_none();
        let since = *current.pending_since.get_or_insert(now);
        if current.pending.len() >= ENDS_BYTES || now.duration_since(since) >= ENDS_WAIT {
            return current.write_pending();
        }
        drop(current);
        if first {
            if let Some(nudge) = &self.nudge {
                nudge.nudge();
            }
        }
        Ok(())
    }

    /// Writes what has waited [`ENDS_WAIT`] or longer; returns how long until what still waits
    /// falls due (`None`: nothing waits). The journal's group committer calls it when nudged and
    /// at each due time, so nothing waits much longer than [`ENDS_WAIT`] when no start comes
    /// along.
    pub fn write_due(&self) -> Option<Duration> {
        let mut current = self.lock().ok()?;
        let waited = current.pending_since?.elapsed();
        if waited < ENDS_WAIT {
            return Some(ENDS_WAIT - waited);
        }
        if let Err(e) = current.write_pending() {
            tracing::warn!(error = %e, "in-flight ends and progress not written");
        }
        None
    }

    fn end(&self, id: Uuid, generation: &Arc<Generation>) {
        if let Err(e) = self.wait_or_write(&Entry::End { id }) {
            tracing::warn!(error = %e, request_id = %id, "in-flight end not written");
        }
        if generation.open.fetch_sub(1, Ordering::AcqRel) == 1 {
            let current = self.lock().map(|c| c.generation.seq).unwrap_or(u64::MAX);
            if generation.seq < current {
                retire(generation);
            }
        }
    }
}

impl Drop for InflightLog {
    /// A clean stop writes the ends still waiting.
    fn drop(&mut self) {
        if let Ok(mut current) = self.current.lock() {
            if !current.pending.is_empty() {
                let _ = current.write_pending();
            }
        }
    }
}

/// Entry tags of the binary format (below `{`, which starts the JSON of older binaries).
const START: u8 = 1;
const PROGRESS: u8 = 2;
const END: u8 = 3;

/// An entry's binary payload.
fn put_entry(out: &mut Vec<u8>, entry: &Entry<'_>) {
    match entry {
        Entry::Start { event, prompt } => {
            out.push(START);
            codec::put_event(out, event);
            codec::put_u64(out, *prompt);
        }
        Entry::Progress {
            id,
            prompt,
            cached,
            completion,
        } => {
            out.push(PROGRESS);
            out.extend_from_slice(id.as_bytes());
            codec::put_opt(out, *prompt, codec::put_u64);
            codec::put_opt(out, *cached, codec::put_u64);
            codec::put_u64(out, *completion);
        }
        Entry::End { id } => {
            out.push(END);
            out.extend_from_slice(id.as_bytes());
        }
    }
}

/// An entry from its payload: binary, or the JSON an older binary wrote.
fn read_entry(payload: &[u8]) -> Result<Entry<'static>, String> {
    if payload.first() == Some(&b'{') {
        return serde_json::from_slice(payload).map_err(|e| e.to_string());
    }
    let mut r = codec::Reader::new(payload);
    match binary_entry(&mut r) {
        Some(e) if r.is_empty() => Ok(e),
        _ => Err("not an in-flight entry".into()),
    }
}

fn binary_entry(r: &mut codec::Reader<'_>) -> Option<Entry<'static>> {
    Some(match r.u8()? {
        START => Entry::Start {
            event: Cow::Owned(codec::get_event(r)?),
            prompt: r.u64()?,
        },
        PROGRESS => Entry::Progress {
            id: r.uuid()?,
            prompt: r.opt(codec::Reader::u64)?,
            cached: r.opt(codec::Reader::u64)?,
            completion: r.u64()?,
        },
        END => Entry::End { id: r.uuid()? },
        _ => return None,
    })
}

/// Deletes a closed generation once nothing started in it is open. A request that starts in it
/// while it is being closed keeps it (the count is read after the swap).
fn retire(generation: &Generation) {
    if generation.open.load(Ordering::Acquire) == 0 {
        if let Err(e) = fs::remove_file(&generation.path) {
            if e.kind() != io::ErrorKind::NotFound {
                tracing::warn!(error = %e, file = %generation.path.display(), "in-flight generation not removed");
            }
        }
    }
}

/// A request's place in the log: progress while it runs, and its end.
pub struct Ticket {
    log: Arc<InflightLog>,
    id: Uuid,
    /// `None`: the start was not written, so nothing more is.
    generation: Option<Arc<Generation>>,
    last: Instant,
}

impl Ticket {
    /// Records the request's progress if [`PROGRESS_EVERY`] has passed since the start or the
    /// last progress (it waits for the next write, at most [`ENDS_WAIT`]; never fsynced).
    pub fn progress(&mut self, p: impl FnOnce() -> Progress) {
        if self.generation.is_none() || self.last.elapsed() < PROGRESS_EVERY {
            return;
        }
        self.last = Instant::now();
        let p = p();
        let entry = Entry::Progress {
            id: self.id,
            prompt: p.prompt,
            cached: p.cached,
            completion: p.completion,
        };
        if let Err(e) = self.log.wait_or_write(&entry) {
            tracing::warn!(error = %e, request_id = %self.id, "in-flight progress not written");
        }
    }
}

impl Ticket {
    /// Leaves the request in flight for good: its event could not be recorded, so the next start
    /// recovers it from the log (its generation file is kept until then).
    pub fn keep_open(mut self) {
        self.generation = None;
    }
}

impl Drop for Ticket {
    /// The request's event was journaled (or deliberately not recorded): it is no longer in
    /// flight.
    fn drop(&mut self) {
        if let Some(generation) = self.generation.take() {
            self.log.end(self.id, &generation);
        }
    }
}

fn path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("{seq:016}{SUFFIX}"))
}

fn list(dir: &Path) -> io::Result<Vec<u64>> {
    let mut seqs: Vec<u64> = fs::read_dir(dir)?
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.strip_suffix(SUFFIX)?.parse().ok())
        .collect();
    seqs.sort_unstable();
    Ok(seqs)
}

fn open_generation(dir: &Path, seq: u64) -> io::Result<Current> {
    let path = path(dir, seq);
    let file = OpenOptions::new().create(true).append(true).open(&path)?;
    let len = file.metadata()?.len();
    Ok(Current {
        file,
        len,
        generation: Arc::new(Generation {
            seq,
            path,
            open: AtomicU64::new(0),
        }),
        pending: Vec::new(),
        pending_since: None,
    })
}

/// What the previous processes' files say, in write order.
#[derive(Default)]
struct Recovery {
    started: std::collections::HashMap<Uuid, (UsageEvent, u64, Progress)>,
    /// Start order, so recovered events come out in the order requests began.
    order: Vec<Uuid>,
}

impl Recovery {
    fn read(&mut self, file: &Path) -> io::Result<()> {
        let bytes = fs::read(file)?;
        let mut at = 0;
        while let Some(rest) = bytes.get(at..) {
            let (payload, len) = match record::unframe(rest) {
                record::Frame::Whole { payload, len } => (payload, len),
                // A torn tail ends what can be read of this file (a crash mid-write).
                record::Frame::Incomplete | record::Frame::Corrupt => break,
            };
            at += len;
            match read_entry(payload) {
                Ok(Entry::Start { event, prompt }) => {
                    self.order.push(event.request_id);
                    self.started.insert(
                        event.request_id,
                        (event.into_owned(), prompt, Progress::default()),
                    );
                }
                Ok(Entry::Progress {
                    id,
                    prompt,
                    cached,
                    completion,
                }) => {
                    if let Some((_, _, p)) = self.started.get_mut(&id) {
                        *p = Progress {
                            prompt,
                            cached,
                            completion,
                        };
                    }
                }
                Ok(Entry::End { id }) => {
                    self.started.remove(&id);
                }
                Err(e) => {
                    tracing::warn!(error = %e, file = %file.display(), "unreadable in-flight record skipped")
                }
            }
        }
        Ok(())
    }

    /// One `interrupted` event per request that started and never ended, billed at its last
    /// progress: the engine's prompt count if it arrived, else the gateway's estimate (the
    /// engine had the prompt: it was forwarded); completion tokens relayed.
    fn events(mut self) -> Vec<UsageEvent> {
        let mut out = Vec::new();
        for id in self.order {
            let Some((mut event, estimate, p)) = self.started.remove(&id) else {
                continue;
            };
            let prompt = p.prompt.unwrap_or(estimate);
            event.prompt_tokens = i64::try_from(prompt).unwrap_or(i64::MAX);
            event.cached_tokens = i64::try_from(p.cached.unwrap_or(0).min(prompt)).unwrap_or(0);
            event.completion_tokens = i64::try_from(p.completion).unwrap_or(i64::MAX);
            event.provenance = if p.prompt.is_some() {
                Provenance::Partial
            } else {
                Provenance::Estimated
            };
            event.status = UsageStatus::Interrupted;
            out.push(event);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::codec::tests::event;

    fn started(n: u8) -> UsageEvent {
        let mut e = event(n);
        e.prompt_tokens = 0;
        e.completion_tokens = 0;
        e
    }

    #[test]
    fn a_request_that_never_ended_is_recovered_once_at_its_last_progress() {
        let dir = tempfile::tempdir().unwrap();
        let (done, cut, quiet) = (started(1), started(2), started(3));
        {
            let (log, none) = InflightLog::open(dir.path()).unwrap();
            assert!(none.is_empty());
            let log = Arc::new(log);
            drop(log.start(&done, 11));
            let mut t = log.start(&cut, 12);
            t.last = Instant::now() - PROGRESS_EVERY;
            t.progress(|| Progress {
                prompt: Some(40),
                cached: Some(8),
                completion: 17,
            });
            // Within the second: not written.
            t.progress(|| Progress {
                prompt: Some(40),
                cached: Some(8),
                completion: 99,
            });
            let q = log.start(&quiet, 13);
            // A crash: neither ticket ends.
            std::mem::forget(t);
            std::mem::forget(q);
        }
        let (log, recovered) = InflightLog::open(dir.path()).unwrap();
        let got: Vec<_> = recovered
            .iter()
            .map(|e| {
                (
                    e.request_id,
                    e.prompt_tokens,
                    e.cached_tokens,
                    e.completion_tokens,
                    e.provenance,
                    e.status,
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (
                    cut.request_id,
                    40,
                    8,
                    17,
                    Provenance::Partial,
                    UsageStatus::Interrupted
                ),
                (
                    quiet.request_id,
                    13,
                    0,
                    0,
                    Provenance::Estimated,
                    UsageStatus::Interrupted
                ),
            ]
        );
        // Until forgotten, a restart recovers them again (the request id absorbs the repeat);
        // once forgotten, never.
        drop(log);
        let (log, again) = InflightLog::open(dir.path()).unwrap();
        assert_eq!(again.len(), 2);
        log.forget_recovered().unwrap();
        drop(log);
        let (_, none) = InflightLog::open(dir.path()).unwrap();
        assert!(none.is_empty());
    }

    /// A log an older binary wrote (JSON entries) is still recovered, and entries of both
    /// formats meet in one file: an end in binary closes a start in JSON.
    #[test]
    fn json_entries_of_an_older_binary_are_recovered() {
        let dir = tempfile::tempdir().unwrap();
        let (ended, cut) = (started(1), started(2));
        let mut bytes = Vec::new();
        for entry in [
            Entry::Start {
                event: Cow::Borrowed(&ended),
                prompt: 5,
            },
            Entry::Start {
                event: Cow::Borrowed(&cut),
                prompt: 6,
            },
            Entry::Progress {
                id: cut.request_id,
                prompt: None,
                cached: None,
                completion: 3,
            },
        ] {
            let json = serde_json::to_vec(&entry).unwrap();
            record::frame_into(&mut bytes, |out| out.extend_from_slice(&json));
        }
        record::frame_into(&mut bytes, |out| {
            put_entry(
                out,
                &Entry::End {
                    id: ended.request_id,
                },
            )
        });
        fs::create_dir_all(dir.path().join("inflight")).unwrap();
        fs::write(path(&dir.path().join("inflight"), 0), &bytes).unwrap();
        let (_, recovered) = InflightLog::open(dir.path()).unwrap();
        let got: Vec<_> = recovered
            .iter()
            .map(|e| (e.request_id, e.prompt_tokens, e.completion_tokens))
            .collect();
        assert_eq!(got, vec![(cut.request_id, 6, 3)]);
        assert_eq!(recovered[0].served_name, cut.served_name);
    }

    #[test]
    fn every_entry_round_trips_in_binary_and_a_cut_one_is_refused() {
        let e = started(7);
        for entry in [
            Entry::Start {
                event: Cow::Borrowed(&e),
                prompt: 9,
            },
            Entry::Progress {
                id: e.request_id,
                prompt: Some(4),
                cached: None,
                completion: 2,
            },
            Entry::End { id: e.request_id },
        ] {
            let mut out = Vec::new();
            put_entry(&mut out, &entry);
            assert_eq!(
                format!("{:?}", read_entry(&out).unwrap()),
                format!("{entry:?}")
            );
            assert!(read_entry(&out[..out.len() - 1]).is_err());
        }
    }

    #[test]
    fn an_end_rides_with_the_next_start_or_leaves_after_its_wait() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b, c, d) = (started(1), started(2), started(3), started(4));
        {
            let (log, _) = InflightLog::open(dir.path()).unwrap();
            let log = Arc::new(log);
            drop(log.start(&a, 1));
            // Waiting: a crash now would recover `a` (absorbed by its id downstream).
            assert!(!log.lock().unwrap().pending.is_empty());
            // `b`'s start carries `a`'s end.
            std::mem::forget(log.start(&b, 2));
            assert!(log.lock().unwrap().pending.is_empty());
            // An end that has waited its time leaves with the next end, without a start.
            let (tc, td) = (log.start(&c, 3), log.start(&d, 4));
            drop(tc);
            log.lock().unwrap().pending_since = Some(Instant::now() - ENDS_WAIT);
            drop(td);
            assert!(log.lock().unwrap().pending.is_empty());
            // A crash (no clean stop).
            std::mem::forget(log);
        }
        let (_, recovered) = InflightLog::open(dir.path()).unwrap();
        let ids: Vec<_> = recovered.iter().map(|e| e.request_id).collect();
        assert_eq!(ids, vec![b.request_id]);

        // A clean stop writes what waits.
        let dir = tempfile::tempdir().unwrap();
        {
            let (log, _) = InflightLog::open(dir.path()).unwrap();
            let log = Arc::new(log);
            drop(log.start(&a, 1));
        }
        let (_, recovered) = InflightLog::open(dir.path()).unwrap();
        assert!(recovered.is_empty());
    }

    #[test]
    fn progress_waits_like_an_end_and_is_written_once_due() {
        let dir = tempfile::tempdir().unwrap();
        let a = started(1);
        {
            let (log, _) = InflightLog::open(dir.path()).unwrap();
            let log = Arc::new(log);
            let mut t = log.start(&a, 7);
            t.last = Instant::now() - PROGRESS_EVERY;
            t.progress(|| Progress {
                prompt: Some(30),
                cached: None,
                completion: 12,
            });
            // Waiting, and not yet due: the committer is told when it will be.
            let due = log.write_due().unwrap();
            assert!(due <= ENDS_WAIT && due > Duration::ZERO);
            assert!(!log.lock().unwrap().pending.is_empty());
            log.lock().unwrap().pending_since = Some(Instant::now() - ENDS_WAIT);
            assert_eq!(log.write_due(), None);
            assert!(log.lock().unwrap().pending.is_empty());
            // A crash after it was written: billed at that progress.
            std::mem::forget(t);
            std::mem::forget(log);
        }
        let (_, recovered) = InflightLog::open(dir.path()).unwrap();
        let got: Vec<_> = recovered
            .iter()
            .map(|e| (e.request_id, e.prompt_tokens, e.completion_tokens))
            .collect();
        assert_eq!(got, vec![(a.request_id, 30, 12)]);
    }

    #[test]
    fn a_torn_tail_loses_only_the_torn_record() {
        let dir = tempfile::tempdir().unwrap();
        let a = started(1);
        {
            let (log, _) = InflightLog::open(dir.path()).unwrap();
            let log = Arc::new(log);
            std::mem::forget(log.start(&a, 5));
            std::mem::forget(log.start(&started(2), 6));
        }
        let file = path(&dir.path().join("inflight"), 0);
        let len = fs::metadata(&file).unwrap().len();
        OpenOptions::new()
            .write(true)
            .open(&file)
            .unwrap()
            .set_len(len - 3)
            .unwrap();
        let (_, recovered) = InflightLog::open(dir.path()).unwrap();
        assert_eq!(
            recovered.iter().map(|e| e.request_id).collect::<Vec<_>>(),
            vec![a.request_id]
        );
    }

    #[test]
    fn a_closed_generation_is_deleted_when_its_last_request_ends() {
        let dir = tempfile::tempdir().unwrap();
        let (log, _) = InflightLog::open(dir.path()).unwrap();
        let log = Arc::new(log);
        let long = log.start(&started(1), 1);
        // Fill generation 0 past its size with requests that end at once.
        let mut filler = started(2);
        filler.served_name = "x".repeat(4096);
        while log.lock().unwrap().len < GENERATION_BYTES {
            drop(log.start(&filler, 1));
        }
        drop(log.start(&started(3), 1));
        let files = || list(&dir.path().join("inflight")).unwrap();
        assert_eq!(
            files(),
            vec![0, 1],
            "generation 0 stays while a request in it runs"
        );
        drop(long);
        assert_eq!(files(), vec![1]);
    }
}
