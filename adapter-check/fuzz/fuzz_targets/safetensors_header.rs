//! The safetensors header reader on arbitrary bytes: it may accept or refuse, never panic, and it
//! never reads past the bounded header it accepts, whatever length the file claims.
#![no_main]

use std::io::Read;

use libfuzzer_sys::fuzz_target;
use tf_adapter_check::safetensors::{read_header, MAX_HEADER_BYTES};

/// A reader that counts what is taken from it.
struct Counting<'a> {
    inner: &'a [u8],
    taken: u64,
}

impl Read for Counting<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.taken += n as u64;
        Ok(n)
    }
}

fuzz_target!(|data: &[u8]| {
    let mut reader = Counting {
        inner: data,
        taken: 0,
    };
    let header = read_header(&mut reader, data.len() as u64);
    assert!(reader.taken <= 8 + MAX_HEADER_BYTES);
    if let Ok(header) = header {
        // An accepted header describes exactly the bytes after it.
        let end = header
            .tensors
            .iter()
            .map(|(_, t)| t.data_offsets[1])
            .max()
            .unwrap_or(0);
        assert_eq!(end, header.data_bytes);
    }
});
