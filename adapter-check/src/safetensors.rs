//! Reading a safetensors header from an untrusted upload. Memory is bounded by the header size we
//! accept ([`MAX_HEADER_BYTES`]), never by the file's size; the length prefix is compared with the
//! file's real length before a byte of the header is read. The rules are the reference parser's:
//! header starts with `{` (trailing spaces allowed), known dtypes, no duplicate names, offsets
//! relative to the data buffer, tensors contiguous with no gap or overlap and covering the buffer
//! exactly, and each tensor's byte length equal to its element count times its dtype's size.

use std::collections::HashSet;
use std::fmt;
use std::io::Read;

use ::safetensors::tensor as st;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;

use crate::rejection::Rejection;

/// The largest header accepted. The reference parser allows 100 MB; a LoRA adapter of a 70B base
/// with every projection targeted has about 1,100 tensors, some 200 KB of header, so 16 MiB is
/// generous and keeps one validation's memory small.
pub const MAX_HEADER_BYTES: u64 = 16 << 20;

/// An element type and its size in bytes. Spelled as in the file format (`F8_E4M3`).
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum Dtype {
    BOOL,
    U8,
    I8,
    I16,
    U16,
    F16,
    BF16,
    I32,
    U32,
    F32,
    F64,
    I64,
    U64,
    F8_E4M3,
    F8_E5M2,
}

impl Dtype {
    pub fn size(self) -> u64 {
        match self {
            Dtype::BOOL | Dtype::U8 | Dtype::I8 | Dtype::F8_E4M3 | Dtype::F8_E5M2 => 1,
            Dtype::I16 | Dtype::U16 | Dtype::F16 | Dtype::BF16 => 2,
            Dtype::I32 | Dtype::U32 | Dtype::F32 => 4,
            Dtype::F64 | Dtype::I64 | Dtype::U64 => 8,
        }
    }

    /// The crate's dtype as one of ours; `None` for the types an adapter never carries (sub-byte,
    /// FNUZ, complex).
    fn from_crate(dtype: st::Dtype) -> Option<Self> {
        Some(match dtype {
            st::Dtype::BOOL => Dtype::BOOL,
            st::Dtype::U8 => Dtype::U8,
            st::Dtype::I8 => Dtype::I8,
            st::Dtype::I16 => Dtype::I16,
            st::Dtype::U16 => Dtype::U16,
            st::Dtype::F16 => Dtype::F16,
            st::Dtype::BF16 => Dtype::BF16,
            st::Dtype::I32 => Dtype::I32,
            st::Dtype::U32 => Dtype::U32,
            st::Dtype::F32 => Dtype::F32,
            st::Dtype::F64 => Dtype::F64,
            st::Dtype::I64 => Dtype::I64,
            st::Dtype::U64 => Dtype::U64,
            st::Dtype::F8_E4M3 => Dtype::F8_E4M3,
            st::Dtype::F8_E5M2 => Dtype::F8_E5M2,
            _ => return None,
        })
    }

    /// The float types an engine loads LoRA weights in.
    pub fn is_float_weight(self) -> bool {
        matches!(self, Dtype::F16 | Dtype::BF16 | Dtype::F32)
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// One tensor's entry in the header.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TensorInfo {
    pub dtype: Dtype,
    pub shape: Vec<u64>,
    pub data_offsets: [u64; 2],
}

/// A validated header: tensors by name, in data-offset order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub tensors: Vec<(String, TensorInfo)>,
    /// Bytes of tensor data after the header.
    pub data_bytes: u64,
}

