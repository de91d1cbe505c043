//! Model lifecycle: tenants' adapters uploaded, validated, started, stopped and deleted on shared
//! base graphs. PostgreSQL holds the desired state; [`service::Lifecycle`] is the one service
//! behind the management API and the portal; [`controller::Controller`] (one leader per cluster)
//! makes a [`crate::fleet::backend::FleetBackend`] follow it and writes back what it observes.

pub mod controller;
pub mod fixture;
pub mod metrics;
mod receive;
pub mod service;
pub mod storage;
pub mod transitions;
pub mod validate;

pub use controller::{Controller, ControllerOptions};
pub use metrics::FleetMetrics;
pub use service::{Actor, AdapterView, Lifecycle, LifecycleError, UploadLimits};
pub use storage::{AdapterStore, StoreError};

/// What the app needs to run the lifecycle.
#[derive(Clone)]
pub struct LifecycleOptions {
    /// The local directory uploaded adapters are stored in when `store` is `None`.
    pub adapter_dir: std::path::PathBuf,
    /// Where uploaded adapters are stored (`--adapter-store`: a directory or an S3 bucket);
    /// `None`: `adapter_dir`.
    pub store: Option<AdapterStore>,
    pub limits: UploadLimits,
    /// The backend the controller drives; `None`: no controller on this replica (static fleets).
    pub backend: Option<std::sync::Arc<dyn crate::fleet::backend::FleetBackend>>,
    pub controller: ControllerOptions,
    /// How long an adapter may stay `starting` before it is `failed` (`--adapter-start-timeout`).
    pub adapter_start_timeout: std::time::Duration,
}

impl Default for LifecycleOptions {
    fn default() -> Self {
        Self {
            adapter_dir: std::env::temp_dir().join("tokenfactory-adapters"),
            store: None,
            limits: UploadLimits::default(),
            backend: None,
            controller: ControllerOptions::default(),
            adapter_start_timeout: controller::DEFAULT_START_TIMEOUT,
        }
    }
}

impl LifecycleOptions {
    /// The adapter store these options name (the local directory is created if missing).
    pub fn adapter_store(&self) -> Result<AdapterStore, StoreError> {
        match &self.store {
            Some(store) => Ok(store.clone()),
            None => AdapterStore::local(&self.adapter_dir),
        }
    }
}
