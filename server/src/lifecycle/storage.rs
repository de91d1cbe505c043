//! Where adapter files are kept: one [`ObjectStore`], a local directory by default
//! (`--adapter-store`, default `.tokenfactory/adapters`) or an S3-compatible bucket
//! (`s3://bucket/prefix`, credentials, region and endpoint from the usual `AWS_*` variables, so a
//! MinIO-style store is `AWS_ENDPOINT=http://...` with `AWS_ALLOW_HTTP=true`). One key prefix per
//! adapter version: `<adapter id>/v<version>/<file>`; the fleet is given the version's URI
//! (`file:///dir/<id>/v<n>` or `s3://bucket/prefix/<id>/v<n>`).
//!
//! Uploads are streamed in parts (a multipart upload of [`AdapterStore::part_bytes`]-sized
//! parts), never held whole in memory: at most one part being filled and
//! [`PARTS_IN_FLIGHT`] being sent are buffered. An upload that fails or runs over its limit is
//! aborted and leaves no object behind. Reads are by byte range, so a validator reads the header
//! it bounds and nothing else.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use futures::{Stream, StreamExt, TryStreamExt};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, WriteMultipart};

/// Parts of one upload sent at the same time; more chunks wait until one is acknowledged.
pub const PARTS_IN_FLIGHT: usize = 2;
/// S3's smallest part (all but the last); also the default for the local directory.
pub const DEFAULT_PART_BYTES: usize = 5 << 20;

/// Why a file could not be stored or read.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{file} is larger than the {limit}-byte limit")]
    TooLarge { file: &'static str, limit: u64 },
    #[error("the upload of {file} was interrupted: {reason}")]
    Interrupted { file: &'static str, reason: String },
    /// The store is not configured correctly (start-up).
    #[error("adapter store {location}: {reason}")]
    Config { location: String, reason: String },
    #[error("storage error: {0}")]
    Object(#[from] object_store::Error),
    #[error("storage error: {0}")]
    Io(#[from] std::io::Error),
}

impl StoreError {
    /// The object does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::Object(object_store::Error::NotFound { .. }))
    }
}

impl From<StoreError> for std::io::Error {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Io(e) => e,
            other => std::io::Error::other(other.to_string()),
        }
    }
}

/// The adapter store: one object store and the URI of its root.
#[derive(Clone)]
pub struct AdapterStore {
    objects: Arc<dyn ObjectStore>,
    /// The root as the fleet reads it, without a trailing slash: `file:///abs/dir`,
    /// `s3://bucket/prefix`.
    root: String,
    part_bytes: usize,
    /// The directory of a local store: folders left empty by a delete or an aborted upload are
    /// removed (object stores have no folders; a directory does).
    local_dir: Option<PathBuf>,
}

impl std::fmt::Debug for AdapterStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdapterStore")
            .field("root", &self.root)
            .field("part_bytes", &self.part_bytes)
            .finish_non_exhaustive()
    }
}

impl AdapterStore {
    /// The store `location` names: `s3://bucket[/prefix]` (S3-compatible, configured from the
    /// `AWS_*` environment), `file:///dir` or a plain directory path (created if missing).
    pub fn open(location: &str) -> Result<Self, StoreError> {
        if location.starts_with("s3://") {
            Self::s3(location)
        } else if let Some(dir) = location.strip_prefix("file://") {
            Self::local(Path::new(dir))
        } else if location.contains("://") {
            Err(StoreError::Config {
                location: location.to_owned(),
                reason: "use a directory, file:///dir or s3://bucket/prefix".into(),
            })
        } else {
            Self::local(Path::new(location))
        }
    }

    /// A local directory (created if missing). Empty folders are removed with their last file.
    pub fn local(dir: &Path) -> Result<Self, StoreError> {
        private_dirs(dir)?;
        let dir = std::fs::canonicalize(dir)?;
        // INVARIANT: the store's root is 0700 and each upload's files 0600, so tenants' weights
        // are readable by this service's user alone (test: adapter_store, local files private).
        set_mode(&dir, 0o700)?;
        let objects = object_store::local::LocalFileSystem::new_with_prefix(&dir)?
            .with_automatic_cleanup(true);
        let root = format!("file://{}", dir.display());
        let mut store = Self::with_objects(Arc::new(objects), root);
        store.local_dir = Some(dir);
        Ok(store)
    }

