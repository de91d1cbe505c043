//! An append-only file written through a shared mapping: the journal's segments and the in-flight
//! log's generations. An append is a copy into the page cache, where a crash of this process
//! cannot lose it (as after a `write`), without a system call per request (issue 35: these two
//! `write`s were the request path's only system calls beyond its two sockets). `fdatasync` on the
//! file makes the mapped pages durable as it does written ones.
//!
//! The file's blocks are reserved when it is created, so the unused tail reads as zeros: a
//! record header of length zero, which [`super::record::unframe`] refuses, so a reader stops
//! there as at a torn record.
#![allow(unsafe_code)]

use std::fs::{File, OpenOptions};
use std::io;
use std::path::Path;

use memmap2::{MmapMut, MmapOptions};

/// A mapped file and how much of it holds records.
pub struct MappedFile {
    map: MmapMut,
    len: usize,
    file: File,
}

impl MappedFile {
    /// Creates `path`, which must not exist, with `capacity` bytes reserved on disk and mapped.
    pub fn create(path: &Path, capacity: usize) -> io::Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)?;
        // A file left half made would refuse the next attempt at its name (`create_new`).
        let made = reserve(&file, capacity as u64).and_then(|()| map(&file, capacity));
        if made.is_err() {
            let _ = std::fs::remove_file(path);
        }
        Ok(Self {
            map: made?,
            len: 0,
            file,
        })
    }

    /// The file, to `fdatasync` (through a clone for a thread of its own).
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Unmaps the file and cuts its unused reserved tail, so its length is its records' again.
    pub fn trim(self) -> io::Result<()> {
        let Self { map, len, file } = self;
        // Unmapped first: a mapped file must not shrink under its mapping.
        drop(map);
        file.set_len(len as u64)
    }

    /// Copies `bytes` after what was appended; `false`, with nothing written, if they do not fit.
    pub fn append(&mut self, bytes: &[u8]) -> bool {
        let end = self.len + bytes.len();
        let Some(free) = self.map.get_mut(self.len..end) else {
            return false;
        };
        free.copy_from_slice(bytes);
        self.len = end;
        true
    }

    /// Bytes appended.
    pub fn written(&self) -> usize {
        self.len
    }
}

/// Maps a file [`MappedFile::create`] has just made and reserved.
fn map(file: &File, len: usize) -> io::Result<MmapMut> {
    // SAFETY: a mapped file is unsound only if something else changes or truncates it while it
    // is mapped. This file is new (`create_new`), in the journal directory whose lock this
    // process holds (`Journal::open`); nothing in the process writes or truncates it while it is
    // mapped (recovery reads only the files of earlier processes, the shipper only reads, and
    // `trim` unmaps before it cuts). A store to it cannot fault on a full disk: its blocks were
    // reserved before it was mapped.
    unsafe { MmapOptions::new().len(len).map_mut(file) }
}

/// Allocates the file's first `len` bytes on disk. A file system without `fallocate` gets a
/// sparse file of that length instead (a store to it can then fault if the disk fills).
fn reserve(file: &File, len: u64) -> io::Result<()> {
    match rustix::fs::fallocate(file, rustix::fs::FallocateFlags::empty(), 0, len) {
        Ok(()) => Ok(()),
        Err(e) if e == rustix::io::Errno::OPNOTSUPP => file.set_len(len),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A new mapped file of `capacity` bytes in a directory of its own, and its path.
    fn new_log(capacity: usize) -> (tempfile::TempDir, std::path::PathBuf, MappedFile) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let map = MappedFile::create(&path, capacity).unwrap();
        (dir, path, map)
    }

    #[test]
    fn appends_are_in_the_file_at_once_and_the_rest_reads_as_zeros() {
        let (_dir, path, mut map) = new_log(16);
        assert!(map.append(b"abc"));
        assert!(map.append(b"defg"));
        // Read through another handle while still mapped: what a crash would leave.
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[..7], b"abcdefg");
        assert!(bytes[7..].iter().all(|b| *b == 0));
        assert_eq!(bytes.len(), 16);
        // A record that does not fit is not written at all.
        assert!(!map.append(&[1; 10]));
        assert_eq!(map.written(), 7);
        assert!(map.append(&[1; 9]));
        assert!(!map.append(b"x"));
        // The file is new, never one that exists.
        assert!(MappedFile::create(&path, 16).is_err());
    }

    /// Trimmed, the file holds its records and nothing after them.
    #[test]
    fn a_trimmed_file_is_its_records() {
        let (_dir, path, mut map) = new_log(4096);
        assert!(map.append(b"abc"));
        map.file().sync_data().unwrap();
        map.trim().unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"abc");
    }

    /// A file that could not be reserved or mapped is not left behind to refuse the retry.
    #[test]
    fn a_file_that_cannot_be_made_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        // More than any disk here holds, and more than the address space maps.
        assert!(MappedFile::create(&path, 1 << 50).is_err());
        assert!(!path.exists());
        assert!(MappedFile::create(&path, 16).is_ok());
    }
}
