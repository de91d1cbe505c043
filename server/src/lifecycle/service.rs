//! The one service behind both surfaces (the `/api/v1` management API and the portal's
//! `/models`): upload (streamed to the store, then validated), start, stop, delete, read. Every
//! change is one transaction with its history row and its audit record; the controller makes the
//! fleet follow.

use bytes::Bytes;
use futures::Stream;
use serde_json::json;
use sqlx::PgPool;
use tf_core::db::audit;
use tf_core::db::lifecycle::{self as db, AdapterRow, HistoryEntry, HistoryRow};
use uuid::Uuid;

use super::storage::{AdapterStore, StoreError};
use super::transitions::{self, Command};
use super::validate::{self, BaseSpec, CONFIG_FILE, WEIGHTS_FILE};

/// Size limits of an upload.
#[derive(Debug, Clone, Copy)]
pub struct UploadLimits {
    pub config_bytes: u64,
    pub weights_bytes: u64,
}

impl Default for UploadLimits {
    fn default() -> Self {
        Self {
            config_bytes: 64 << 10,
            weights_bytes: 2 << 30,
        }
    }
}

/// Why an operation was refused; each surface maps it to its own answer.
#[derive(Debug, thiserror::Error)]
pub enum LifecycleError {
    /// No such model for this tenant (another tenant's name answers the same).
    #[error("The model `{0}` does not exist.")]
    NotFound(String),
    #[error("{0}")]
    BadRequest(String),
    /// The chosen name is not a usable model name (a 400, like `BadRequest`).
    #[error("{0}")]
    InvalidName(String),
    /// The base named is not offered for adapters (a 400, like `BadRequest`).
    #[error("{0}")]
    UnknownBase(String),
    #[error("{0}")]
    Conflict(String),
    /// The name is a public model's (a base every tenant can call): an adapter may not shadow
    /// it (a 409, with its own code).
    #[error("{0}")]
    NameTaken(String),
    #[error("{0}")]
    TooLarge(String),
    #[error("database error: {0}")]
    Db(#[from] sqlx::Error),
    #[error("storage error: {0}")]
    Io(#[from] std::io::Error),
}

/// Who asked, for the audit log.
#[derive(Debug, Clone)]
pub struct Actor {
    pub user_id: Option<Uuid>,
    /// An email, or `key:<id>` for the API.
    pub label: String,
}

/// An adapter as its owner sees it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct AdapterView {
    pub id: Uuid,
    /// The served name (what the owner sends as `model`).
    pub name: String,
    pub base: String,
    pub version: i32,
    pub state: String,
    pub desired: String,
    pub reason: Option<String>,
    /// The engine-side LoRA name of this version.
    pub engine_name: String,
    pub validation: Option<serde_json::Value>,
    pub size_bytes: Option<i64>,
    #[serde(with = "time::serde::rfc3339")]
    pub updated_at: time::OffsetDateTime,
}

impl From<AdapterRow> for AdapterView {
    fn from(r: AdapterRow) -> Self {
        Self {
            id: r.id,
            name: r.name,
            base: r.base,
            version: r.version,
            state: r.state,
            desired: r.desired,
            reason: r.reason,
            engine_name: r.upstream_model,
            validation: r.validation,
            size_bytes: r.size_bytes,
            updated_at: r.updated_at,
        }
    }
}

/// An upload in progress: the row is in `uploading`, files go to `key`.
#[derive(Debug, Clone)]
pub struct Upload {
    pub id: Uuid,
    pub tenant: Uuid,
    pub name: String,
    pub version: i32,
    key: String,
    /// The client-side name of the weights part, checked for pickle suffixes.
    weights_name: Option<String>,
}

#[derive(Clone)]
pub struct Lifecycle {
    pool: PgPool,
    store: AdapterStore,
    limits: UploadLimits,
}

/// A served name a tenant may choose: what clients put in `model`.
pub fn check_name(name: &str) -> Result<(), LifecycleError> {
    let ok = (1..=64).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && name.starts_with(|c: char| c.is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        Err(LifecycleError::InvalidName(
            "name must be 1-64 letters, digits, '-', '_' or '.', starting with a letter or digit"
                .into(),
        ))
    }
}

impl Lifecycle {
    pub fn new(pool: PgPool, store: AdapterStore, limits: UploadLimits) -> Self {
        Self {
            pool,
            store,
            limits,
        }
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    pub fn limits(&self) -> UploadLimits {
        self.limits
    }

    /// Opens an upload of `name` on `base`: a new adapter, or a new version of a stopped,
    /// rejected or failed one (a new engine-side name, so no stale cache is reused).
    pub async fn begin_upload(
        &self,
        tenant: Uuid,
        name: &str,
        base: &str,
        actor: &Actor,
    ) -> Result<Upload, LifecycleError> {
        check_name(name)?;
        if db::is_base_name(&self.pool, name).await? {
            return Err(LifecycleError::NameTaken(format!(
                "`{name}` is the name of a public model; choose another name for the adapter"
            )));
        }
        let mut tx = self.pool.begin().await?;
        let mut replaced = None;
        let (id, version, from) = match db::lock_adapter(&mut tx, tenant, name).await? {
            Some(row) => {
                if row.base != base {
                    return Err(LifecycleError::Conflict(format!(
                        "`{name}` is on base {}; delete it before uploading it for {base}",
                        row.base
                    )));
                }
                let idle = matches!(row.state.as_str(), "stopped" | "rejected" | "failed");
                if row.desired != "stopped" || !idle {
                    return Err(LifecycleError::Conflict(format!(
                        "`{name}` is {}; stop it before uploading a new version",
                        row.state
                    )));
                }
                let version = row.version + 1;
                let key = format!("{}/v{version}", row.id.simple());
                db::reupload(
                    &mut tx,
                    row.id,
                    version,
                    &engine_name(row.id, name, version),
                    &self.store.uri(&key),
                )
                .await?;
                replaced = row.storage_uri.clone();
                (row.id, version, Some(row.state))
            }
            None => {
                let id = Uuid::now_v7();
                let key = format!("{}/v1", id.simple());
                // INVARIANT: of concurrent uploads of one new name, the first insert wins and
                // the others meet the unique (tenant_id, name) key: a 409, never a 500
                // (`concurrent_uploads_of_one_new_name_give_one_201_and_409s` in lifecycle.rs).
                let inserted = db::insert_upload(
                    &mut tx,
                    id,
                    tenant,
                    name,
                    base,
                    &engine_name(id, name, 1),
                    &self.store.uri(&key),
                )
                .await
                .map_err(|e| match e {
                    sqlx::Error::Database(d) if d.is_unique_violation() => {
                        LifecycleError::Conflict(format!(
                            "`{name}` is being uploaded by another request; try again when it \
                             has finished"
                        ))
                    }
                    e => LifecycleError::Db(e),
                })?;
                if inserted.is_none() {
                    return Err(LifecycleError::UnknownBase(format!(
                        "`{base}` is not a base model that accepts adapters"
                    )));
                }
                (id, 1, None)
            }
        };
        db::record_history(
            &mut *tx,
            &HistoryEntry {
                entity: "adapter",
                entity_id: id,
                tenant_id: Some(tenant),
                name,
                from_state: from.as_deref(),
                to_state: "uploading",
                reason: Some(&format!("version {version}")),
                replicas: None,
                floor: None,
            },
        )
        .await?;
        audit::record(
            &mut *tx,
            &audit::Entry {
                actor_user_id: actor.user_id,
                actor: &actor.label,
                tenant_id: Some(tenant),
                action: "model.upload",
                target: name,
                detail: json!({"base": base, "version": version}),
                source_ip: None,
            },
        )
        .await?;
        tx.commit().await?;
        // The stopped version's files are not needed any more (its engine name is retired).
        if let Some(uri) = replaced {
            if let Err(e) = self.store.remove_uri(&uri).await {
                tracing::warn!(error = %e, uri, "could not remove a replaced adapter version");
            }
        }
        Ok(Upload {
            id,
            tenant,
            name: name.to_owned(),
            version,
            key: format!("{}/v{version}", id.simple()),
            weights_name: None,
        })
    }

    /// Streams one of the two files into the store. Over the limit, the upload is rejected.
    pub async fn put_file<E: std::fmt::Display>(
        &self,
        upload: &mut Upload,
        file: &str,
        client_name: Option<&str>,
        body: impl Stream<Item = Result<Bytes, E>> + Unpin,
    ) -> Result<u64, LifecycleError> {
        let (file, limit) = match file {
            CONFIG_FILE => (CONFIG_FILE, self.limits.config_bytes),
            WEIGHTS_FILE => {
                upload.weights_name = client_name.map(str::to_owned);
                (WEIGHTS_FILE, self.limits.weights_bytes)
            }
            other => {
                return Err(LifecycleError::BadRequest(format!(
                    "unexpected file {other}: send {CONFIG_FILE} and {WEIGHTS_FILE}"
                )))
            }
        };
        match self.store.write(&upload.key, file, body, limit).await {
            Ok(n) => Ok(n),
            Err(e @ StoreError::TooLarge { .. }) => {
                let reason = e.to_string();
                self.reject(upload, &reason).await?;
                Err(LifecycleError::TooLarge(reason))
            }
            Err(StoreError::Interrupted { reason, .. }) => {
                self.reject(upload, &format!("the upload of {file} was interrupted"))
                    .await?;
                Err(LifecycleError::BadRequest(reason))
            }
            Err(e) => Err(LifecycleError::Io(e.into())),
        }
    }

    /// Validates the stored files: `stopped` (ready to start) or `rejected` with the reason.
    pub async fn finish(&self, upload: &Upload) -> Result<AdapterView, LifecycleError> {
        self.transition_upload(upload, "uploading", "validating", None)
            .await?;
        let base = self.base_spec(upload.id).await?;
        let verdict = match validate::check_file_name(upload.weights_name.as_deref()) {
            Err(rejection) => Err(rejection),
            Ok(()) => {
                let (verdict, size) = validate::validate_stored(
                    &self.store,
                    &upload.key,
                    &base,
                    self.limits.config_bytes,
                )
                .await
                .map_err(std::io::Error::from)?;
                verdict.map(|accepted| (accepted, size))
            }
        };
        match verdict {
            Ok((accepted, size)) => {
                let mut tx = self.pool.begin().await?;
                db::set_validation(
                    &mut tx,
                    upload.id,
                    &validate::summary(&accepted),
                    i64::try_from(size).unwrap_or(i64::MAX),
                )
                .await?;
                tx.commit().await?;
                self.transition_upload(upload, "validating", "stopped", None)
                    .await?;
            }
            Err(rejection) => {
                self.reject(upload, &rejection.to_string()).await?;
            }
        }
        self.view(upload.tenant, &upload.name).await
    }

    /// Uploads a whole adapter from memory (the demo, tests): begin, both files, finish.
    pub async fn upload_bytes(
        &self,
        tenant: Uuid,
        name: &str,
        base: &str,
        config: Vec<u8>,
        weights: Vec<u8>,
        actor: &Actor,
    ) -> Result<AdapterView, LifecycleError> {
        let mut upload = self.begin_upload(tenant, name, base, actor).await?;
        let once =
            |b: Vec<u8>| futures::stream::iter([Ok::<_, std::convert::Infallible>(Bytes::from(b))]);
        self.put_file(&mut upload, CONFIG_FILE, None, once(config))
            .await?;
        self.put_file(&mut upload, WEIGHTS_FILE, Some(WEIGHTS_FILE), once(weights))
            .await?;
        self.finish(&upload).await
    }

    /// Ends an upload as `rejected` with `reason` and removes its files.
    pub async fn reject(&self, upload: &Upload, reason: &str) -> Result<(), LifecycleError> {
        let mut tx = self.pool.begin().await?;
        if let Some(row) = db::lock_adapter_by_id(&mut tx, upload.id).await? {
            if row.version == upload.version && row.state != "rejected" {
                db::set_adapter(&mut tx, row.id, &row.desired, "rejected", Some(reason)).await?;
                record_adapter(&mut tx, &row, "rejected", Some(reason)).await?;
            }
        }
        tx.commit().await?;
        if let Err(e) = self.store.remove(&upload.key).await {
            tracing::warn!(error = %e, key = upload.key, "could not remove a rejected upload");
        }
        Ok(())
    }

    async fn transition_upload(
        &self,
        upload: &Upload,
        from: &str,
        to: &str,
        reason: Option<&str>,
    ) -> Result<(), LifecycleError> {
        let mut tx = self.pool.begin().await?;
        let row = db::lock_adapter_by_id(&mut tx, upload.id)
            .await?
            .filter(|r| r.version == upload.version && r.state == from)
            .ok_or_else(|| {
                LifecycleError::Conflict(format!("`{}` changed during its upload", upload.name))
            })?;
        db::set_adapter(&mut tx, row.id, &row.desired, to, reason).await?;
        record_adapter(&mut tx, &row, to, reason).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn base_spec(&self, adapter: Uuid) -> Result<BaseSpec, LifecycleError> {
        let bases = db::templated_bases(&self.pool).await?;
        let mut conn = self.pool.acquire().await?;
        let row = db::lock_adapter_by_id(&mut conn, adapter)
            .await?
            .ok_or_else(|| LifecycleError::NotFound(adapter.to_string()))?;
        let base = bases
            .into_iter()
            .find(|b| b.id == row.base_model_id)
            .ok_or_else(|| LifecycleError::BadRequest(format!("{} has no template", row.base)))?;
        Ok(BaseSpec {
            model: base.template.model,
            config_json: base.template.config_json,
            max_lora_rank: u64::try_from(base.template.max_lora_rank).unwrap_or(0),
        })
    }

    /// Start, stop or delete `name` of `tenant`; answers the adapter as it is now.
    pub async fn command(
        &self,
        tenant: Uuid,
        name: &str,
        command: Command,
        actor: &Actor,
    ) -> Result<AdapterView, LifecycleError> {
        let mut tx = self.pool.begin().await?;
        let row = db::lock_adapter(&mut tx, tenant, name)
            .await?
            .filter(|r| r.storage_uri.is_some())
            .ok_or_else(|| LifecycleError::NotFound(name.to_owned()))?;
        let next = transitions::next(command, &row.state, &row.desired)
            .map_err(LifecycleError::Conflict)?;
        if let Some(next) = next {
            db::set_adapter(&mut tx, row.id, next.desired, next.state, None).await?;
            let reason = format!("{} by {}", command.verb(), actor.label);
            record_adapter(&mut tx, &row, next.state, Some(&reason)).await?;
            audit::record(
                &mut *tx,
                &audit::Entry {
                    actor_user_id: actor.user_id,
                    actor: &actor.label,
                    tenant_id: Some(tenant),
                    action: match command {
                        Command::Start => "model.start",
                        Command::Stop => "model.stop",
                        Command::Delete => "model.delete",
                    },
                    target: name,
                    detail: json!({"version": row.version}),
                    source_ip: None,
                },
            )
            .await?;
        }
        tx.commit().await?;
        self.view(tenant, name).await
    }

    /// One adapter of `tenant`.
    pub async fn view(&self, tenant: Uuid, name: &str) -> Result<AdapterView, LifecycleError> {
        let mut conn = self.pool.acquire().await?;
        db::lock_adapter(&mut conn, tenant, name)
            .await?
            .filter(|r| r.storage_uri.is_some())
            .map(AdapterView::from)
            .ok_or_else(|| LifecycleError::NotFound(name.to_owned()))
    }

    /// One adapter with its history, oldest change first.
    pub async fn detail(
        &self,
        tenant: Uuid,
        name: &str,
    ) -> Result<(AdapterView, Vec<HistoryRow>), LifecycleError> {
        let view = self.view(tenant, name).await?;
        let history = db::history(&self.pool, view.id).await?;
        Ok((view, history))
    }

    /// The tenant's managed adapters, by name.
    pub async fn list(&self, tenant: Uuid) -> Result<Vec<AdapterView>, LifecycleError> {
        Ok(db::tenant_adapters(&self.pool, tenant)
            .await?
            .into_iter()
            .filter(|r| r.storage_uri.is_some())
            .map(AdapterView::from)
            .collect())
    }

    /// The store the adapters' files are kept in.
    pub fn store(&self) -> &AdapterStore {
        &self.store
    }
}

/// The engine-side name of an adapter version: unique (the adapter id) and readable.
pub fn engine_name(id: Uuid, name: &str, version: i32) -> String {
    format!("{name}--{}--v{version}", id.simple())
}

/// Records an adapter's state change.
pub(crate) async fn record_adapter(
    conn: &mut sqlx::PgConnection,
    row: &AdapterRow,
    to: &str,
    reason: Option<&str>,
) -> sqlx::Result<()> {
    db::record_history(
        conn,
        &HistoryEntry {
            entity: "adapter",
            entity_id: row.id,
            tenant_id: Some(row.tenant_id),
            name: &row.name,
            from_state: Some(&row.state),
            to_state: to,
            reason,
            replicas: None,
            floor: None,
        },
    )
    .await
}
