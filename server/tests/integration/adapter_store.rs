//! The adapter store's contract (issue 14), run against every store it is built on: the local
//! directory (`LocalFileSystem`, the default) and `InMemory` (standing in for S3-compatible
//! stores, which speak the same `object_store` API). Each store is wrapped in a recorder that
//! sees every part written and every byte read, so the suite proves that uploads stream in
//! bounded parts (never whole in memory), that an over-limit or interrupted upload leaves no
//! object, that validation reads only the header it bounds, and that delete removes every
//! stored object.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests may fail loudly

use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::StreamExt;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, UploadPart,
};
use tokenfactory::adapter_check::config::BaseConfig;
use tokenfactory::fleet::local_sim;
use tokenfactory::lifecycle::storage::{StoreError, PARTS_IN_FLIGHT};
use tokenfactory::lifecycle::validate::{self, BaseSpec, CONFIG_FILE, WEIGHTS_FILE};
use tokenfactory::lifecycle::{fixture, AdapterStore};

/// The part size the suite streams with: small, so a 100 KB upload goes in 25 parts.
const PART: usize = 4096;

/// An object store that records what passes through it.
#[derive(Debug)]
struct Recorder {
    inner: Arc<dyn ObjectStore>,
    /// The size of every part put, in order.
    parts: Arc<Mutex<Vec<usize>>>,
    /// Bytes returned by reads.
    read: AtomicU64,
}

impl fmt::Display for Recorder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Recorder({})", self.inner)
    }
}

#[derive(Debug)]
struct RecordedUpload {
    inner: Box<dyn MultipartUpload>,
    parts: Arc<Mutex<Vec<usize>>>,
}

#[async_trait]
impl MultipartUpload for RecordedUpload {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        self.parts.lock().unwrap().push(data.content_length());
        self.inner.put_part(data)
    }
    async fn complete(&mut self) -> object_store::Result<PutResult> {
        self.inner.complete().await
    }
    async fn abort(&mut self) -> object_store::Result<()> {
        self.inner.abort().await
    }
}

#[async_trait]
impl ObjectStore for Recorder {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }
    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        let inner = self.inner.put_multipart_opts(location, opts).await?;
        Ok(Box::new(RecordedUpload {
            inner,
            parts: self.parts.clone(),
        }))
    }
    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        // A `head` is a get that reads no data.
        let head = options.head;
        let got = self.inner.get_opts(location, options).await?;
        if !head {
            self.read
                .fetch_add(got.range.end - got.range.start, Ordering::SeqCst);
        }
        Ok(got)
    }
    async fn get_ranges(
        &self,
        location: &Path,
        ranges: &[Range<u64>],
    ) -> object_store::Result<Vec<Bytes>> {
        let got = self.inner.get_ranges(location, ranges).await?;
        let n: usize = got.iter().map(Bytes::len).sum();
        self.read.fetch_add(n as u64, Ordering::SeqCst);
        Ok(got)
    }
    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(locations)
    }
    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }
    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }
    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

/// `store`, recorded.
fn recorded(store: &AdapterStore) -> (AdapterStore, Arc<Recorder>) {
    let recorder = Arc::new(Recorder {
        inner: store.objects(),
        parts: Arc::default(),
        read: AtomicU64::new(0),
    });
    let inner = recorder.clone();
    let wrapped = store.wrap_objects(|_| inner).with_part_bytes(PART);
    (wrapped, recorder)
}

/// `bytes` as a request body arrives: in chunks of `chunk` bytes.
fn chunks(
    bytes: &[u8],
    chunk: usize,
) -> impl futures::Stream<Item = Result<Bytes, String>> + Unpin + '_ {
    futures::stream::iter(bytes.chunks(chunk).map(|c| Ok(Bytes::copy_from_slice(c))))
}

fn base() -> BaseSpec {
    BaseSpec {
        model: local_sim::model_id(local_sim::DEMO_BASE),
        config_json: local_sim::sim_base_config(),
        max_lora_rank: 64,
    }
}

