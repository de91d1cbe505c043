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
//! rollback loses only the recovery of what was in flight). A generation holds
//! [`GENERATION_BYTES`]; a start that does not fit opens the next one, and a closed generation's
//! file is deleted once every request started in it has ended, so the log stays small without
//! ever rewriting a record that a crash could tear.
//!
//! Records are copied into the generation's shared file mapping ([`super::mapped`]) under a lock
//! held for that copy alone: no system call per record (issue 35), so every record, end and
//! progress included, is in the page cache as soon as it is made.

use std::borrow::Cow;
use std::cell::RefCell;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::mapped::MappedFile;
use super::{codec, record};
use crate::usage::{Provenance, UsageEvent, UsageStatus};

/// Bytes reserved per generation file.
const GENERATION_BYTES: usize = 8 * 1024 * 1024;
/// Progress is written at most this often per request.
pub const PROGRESS_EVERY: Duration = Duration::from_secs(1);
const SUFFIX: &str = ".log";

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

/// The generation records are appended to.
struct Current {
    file: MappedFile,
    generation: Arc<Generation>,
}

thread_local! {
    /// A record framed outside the log's lock (the lock covers only its copy into the file).
    static FRAMED: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// The in-flight log of one process (the journal directory's lock holder).
pub struct InflightLog {
    dir: PathBuf,
    current: Mutex<Current>,
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
        let current = open_generation(&dir, next, 0)?;
        Ok((
            Self {
                dir,
                current: Mutex::new(current),
            },
            recovered.events(),
        ))
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
        let generation = match self.append(&entry) {
            Ok(current) => {
                current.generation.open.fetch_add(1, Ordering::AcqRel);
                Some(current.generation.clone())
            }
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

    /// Appends a record, opening the next generation when it does not fit; returns the lock, so
    /// that a start is counted in the generation it landed in.
    fn append(&self, entry: &Entry<'_>) -> io::Result<std::sync::MutexGuard<'_, Current>> {
        FRAMED.with_borrow_mut(|framed| {
            framed.clear();
            record::frame_into(framed, |out| put_entry(out, entry));
            let mut current = self.lock()?;
            if !current.file.append(framed) {
                let next = current.generation.seq.saturating_add(1);
                let fresh = open_generation(&self.dir, next, framed.len())?;
                let old = std::mem::replace(&mut *current, fresh);
                retire(&old.generation);
                if !current.file.append(framed) {
                    return Err(io::Error::other(
                        "in-flight record larger than its generation",
                    ));
                }
            }
            Ok(current)
        })
    }

    fn end(&self, id: Uuid, generation: &Arc<Generation>) {
        // The append's lock, kept to read which generation is current if this was the last.
        let current = self.append(&Entry::End { id }).or_else(|e| {
            tracing::warn!(error = %e, request_id = %id, "in-flight end not written");
            self.lock()
        });
        if generation.open.fetch_sub(1, Ordering::AcqRel) == 1 {
            let current = current.map_or(u64::MAX, |c| c.generation.seq);
            if generation.seq < current {
                retire(generation);
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
    /// last progress (never fsynced).
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
        if let Err(e) = self.log.append(&entry) {
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

/// A new generation file with room for at least `need` bytes.
fn open_generation(dir: &Path, seq: u64, need: usize) -> io::Result<Current> {
    let path = path(dir, seq);
    Ok(Current {
        file: MappedFile::create(&path, GENERATION_BYTES.max(need))?,
        generation: Arc::new(Generation {
            seq,
            path,
            open: AtomicU64::new(0),
        }),
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

    /// Every record is in the file the moment it is made: a crash right after an end or a
    /// progress (no clean stop, nothing flushed) recovers by them.
    #[test]
    fn ends_and_progress_are_in_the_file_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b, c) = (started(1), started(2), started(3));
        {
            let (log, _) = InflightLog::open(dir.path()).unwrap();
            let log = Arc::new(log);
            drop(log.start(&a, 1));
            let mut tb = log.start(&b, 2);
            tb.last = Instant::now() - PROGRESS_EVERY;
            tb.progress(|| Progress {
                prompt: Some(30),
                cached: None,
                completion: 12,
            });
            let tc = log.start(&c, 3);
            drop(tc);
            // A crash: `b` never ends, and the log is not dropped.
            std::mem::forget(tb);
            std::mem::forget(log);
        }
        let (_, recovered) = InflightLog::open(dir.path()).unwrap();
        let got: Vec<_> = recovered
            .iter()
            .map(|e| (e.request_id, e.prompt_tokens, e.completion_tokens))
            .collect();
        assert_eq!(got, vec![(b.request_id, 30, 12)]);
    }

    #[test]
    fn a_torn_tail_loses_only_the_torn_record() {
        let (dir, torn) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let a = started(1);
        let (log, _) = InflightLog::open(dir.path()).unwrap();
        let log = Arc::new(log);
        std::mem::forget(log.start(&a, 5));
        std::mem::forget(log.start(&started(2), 6));
        // What a crash three bytes short of the second start's end leaves (a copy: the file
        // itself is not changed while it is mapped).
        let written = log.lock().unwrap().file.written();
        let bytes = fs::read(path(&dir.path().join("inflight"), 0)).unwrap();
        fs::create_dir_all(torn.path().join("inflight")).unwrap();
        fs::write(
            path(&torn.path().join("inflight"), 0),
            &bytes[..written - 3],
        )
        .unwrap();
        let (_, recovered) = InflightLog::open(torn.path()).unwrap();
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
        while log.lock().unwrap().generation.seq == 0 {
            drop(log.start(&filler, 1));
        }
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