    /// An S3-compatible bucket: `s3://bucket` or `s3://bucket/prefix`. Credentials, region and
    /// endpoint come from the environment (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
    /// `AWS_REGION`, `AWS_ENDPOINT`, `AWS_ALLOW_HTTP`, ...), as every S3 client reads them.
    pub fn s3(url: &str) -> Result<Self, StoreError> {
        let config = |reason: String| StoreError::Config {
            location: url.to_owned(),
            reason,
        };
        let rest = url
            .strip_prefix("s3://")
            .ok_or_else(|| config("not an s3:// URL".into()))?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(config("no bucket named".into()));
        }
        let s3 = object_store::aws::AmazonS3Builder::from_env()
            .with_bucket_name(bucket)
            .build()
            .map_err(|e| config(e.to_string()))?;
        let prefix = prefix.trim_matches('/');
        let root = if prefix.is_empty() {
            format!("s3://{bucket}")
        } else {
            format!("s3://{bucket}/{prefix}")
        };
        let objects: Arc<dyn ObjectStore> = if prefix.is_empty() {
            Arc::new(s3)
        } else {
            Arc::new(object_store::prefix::PrefixStore::new(s3, prefix))
        };
        Ok(Self::with_objects(objects, root))
    }

    /// Any object store, its root named `root` (tests: `object_store::memory::InMemory`).
    pub fn with_objects(objects: Arc<dyn ObjectStore>, root: impl Into<String>) -> Self {
        Self {
            objects,
            root: root.into().trim_end_matches('/').to_owned(),
            part_bytes: DEFAULT_PART_BYTES,
            local_dir: None,
        }
    }

    /// The same store with its object store wrapped by `wrap` (tests watch the calls this way).
    #[must_use]
    pub fn wrap_objects(
        &self,
        wrap: impl FnOnce(Arc<dyn ObjectStore>) -> Arc<dyn ObjectStore>,
    ) -> Self {
        Self {
            objects: wrap(self.objects.clone()),
            ..self.clone()
        }
    }

    /// Sends uploads in parts of `bytes` (tests use small parts to see an upload go in pieces).
    #[must_use]
    pub fn with_part_bytes(mut self, bytes: usize) -> Self {
        self.part_bytes = bytes.max(1);
        self
    }

    /// The object store underneath (tests wrap it to watch the calls).
    pub fn objects(&self) -> Arc<dyn ObjectStore> {
        self.objects.clone()
    }

    /// The size of the parts an upload is sent in.
    pub fn part_bytes(&self) -> usize {
        self.part_bytes
    }

    /// The URI of the store's root.
    pub fn root(&self) -> &str {
        &self.root
    }

    /// The URI of an adapter version's folder, as the fleet is given it; `key` is made of ids
    /// only (never a tenant's text).
    pub fn uri(&self, key: &str) -> String {
        format!("{}/{key}", self.root)
    }

    /// The key of a URI this store made, `None` for another store's (its root was moved).
    pub fn key_of_uri(&self, uri: &str) -> Option<String> {
        let key = uri.strip_prefix(&self.root)?.strip_prefix('/')?;
        let key = key.trim_matches('/');
        (!key.is_empty()).then(|| key.to_owned())
    }

    fn path(key: &str, file: &str) -> ObjectPath {
        ObjectPath::from(format!("{key}/{file}"))
    }

    /// Streams `body` into `key/file` in parts, at most `limit` bytes; returns the size written.
    /// On any failure the multipart upload is aborted, so no object (and no part) is left.
    pub async fn write<E: std::fmt::Display>(
        &self,
        key: &str,
        file: &'static str,
        mut body: impl Stream<Item = Result<Bytes, E>> + Unpin,
        limit: u64,
    ) -> Result<u64, StoreError> {
        if let Some(root) = &self.local_dir {
            // The key's folders are made private before a byte is written, so the file is never
            // readable by others, even while it is being written (object_store makes it 0644).
            private_dirs(&root.join(key))?;
        }
        let upload = self.objects.put_multipart(&Self::path(key, file)).await?;
        let mut writer = WriteMultipart::new_with_chunk_size(upload, self.part_bytes);
        let mut written = 0u64;
        let streamed = async {
            while let Some(chunk) = body.next().await {
                let chunk = chunk.map_err(|e| StoreError::Interrupted {
                    file,
                    reason: e.to_string(),
                })?;
                written += chunk.len() as u64;
                if written > limit {
                    return Err(StoreError::TooLarge { file, limit });
                }
                // INVARIANT: an upload buffers at most one part being filled plus
                // PARTS_IN_FLIGHT parts being sent (server/tests/integration/adapter_store.rs, parts bounded).
                writer.wait_for_capacity(PARTS_IN_FLIGHT).await?;
                writer.put(chunk);
            }
            Ok(())
        }
        .await;
        match streamed {
            Ok(()) => {
                writer.finish().await?;
                if let Some(root) = &self.local_dir {
                    set_mode(&root.join(key).join(file), 0o600)?;
                }
                Ok(written)
            }
            Err(e) => {
                if let Err(abort) = writer.abort().await {
                    tracing::warn!(error = %abort, key, file, "could not abort a failed upload");
                }
                Err(e)
            }
        }
    }

    /// The size of `key/file`.
    pub async fn size(&self, key: &str, file: &str) -> Result<u64, StoreError> {
        Ok(self.objects.head(&Self::path(key, file)).await?.size)
    }

    /// Bytes `range` of `key/file` (the range must lie within the object).
    pub async fn read_range(
        &self,
        key: &str,
        file: &str,
        range: Range<u64>,
    ) -> Result<Bytes, StoreError> {
        if range.is_empty() {
            return Ok(Bytes::new());
        }
        Ok(self
            .objects
            .get_range(&Self::path(key, file), range)
            .await?)
    }

    /// The whole of a small object, refused past `limit` bytes before a byte is read.
    pub async fn read_small(
        &self,
        key: &str,
        file: &'static str,
        limit: u64,
    ) -> Result<Bytes, StoreError> {
        let size = self.size(key, file).await?;
        if size > limit {
            return Err(StoreError::TooLarge { file, limit });
        }
        self.read_range(key, file, 0..size).await
    }

    /// Removes every object under `key` (an adapter version, or a whole adapter); removing what
    /// is already gone succeeds.
    pub async fn remove(&self, key: &str) -> Result<(), StoreError> {
        let prefix = ObjectPath::from(key);
        let listed: Vec<ObjectPath> = self
            .objects
            .list(Some(&prefix))
            .map_ok(|meta| meta.location)
            .try_collect()
            .await?;
        for location in listed {
            match self.objects.delete(&location).await {
                Err(object_store::Error::NotFound { .. }) | Ok(()) => {}
                Err(e) => return Err(e.into()),
            }
        }
        if let Some(dir) = &self.local_dir {
            let (root, folder) = (dir.clone(), dir.join(key));
            let tidy = move || {
                remove_empty_dirs(&folder);
                // Then the parents the key made, up to the store's root.
                let mut parent = folder.parent();
                while let Some(p) = parent.filter(|p| p.starts_with(&root) && *p != root) {
                    if std::fs::remove_dir(p).is_err() {
                        break;
                    }
                    parent = p.parent();
                }
            };
            tokio::task::spawn_blocking(tidy).await.ok();
        }
        Ok(())
    }

    /// Removes the version a URI of this store names.
    pub async fn remove_uri(&self, uri: &str) -> Result<(), StoreError> {
        match self.key_of_uri(uri) {
            Some(key) => self.remove(&key).await,
            None => Err(StoreError::Config {
                location: uri.to_owned(),
                reason: format!("not in this store ({})", self.root),
            }),
        }
    }

    /// Removes every version of an adapter, given the URI of one of them (`<root>/<id>/v<n>`).
    pub async fn remove_adapter(&self, uri: &str, adapter: &str) -> Result<(), StoreError> {
        match self.key_of_uri(uri) {
            Some(key) if key.split('/').next() == Some(adapter) => self.remove(adapter).await,
            _ => self.remove_uri(uri).await,
        }
    }
}

/// Removes `dir` and the folders under it that hold no file (best effort: a folder that is not
/// empty, or is gone, is left as it is).
fn remove_empty_dirs(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                remove_empty_dirs(&entry.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// Creates `dir` and its missing parents readable by this user only (0700).
fn private_dirs(dir: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
    }
    #[cfg(not(unix))]
    {
        std::fs::create_dir_all(dir)
    }
}

/// Sets a file's or folder's permission bits (no-op where there are none).
fn set_mode(path: &Path, mode: u32) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
    }
    #[cfg(not(unix))]
    {
        let _ = (path, mode);
        Ok(())
    }
}