/// The contract every store must keep.
async fn contract(label: &str, store: AdapterStore) {
    let (store, rec) = recorded(&store);
    let key = "0190aaaabbbbccccdddd/v1";

    // Streaming: 100 KB arriving in 1000-byte chunks goes in ceil(100000 / 4096) parts, none
    // larger than the part size, so the upload never held more than a few parts.
    let big: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    let n = store
        .write(key, "blob", chunks(&big, 1000), 1 << 20)
        .await
        .unwrap();
    assert_eq!(n, 100_000, "{label}");
    let parts = rec.parts.lock().unwrap().clone();
    assert_eq!(
        parts.len(),
        100_000usize.div_ceil(PART),
        "{label}: {parts:?}"
    );
    assert!(parts.iter().all(|p| *p <= PART), "{label}: {parts:?}");
    assert_eq!(parts.iter().sum::<usize>(), 100_000, "{label}");
    assert!(
        PARTS_IN_FLIGHT * PART < big.len(),
        "the bound is below the upload's size"
    );
    assert_eq!(store.size(key, "blob").await.unwrap(), 100_000, "{label}");
    assert_eq!(
        &store.read_range(key, "blob", 4000..4100).await.unwrap()[..],
        &big[4000..4100],
        "{label}"
    );
    assert!(matches!(
        store.read_small(key, "blob", 1000).await,
        Err(StoreError::TooLarge { .. })
    ));

    // URIs: the version's folder under the store's root, and back.
    let uri = store.uri(key);
    assert_eq!(uri, format!("{}/{key}", store.root()), "{label}");
    assert_eq!(store.key_of_uri(&uri).as_deref(), Some(key), "{label}");
    assert_eq!(store.key_of_uri(&format!("{uri}/")).as_deref(), Some(key));
    assert_eq!(store.key_of_uri("s3://elsewhere/x/v1"), None, "{label}");

    // Over the limit: refused, and no object (nor part) is left.
    let over = store
        .write(
            "0190aaaabbbbccccdddd/v2",
            "blob",
            chunks(&big, 1000),
            10_000,
        )
        .await;
    assert!(
        matches!(over, Err(StoreError::TooLarge { limit: 10_000, .. })),
        "{label}: {over:?}"
    );
    assert!(store
        .size("0190aaaabbbbccccdddd/v2", "blob")
        .await
        .unwrap_err()
        .is_not_found());
    // Interrupted mid-stream: the same.
    let broken = futures::stream::iter([Ok(Bytes::from_static(b"abc")), Err("reset".to_owned())]);
    let cut = store
        .write("0190aaaabbbbccccdddd/v2", "blob", broken, 1 << 20)
        .await;
    assert!(
        matches!(cut, Err(StoreError::Interrupted { ref reason, .. }) if reason == "reset"),
        "{label}: {cut:?}"
    );
    assert!(store
        .size("0190aaaabbbbccccdddd/v2", "blob")
        .await
        .unwrap_err()
        .is_not_found());

    // Validation reads from the store: a valid adapter is accepted, reading the config and
    // only the weights' header (not their data).
    let base_config: BaseConfig = serde_json::from_value(local_sim::sim_base_config()).unwrap();
    let (config, weights) = fixture::valid(&base().model, &base_config, 8);
    store
        .write(key, CONFIG_FILE, chunks(config.as_bytes(), 100), 1 << 16)
        .await
        .unwrap();
    store
        .write(key, WEIGHTS_FILE, chunks(&weights, 777), 1 << 24)
        .await
        .unwrap();
    let header_len = u64::from_le_bytes(weights[..8].try_into().unwrap());
    rec.read.store(0, Ordering::SeqCst);
    let (verdict, size) = validate::validate_stored(&store, key, &base(), 1 << 16)
        .await
        .unwrap();
    let accepted = verdict.unwrap_or_else(|r| panic!("{label}: {r}"));
    assert_eq!(accepted.rank, 8);
    assert_eq!(size, weights.len() as u64);
    assert!(weights.len() as u64 > 8 + header_len, "the file has data");
    assert_eq!(
        rec.read.load(Ordering::SeqCst),
        config.len() as u64 + 8 + header_len,
        "{label}: reads the config, the length prefix and the header only"
    );

    // A header length past the cap: refused from the 8-byte prefix alone.
    let mut huge = u64::MAX.to_le_bytes().to_vec();
    huge.extend_from_slice(&[b' '; 64]);
    let bad = "0190aaaabbbbccccdddd/v3";
    store
        .write(bad, CONFIG_FILE, chunks(config.as_bytes(), 100), 1 << 16)
        .await
        .unwrap();
    store
        .write(bad, WEIGHTS_FILE, chunks(&huge, 10), 1 << 16)
        .await
        .unwrap();
    rec.read.store(0, Ordering::SeqCst);
    let (verdict, _) = validate::validate_stored(&store, bad, &base(), 1 << 16)
        .await
        .unwrap();
    let reason = verdict.err().map(|r| r.to_string()).unwrap_or_default();
    assert!(reason.contains("larger than"), "{label}: {reason}");
    assert_eq!(
        rec.read.load(Ordering::SeqCst),
        config.len() as u64 + 8,
        "{label}"
    );
    // Missing files are a reason, not an error.
    let (verdict, _) =
        validate::validate_stored(&store, "0190aaaabbbbccccdddd/v9", &base(), 1 << 16)
            .await
            .unwrap();
    assert!(verdict
        .err()
        .is_some_and(|r| r.to_string().contains("adapter_config.json is missing")));

    // Delete: a version, then every version of the adapter; removing twice is fine.
    store.remove_uri(&store.uri(bad)).await.unwrap();
    assert!(store
        .size(bad, WEIGHTS_FILE)
        .await
        .unwrap_err()
        .is_not_found());
    assert_eq!(store.size(key, WEIGHTS_FILE).await.unwrap(), size);
    store
        .remove_adapter(&store.uri(key), "0190aaaabbbbccccdddd")
        .await
        .unwrap();
    store
        .remove_adapter(&store.uri(key), "0190aaaabbbbccccdddd")
        .await
        .unwrap();
    let left: Vec<_> = store.objects().list(None).collect().await;
    assert!(left.is_empty(), "{label}: {left:?}");
    // Another store's URI is refused, not guessed at.
    assert!(matches!(
        store.remove_uri("s3://elsewhere/x/v1").await,
        Err(StoreError::Config { .. })
    ));
}

