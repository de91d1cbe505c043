//! A client's SSE reader, written apart from the gateway's parser so a test checks the gateway's
//! output against the spec, not against itself: lines end in `\r\n`, `\n` or a lone `\r`; a blank
//! line ends an event; its `data:` lines are joined with `\n`.

/// Reads events as bytes arrive; [`Reader::data`] holds the `data` of every complete event.
#[derive(Default)]
pub struct Reader {
    line: Vec<u8>,
    data: Option<Vec<u8>>,
    /// The last byte was a `\r` (a `\n` next is part of the same line end).
    after_cr: bool,
    pub events: Vec<String>,
}

impl Reader {
    pub fn push(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if self.after_cr {
                self.after_cr = false;
                if b == b'\n' {
                    continue;
                }
            }
            match b {
                b'\r' | b'\n' => {
                    self.after_cr = b == b'\r';
                    self.end_line();
                }
                _ => self.line.push(b),
            }
        }
    }

    fn end_line(&mut self) {
        let line = std::mem::take(&mut self.line);
        if line.is_empty() {
            if let Some(d) = self.data.take() {
                self.events.push(String::from_utf8(d).unwrap());
            }
            return;
        }
        let value = match line.strip_prefix(b"data") {
            Some(rest) if rest.is_empty() => Some(rest),
            Some(rest) if rest[0] == b':' => {
                Some(rest[1..].strip_prefix(b" ").unwrap_or(&rest[1..]))
            }
            _ => None,
        };
        if let Some(v) = value {
            let d = self.data.get_or_insert_with(Vec::new);
            if !d.is_empty() {
                d.push(b'\n');
            }
            d.extend_from_slice(v);
        }
    }

    /// The body ended: an event whose blank line never came still counts.
    pub fn finish(&mut self) {
        if !self.line.is_empty() {
            self.end_line();
        }
        self.end_line();
    }
}

#[test]
fn reads_every_line_ending() {
    for input in [
        "data: a\n\n: c\n\ndata: b\ndata: c\n\n",
        "data: a\r\n\r\n: c\r\n\r\ndata: b\r\ndata: c\r\n\r\n",
        "data: a\r\r: c\r\rdata: b\rdata: c\r\r",
    ] {
        let mut r = Reader::default();
        for b in input.as_bytes() {
            r.push(&[*b]);
        }
        r.finish();
        assert_eq!(r.events, ["a", "b\nc"], "{input:?}");
    }
}