/// Reads and validates the header of a file of `file_len` bytes from `reader` (positioned at the
/// start). Only the header is read; the data is checked by its offsets. Parsing each entry and the
/// layout check (contiguous offsets, sizes from shape and dtype, overflow) are the `safetensors`
/// crate's (`TensorInfo`, `Metadata::new`); its `read_metadata` wants the whole file in memory, so
/// the length checks it would make against the buffer are made here against `file_len` instead.
pub fn read_header(mut reader: impl Read, file_len: u64) -> Result<Header, Rejection> {
    if file_len < 8 {
        return Err(Rejection::Format(
            "file is shorter than the 8-byte header length".into(),
        ));
    }
    let mut prefix = [0u8; 8];
    reader
        .read_exact(&mut prefix)
        .map_err(|e| Rejection::Format(format!("cannot read the header length: {e}")))?;
    let header_len = u64::from_le_bytes(prefix);
    if header_len > MAX_HEADER_BYTES {
        return Err(Rejection::Format(format!(
            "header of {header_len} bytes is larger than the {MAX_HEADER_BYTES} accepted"
        )));
    }
    if header_len > file_len - 8 {
        return Err(Rejection::Format(format!(
            "header length {header_len} runs past the end of a {file_len}-byte file"
        )));
    }
    let mut text = Vec::with_capacity(usize::try_from(header_len).unwrap_or(0));
    reader
        .take(header_len)
        .read_to_end(&mut text)
        .map_err(|e| Rejection::Format(format!("cannot read the header: {e}")))?;
    let text =
        std::str::from_utf8(&text).map_err(|_| Rejection::Format("header is not UTF-8".into()))?;
    if !text.starts_with('{') {
        return Err(Rejection::Format("header does not start with '{'".into()));
    }
    let Entries(mut entries) = serde_json::from_str(text.trim_end_matches(' '))
        .map_err(|e| Rejection::Format(format!("header is not a valid tensor table: {e}")))?;
    entries.sort_by_key(|(_, t)| t.data_offsets);
    let metadata = st::Metadata::new(None, entries.clone())
        .map_err(|e| Rejection::Format(layout_reason(&e, &entries)))?;
    let data_bytes = file_len - 8 - header_len;
    let covered = metadata.data_len() as u64;
    if covered != data_bytes {
        return Err(Rejection::Format(format!(
            "tensors cover {covered} bytes of a {data_bytes}-byte data buffer"
        )));
    }
    let tensors = entries
        .into_iter()
        .map(|(name, t)| {
            let dtype = Dtype::from_crate(t.dtype).ok_or_else(|| {
                Rejection::Format(format!(
                    "tensor {name}: dtype {:?} is not accepted",
                    t.dtype
                ))
            })?;
            let info = TensorInfo {
                dtype,
                shape: t.shape.iter().map(|d| *d as u64).collect(),
                data_offsets: [t.data_offsets.0 as u64, t.data_offsets.1 as u64],
            };
            Ok((name, info))
        })
        .collect::<Result<Vec<_>, Rejection>>()?;
    Ok(Header {
        tensors,
        data_bytes,
    })
}

/// A precise reason for the crate's layout refusal, naming the tensor at fault (the crate's
/// `TensorInvalidInfo` does not say which one).
fn layout_reason(error: &st::SafeTensorError, sorted: &[(String, st::TensorInfo)]) -> String {
    let mut next = 0usize;
    for (name, t) in sorted {
        let (begin, end) = t.data_offsets;
        if begin != next || end < begin {
            return format!("tensor {name} starts at {begin}, expected {next} (gap or overlap)");
        }
        let bytes = t
            .shape
            .iter()
            .try_fold(1usize, |acc, d| acc.checked_mul(*d))
            .and_then(|n| n.checked_mul(t.dtype.bitsize()))
            .map(|bits| bits / 8);
        if bytes != Some(end - begin) {
            return format!(
                "tensor {name}: {} bytes for shape {:?} of {:?}",
                end - begin,
                t.shape,
                t.dtype
            );
        }
        next = end;
    }
    format!("invalid tensor layout: {error}")
}

/// The header's tensor entries, refusing duplicate names (the crate reads the table into a
/// `HashMap`, which would silently keep the last one) and fields the format does not have, and
/// skipping `__metadata__`. Each entry is the crate's `TensorInfo`.
struct Entries(Vec<(String, st::TensorInfo)>);

/// The fields of one tensor entry; anything else is refused.
const ENTRY_FIELDS: [&str; 3] = ["dtype", "shape", "data_offsets"];

impl<'de> Deserialize<'de> for Entries {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct EntriesVisitor;
        impl<'de> Visitor<'de> for EntriesVisitor {
            type Value = Entries;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map of tensor names to {dtype, shape, data_offsets}")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Entries, A::Error> {
                let mut seen = HashSet::new();
                let mut out = Vec::new();
                while let Some(name) = map.next_key::<String>()? {
                    if !seen.insert(name.clone()) {
                        return Err(de::Error::custom(format!("duplicate tensor name {name}")));
                    }
                    if name == "__metadata__" {
                        map.next_value::<std::collections::BTreeMap<String, String>>()?;
                        continue;
                    }
                    let value = map.next_value::<serde_json::Map<String, serde_json::Value>>()?;
                    if let Some(field) = value.keys().find(|k| !ENTRY_FIELDS.contains(&k.as_str()))
                    {
                        return Err(de::Error::custom(format!(
                            "tensor {name}: unknown field {field}"
                        )));
                    }
                    let info = serde_json::from_value::<st::TensorInfo>(value.into())
                        .map_err(de::Error::custom)?;
                    out.push((name, info));
                }
                Ok(Entries(out))
            }
        }
        deserializer.deserialize_map(EntriesVisitor)
    }
}

