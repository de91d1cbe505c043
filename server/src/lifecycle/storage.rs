//! Where adapter files are kept: a local directory by default (`--adapter-dir`), one folder per
//! adapter version. Uploads are streamed to disk with a byte limit, never held whole in memory;
//! a partial file is removed when the stream fails or runs over.

use std::path::{Path, PathBuf};

use bytes::Bytes;
use futures::{Stream, StreamExt};
use tokio::io::AsyncWriteExt;

/// Why a file could not be stored.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{file} is larger than the {limit}-byte limit")]
    TooLarge { file: &'static str, limit: u64 },
    #[error("the upload of {file} was interrupted: {reason}")]
    Interrupted { file: &'static str, reason: String },
    #[error("storage error: {0}")]
    Io(#[from] std::io::Error),
}

/// The local adapter store.
#[derive(Debug, Clone)]
pub struct AdapterStore {
    root: PathBuf,
}

impl AdapterStore {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The folder of one adapter version; `key` is made of ids only (never a tenant's text).
    pub fn dir(&self, key: &str) -> PathBuf {
        self.root.join(key)
    }

    /// The URI the fleet is given (`file:///...`).
    pub fn uri(&self, key: &str) -> String {
        format!("file://{}/", self.dir(key).display())
    }

    /// The folder a `file://` URI of this store names.
    pub fn dir_of_uri(uri: &str) -> Option<PathBuf> {
        uri.strip_prefix("file://").map(PathBuf::from)
    }

    /// Streams `body` into `key/file`, at most `limit` bytes; returns the size written.
    pub async fn write<E: std::fmt::Display>(
        &self,
        key: &str,
        file: &'static str,
        mut body: impl Stream<Item = Result<Bytes, E>> + Unpin,
        limit: u64,
    ) -> Result<u64, StoreError> {
        let dir = self.dir(key);
        tokio::fs::create_dir_all(&dir).await?;
        let path = dir.join(file);
        let mut out = tokio::fs::File::create(&path).await?;
        let mut written = 0u64;
        let result = async {
            while let Some(chunk) = body.next().await {
                let chunk = chunk.map_err(|e| StoreError::Interrupted {
                    file,
                    reason: e.to_string(),
                })?;
                written += chunk.len() as u64;
                if written > limit {
                    return Err(StoreError::TooLarge { file, limit });
                }
                out.write_all(&chunk).await?;
            }
            out.flush().await?;
            out.sync_all().await?;
            Ok(written)
        }
        .await;
        if result.is_err() {
            drop(out);
            let _ = tokio::fs::remove_file(&path).await;
        }
        result
    }

    /// Removes an adapter version's folder; one already gone is removed.
    pub async fn remove_dir(dir: &Path) -> std::io::Result<()> {
        match tokio::fs::remove_dir_all(dir).await {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}
