//! The engine's side of a raw HTTP/1.1 connection, for tests that must control every byte the
//! gateway receives.

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// Reads one request head and its `content-length` body; returns the head, lower-cased, or
/// `None` at end-of-file.
pub async fn read_request(tcp: &mut TcpStream) -> Option<String> {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        match tcp.read(&mut byte).await {
            Ok(1) => buf.push(byte[0]),
            _ => return None,
        }
    }
    let head = String::from_utf8_lossy(&buf).to_ascii_lowercase();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    tcp.read_exact(&mut body).await.ok()?;
    Some(head)
}
