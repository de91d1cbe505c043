//! Recognising PyTorch pickles by their real formats, so a weights file that would run code when
//! loaded is refused with that reason: a `torch.save` zip archive (magic `PK\x03\x04`, the format
//! since PyTorch 1.6) or a raw pickle (opcode `PROTO` 0x80 then a protocol 2 to 5, the legacy
//! format). Never by one byte: a safetensors file starts with its header's length, whose low byte
//! can be anything (0x80 for about 1 adapter in 32), so a file whose first 8 bytes are a plausible
//! safetensors header length followed by `{` is a safetensors file, whatever its first byte.

use crate::safetensors::MAX_HEADER_BYTES;

/// Which pickle format a file is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pickle {
    /// A `torch.save` zip archive (data.pkl inside).
    Zip,
    /// A raw pickle of this protocol.
    Raw(u8),
}

/// Whether `head` (the file's first bytes: at least 9 when the file has them) starts like a
/// safetensors file of `file_len` bytes: a header length the reference parser accepts, that fits
/// the file, and a header that opens with `{`.
pub fn plausible_safetensors(head: &[u8], file_len: u64) -> bool {
    let Some(prefix) = head.get(..8).and_then(|p| <[u8; 8]>::try_from(p).ok()) else {
        return false;
    };
    let n = u64::from_le_bytes(prefix);
    (2..=MAX_HEADER_BYTES).contains(&n)
        && n <= file_len.saturating_sub(8)
        && head.get(8) == Some(&b'{')
}

/// The pickle format `head` is in, if it is one and not a plausible safetensors file.
pub fn sniff(head: &[u8], file_len: u64) -> Option<Pickle> {
    if plausible_safetensors(head, file_len) {
        return None;
    }
    if head.starts_with(b"PK\x03\x04") {
        return Some(Pickle::Zip);
    }
    match head {
        [0x80, proto @ 2..=5, ..] => Some(Pickle::Raw(*proto)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A safetensors start whose header is `n` bytes, in a file long enough for it.
    fn safetensors_head(n: u64) -> (Vec<u8>, u64) {
        let mut head = n.to_le_bytes().to_vec();
        head.push(b'{');
        (head, 8 + n)
    }

    #[test]
    fn a_safetensors_length_starting_with_any_byte_is_not_a_pickle() {
        for low in 0u64..=255 {
            // Every low byte, with 0x02..0x05 above it too (the pickle protocol byte).
            for high in [0u64, 2, 3, 5] {
                let n = (high << 8) | low;
                if n < 2 {
                    continue;
                }
                let (head, len) = safetensors_head(n);
                assert_eq!(sniff(&head, len), None, "length {n:#x}");
            }
        }
    }

    #[test]
    fn real_pickles_are_recognised() {
        // torch.save's legacy format: PROTO 2 then the rest of a pickle.
        let raw = b"\x80\x02}q\x00(X\x01\x00\x00\x00aq\x01K\x01u.";
        assert_eq!(sniff(raw, raw.len() as u64), Some(Pickle::Raw(2)));
        let p5 = b"\x80\x05\x95\x10\x00\x00\x00\x00\x00\x00\x00}";
        assert_eq!(sniff(p5, 4096), Some(Pickle::Raw(5)));
        let zip = b"PK\x03\x04\x14\x00\x00\x00\x08\x00archive/data.pkl";
        assert_eq!(sniff(zip, 1 << 20), Some(Pickle::Zip));
        // 0x80 then a byte that is no protocol: not called a pickle (the parser judges it).
        assert_eq!(sniff(b"\x80\x09garbage", 100), None);
        // A pickle-shaped start whose length fits and is followed by `{`: safetensors.
        let (head, len) = safetensors_head(0x0280);
        assert_eq!(head[..2], [0x80, 0x02]);
        assert_eq!(sniff(&head, len), None);
        // The same start in a file too short for that header: a pickle.
        assert_eq!(sniff(&head, 100), Some(Pickle::Raw(2)));
    }
}
