//! Segment files and the shipper's cursor: naming, listing, reading records from an offset, and
//! finding where the valid part of a segment ends (to cut a torn tail before appending again).

use std::fs;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use super::record::{self, Decoded};
use crate::usage::UsageEvent;

const SUFFIX: &str = ".journal";
const CURSOR: &str = "cursor";

pub fn path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("{seq:016}{SUFFIX}"))
}

/// Sequence numbers of the segments present, ascending.
pub fn list(dir: &Path) -> io::Result<Vec<u64>> {
    let mut seqs: Vec<u64> = fs::read_dir(dir)?
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.strip_suffix(SUFFIX)?.parse().ok())
        .collect();
    seqs.sort_unstable();
    Ok(seqs)
}

/// Where the shipper is: everything before (segment, offset) is in PostgreSQL.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Cursor {
    pub seq: u64,
    pub offset: u64,
}

pub fn read_cursor(dir: &Path) -> io::Result<Cursor> {
    match fs::read_to_string(dir.join(CURSOR)) {
        Ok(text) => {
            let mut parts = text.split_whitespace().map(str::parse::<u64>);
            match (parts.next(), parts.next()) {
                (Some(Ok(seq)), Some(Ok(offset))) => Ok(Cursor { seq, offset }),
                _ => Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "journal cursor is unreadable",
                )),
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Cursor::default()),
        Err(e) => Err(e),
    }
}

/// Replaces the cursor atomically. Not fsynced: a cursor that goes back after a power loss only
/// re-ships events PostgreSQL already has, and those are absorbed by the primary key.
pub fn write_cursor(dir: &Path, cursor: Cursor) -> io::Result<()> {
    let tmp = dir.join("cursor.tmp");
    fs::write(&tmp, format!("{} {}\n", cursor.seq, cursor.offset))?;
    fs::rename(tmp, dir.join(CURSOR))
}

/// What reading a segment from an offset found.
pub struct Batch {
    pub events: Vec<UsageEvent>,
    /// Offset just past the last whole record read.
    pub end: u64,
    /// True when reading stopped at bytes that are not a valid record (not just the end).
    pub corrupt: bool,
}

/// Where segment `seq`'s records end if it is the writer's (`active`, from
/// [`super::JournalMetrics::active_segment`]): its file runs on into its reserved tail. `None`
/// for any other segment, whose file ends with its records.
pub fn records_end(seq: u64, active: Option<(u64, u64)>) -> Option<u64> {
    active.and_then(|(active, len)| (active == seq).then_some(len))
}

/// Reads up to `max` records from `offset`, at most `max_bytes` and never past `end` (see
/// [`records_end`]: the writer's segment is read up to its records, not into its zeros).
pub fn read_from(
    path: &Path,
    offset: u64,
    max: usize,
    max_bytes: usize,
    end: Option<u64>,
) -> io::Result<Batch> {
    let mut file = fs::File::open(path)?;
    file.seek(SeekFrom::Start(offset))?;
    let mut buf = Vec::new();
    let max_bytes = end.map_or(max_bytes as u64, |end| {
        end.saturating_sub(offset).min(max_bytes as u64)
    });
    file.take(max_bytes).read_to_end(&mut buf)?;
    let mut at = 0usize;
    let mut events = Vec::new();
    let mut corrupt = false;
    while events.len() < max {
        match record::decode(&buf[at..]) {
            Decoded::Record { event, len } => {
                events.push(*event);
                at += len;
            }
            Decoded::Incomplete => break,
            Decoded::Corrupt => {
                corrupt = true;
                break;
            }
        }
    }
    Ok(Batch {
        events,
        end: offset + at as u64,
        corrupt,
    })
}

/// Length of the valid prefix of a segment (everything after it is a torn or corrupt tail).
pub fn valid_len(path: &Path) -> io::Result<u64> {
    Ok(valid_prefix(&fs::read(path)?) as u64)
}

/// Length of the whole records at the start of a segment's bytes.
pub fn valid_prefix(buf: &[u8]) -> usize {
    let mut at = 0usize;
    while let Decoded::Record { len, .. } = record::decode(&buf[at..]) {
        at += len;
    }
    at
}

/// Bytes in the segments at or after the cursor that PostgreSQL has not acknowledged. `active`
/// is the writer's segment and the length of its records
/// ([`super::JournalMetrics::active_segment`]): that file's own length counts its reserved tail.
pub fn backlog_bytes(dir: &Path, cursor: Cursor, active: Option<(u64, u64)>) -> io::Result<u64> {
    let mut total = 0;
    for seq in list(dir)? {
        if seq < cursor.seq {
            continue;
        }
        let len = match records_end(seq, active) {
            Some(end) => end,
            None => fs::metadata(path(dir, seq))?.len(),
        };
        total += if seq == cursor.seq {
            len.saturating_sub(cursor.offset)
        } else {
            len
        };
    }
    Ok(total)
}