/// Builds a safetensors file (header and zeroed data) for tests and fixtures.
pub fn encode(tensors: &[(&str, Dtype, &[u64])]) -> Vec<u8> {
    let mut offset = 0u64;
    let mut entries = serde_json::Map::new();
    for (name, dtype, shape) in tensors {
        let len = shape.iter().product::<u64>() * dtype.size();
        entries.insert(
            (*name).to_string(),
            serde_json::json!({
                "dtype": dtype.to_string(),
                "shape": shape,
                "data_offsets": [offset, offset + len],
            }),
        );
        offset += len;
    }
    let header = serde_json::Value::Object(entries).to_string();
    let mut out = Vec::new();
    out.extend_from_slice(&(header.len() as u64).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.resize(out.len() + usize::try_from(offset).unwrap_or(0), 0);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(bytes: &[u8]) -> Result<Header, Rejection> {
        read_header(bytes, bytes.len() as u64)
    }

    fn with_header(header: &str, data: usize) -> Vec<u8> {
        let mut out = (header.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(header.as_bytes());
        out.resize(out.len() + data, 0);
        out
    }

    fn reason(r: Result<Header, Rejection>) -> String {
        match r {
            Ok(h) => format!("accepted {h:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn a_well_formed_file_is_read_in_order() {
        let bytes = encode(&[("a", Dtype::F16, &[2, 3]), ("b", Dtype::F32, &[4])]);
        let header = read(&bytes).map_err(|e| e.to_string());
        let header = header.as_ref().map(|h| (h.tensors.len(), h.data_bytes));
        assert_eq!(header, Ok((2, 28)));
    }

    #[test]
    fn the_length_prefix_is_checked_before_reading() {
        let mut bytes = 1_000_000u64.to_le_bytes().to_vec();
        bytes.extend_from_slice(b"{}");
        assert!(reason(read(&bytes)).contains("runs past the end"));
        let huge = (MAX_HEADER_BYTES + 1).to_le_bytes();
        // A claimed length above the cap is refused even when the file says it is that long.
        assert!(reason(read_header(&huge[..], u64::MAX)).contains("larger than"));
        assert!(reason(read(&[1, 2, 3])).contains("shorter"));
    }

    #[test]
    fn layout_rules_of_the_reference_parser() {
        let gap = r#"{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[3,5]}}"#;
        assert!(reason(read(&with_header(gap, 5))).contains("gap or overlap"));
        let overlap = r#"{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}}"#;
        assert!(reason(read(&with_header(overlap, 3))).contains("gap or overlap"));
        let trailing = r#"{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}"#;
        assert!(reason(read(&with_header(trailing, 3))).contains("cover 2 bytes of a 3-byte"));
        let size = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,2]}}"#;
        assert!(reason(read(&with_header(size, 2))).contains("2 bytes for shape [2] of F32"));
        let overflow =
            r#"{"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,2]}}"#;
        assert!(reason(read(&with_header(overflow, 2))).contains("bytes for shape"));
    }

    #[test]
    fn malformed_headers_are_refused() {
        let dup = r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}"#;
        assert!(reason(read(&with_header(dup, 2))).contains("duplicate tensor name a"));
        let dtype = r#"{"a":{"dtype":"Q4","shape":[1],"data_offsets":[0,1]}}"#;
        assert!(reason(read(&with_header(dtype, 1))).contains("not a valid tensor table"));
        assert!(reason(read(&with_header(" {}", 0))).contains("does not start"));
        let extra = r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":1}}"#;
        assert!(reason(read(&with_header(extra, 1))).contains("not a valid tensor table"));
    }

    #[test]
    fn metadata_and_padding_are_allowed() {
        let header = r#"{"__metadata__":{"format":"pt"},"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}   "#;
        let read = read(&with_header(header, 1)).map(|h| h.tensors.len());
        assert_eq!(read.map_err(|e| e.to_string()), Ok(1));
    }
}