#[tokio::test]
async fn local_directory_keeps_the_contract() {
    let dir = tempfile::tempdir().unwrap();
    let store = AdapterStore::local(&dir.path().join("adapters")).unwrap();
    assert!(store.root().starts_with("file:///"), "{}", store.root());
    contract("local", store).await;
    // Empty folders go with their last file.
    let left: Vec<_> = std::fs::read_dir(dir.path().join("adapters"))
        .unwrap()
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[tokio::test]
async fn in_memory_store_keeps_the_contract() {
    let store = AdapterStore::with_objects(
        Arc::new(object_store::memory::InMemory::new()),
        "memory:///adapters",
    );
    contract("memory", store).await;
}

#[test]
fn locations_open_the_right_store() {
    let dir = tempfile::tempdir().unwrap();
    let plain = AdapterStore::open(dir.path().join("a").to_str().unwrap()).unwrap();
    assert!(plain.root().starts_with("file:///") && plain.root().ends_with("/a"));
    let url = format!("file://{}", dir.path().join("b").display());
    assert!(AdapterStore::open(&url).unwrap().root().ends_with("/b"));
    // S3-compatible: the bucket and prefix make the root the fleet is given.
    let s3 = AdapterStore::open("s3://models/tenants/adapters/").unwrap();
    assert_eq!(s3.root(), "s3://models/tenants/adapters");
    assert_eq!(s3.uri("id/v2"), "s3://models/tenants/adapters/id/v2");
    assert_eq!(
        AdapterStore::open("s3://models").unwrap().root(),
        "s3://models"
    );
    assert!(AdapterStore::open("s3://").is_err());
    assert!(AdapterStore::open("gs://models").is_err());
}

#[cfg(unix)]
#[tokio::test]
async fn local_files_are_private_to_the_service() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("adapters");
    let store = AdapterStore::local(&root).unwrap();
    let key = "0190aaaabbbbccccdddd/v1";
    let bytes = vec![7u8; 10_000];
    store
        .write(
            key,
            "adapter_model.safetensors",
            chunks(&bytes, 1000),
            1 << 20,
        )
        .await
        .unwrap();
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&root), 0o700, "the store's root");
    assert_eq!(mode(&root.join("0190aaaabbbbccccdddd")), 0o700);
    assert_eq!(mode(&root.join(key)), 0o700);
    assert_eq!(
        mode(&root.join(key).join("adapter_model.safetensors")),
        0o600,
        "the weights"
    );
}
