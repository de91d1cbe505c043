//! Command line of the `tokenfactory` binary. Every flag is also an environment variable, and
//! every field's doc comment is its `--help` text.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use tf_engine_sim::SimConfig;

use crate::gateway::GatewayOptions;
use crate::http_server::ServerOptions;
use crate::quota::QuotaOptions;
use crate::secret::Secret;

#[derive(Debug, Parser)]
#[command(
    name = "tokenfactory",
    version,
    about = "Token Factory: metered multi-tenant LLM gateway and portal"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Log line format on stderr: `text` for people, `json` (one object per line, with the
    /// request's span fields such as `request_id`) for a log pipeline.
    #[arg(long, env = "TF_LOG_FORMAT", default_value = "text", global = true)]
    pub log_format: crate::telemetry::logs::LogFormat,
    /// Base URL of an OpenTelemetry collector's OTLP/HTTP receiver (`http://collector:4318`):
    /// each `/v1` request's spans are exported to `<it>/v1/traces` (protobuf). Unset: no traces,
    /// at no cost. `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (a full URL) and `OTEL_SERVICE_NAME` are
    /// honoured as the OpenTelemetry SDK defines them.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT", global = true)]
    pub otlp_endpoint: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the portal and the OpenAI-compatible /v1 API (the default); connected as the
    /// schema's owner only with --allow-owner-role, which also applies migrations.
    Serve(Box<ServeArgs>),
    /// Apply pending database migrations as the schema's owner and exit.
    Migrate(MigrateArgs),
    /// Operator commands: accounts, keys, usage.
    #[command(subcommand)]
    Admin(AdminCommand),
    /// Run the simulated engine (vLLM/Dynamo protocol) on its own port.
    EngineSim(SimArgs),
}

/// Where PostgreSQL is.
#[derive(Debug, Clone, Args)]
pub struct DbArgs {
    /// PostgreSQL URL; the database is created if missing.
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/tokenfactory"
    )]
    pub database_url: Secret,
}

/// `tokenfactory migrate`: the owner's URL, and the login role `serve` will use.
#[derive(Debug, Clone, Args)]
pub struct MigrateArgs {
    #[command(flatten)]
    pub db: DbArgs,
    /// The schema owner's PostgreSQL URL, when DATABASE_URL is the serving role's (the Helm
    /// chart's migration job sets both); wins over DATABASE_URL.
    #[arg(long, env = "TF_MIGRATE_DATABASE_URL")]
    pub migrate_database_url: Option<Secret>,
    /// A login role to make a member of `tokenfactory_app` after migrating (the role `serve`
    /// connects as; it must exist).
    #[arg(long, env = "TF_GRANT_APP_ROLE")]
    pub grant_app_role: Option<String>,
}

impl MigrateArgs {
    /// The URL migrations run with: the owner's.
    pub fn owner_url(&self) -> &str {
        self.migrate_database_url
            .as_ref()
            .unwrap_or(&self.db.database_url)
            .expose()
    }
}

#[derive(Debug, Clone, Parser)]
pub struct ServeArgs {
    #[command(flatten)]
    pub db: DbArgs,
    /// Serve even when DATABASE_URL connects as a superuser or an owner of the schema (and apply
    /// migrations at start). Such a role can disable the triggers that keep issued invoices and
    /// usage immutable, so without this flag `serve` refuses it: for the single-machine demo and
    /// development only; production serves as a member of `tokenfactory_app`.
    #[arg(long, env = "TF_ALLOW_OWNER_ROLE", default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub allow_owner_role: bool,
    /// Address the portal and /v1 listen on.
    #[arg(long, env = "TF_LISTEN", default_value = "127.0.0.1:3000")]
    pub listen: SocketAddr,
    /// Redis URL for shared rate counters and login throttling.
    #[arg(long, env = "REDIS_URL", default_value = "redis://127.0.0.1:6379")]
    pub redis_url: Secret,
    /// Prefix of every Redis key this deployment writes.
    #[arg(long, env = "TF_REDIS_PREFIX", default_value = crate::app::DEFAULT_REDIS_PREFIX)]
    pub redis_prefix: String,
    /// Fleet backend: `local-sim` (simulated engines on loopback), `static:FILE` (a TOML list
    /// of engines that already run), `kubernetes` (Dynamo graphs) or `local-vllm` (`vllm serve`
    /// processes on this machine).
    #[arg(long, env = "TF_FLEET", default_value = "local-sim")]
    pub fleet: String,
    #[command(flatten)]
    pub fleet_backend: FleetArgs,
    /// Create the demo tenant (logins, adapters, an API key) once, and print its credentials at
    /// every start. For trying the product on one machine (`scripts/run.sh` sets it); never for
    /// production replicas.
    #[arg(long, env = "TF_DEMO", default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub demo: bool,
    /// Where `--demo` keeps the demo credentials between starts (created readable by its owner
    /// only).
    #[arg(
        long,
        env = "TF_DEMO_STATE",
        default_value = ".tokenfactory/demo-credentials.json"
    )]
    pub demo_state: PathBuf,
    /// Where uploaded adapters are stored (one folder per adapter version): a directory
    /// (created if missing), `file:///dir`, or an S3-compatible bucket `s3://bucket/prefix`
    /// configured by the usual `AWS_*` variables (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
    /// `AWS_REGION`; `AWS_ENDPOINT` and `AWS_ALLOW_HTTP=true` for a MinIO-style store). On
    /// Kubernetes it must be an `s3://` bucket the Dynamo workers can read.
    #[arg(
        long,
        alias = "adapter-dir",
        env = "TF_ADAPTER_STORE",
        default_value = ".tokenfactory/adapters"
    )]
    pub adapter_store: String,
    /// Base templates (serving template, `config.json`, `tokenizer.json`) to offer at start-up:
    /// a YAML or TOML file, or a directory of them (the Helm chart mounts its per-base
    /// ConfigMap). Upserted into PostgreSQL on every start (idempotent); see
    /// `server/src/fleet/templates.rs` for the fields.
    #[arg(long, env = "TF_BASE_TEMPLATES")]
    pub base_templates: Option<PathBuf>,
    /// Mark session cookies Secure (set when serving behind TLS).
    #[arg(long, env = "TF_SECURE_COOKIES", default_value_t = false, action = clap::ArgAction::Set)]
    pub secure_cookies: bool,
    /// Proxies (comma-separated CIDRs, e.g. the ingress pods' `10.0.0.0/8`) whose
    /// X-Forwarded-For names the client for login throttling: the right-most hop that is not one
    /// of them counts. From any other peer the header is ignored.
    #[arg(long, env = "TF_TRUSTED_PROXIES", default_value = "", value_parser = clap::value_parser!(tf_app::ssr::client_addr::TrustedProxies))]
    pub trusted_proxies: tf_app::ssr::client_addr::TrustedProxies,
    /// Deprecated: trust X-Forwarded-For from every peer (the left-most hop counts). Set only
    /// when every connection comes through a proxy that overwrites the header; prefer
    /// --trusted-proxies.
    #[arg(long, env = "TF_TRUST_FORWARDED_FOR", default_value_t = false, action = clap::ArgAction::Set)]
    pub trust_forwarded_for: bool,
    /// Address of the Prometheus `/metrics` listener (kept off the client port: it shows
    /// platform-wide counters). Loopback by default; the chart binds it for the cluster only.
    #[arg(long, env = "TF_METRICS_LISTEN", default_value = "127.0.0.1:9464")]
    pub metrics_listen: SocketAddr,
    /// Most working keys a tenant may have; creating one more is refused with a message (keys
    /// are listed on pages and cached per replica, so their number is kept bounded).
    #[arg(long, env = "TF_MAX_KEYS_PER_TENANT", default_value_t = tf_core::keys::DEFAULT_MAX_KEYS_PER_TENANT)]
    pub max_keys_per_tenant: u32,
    #[command(flatten)]
    pub http: HttpArgs,
    #[command(flatten)]
    pub gateway: GatewayArgs,
    #[command(flatten)]
    pub journal: JournalArgs,
    #[command(flatten)]
    pub quota: QuotaArgs,
    /// How often the rater's leader rebuilds the open month's draft invoices, in seconds.
    #[arg(long, env = "TF_INVOICE_DRAFTS_EVERY_SECS", default_value_t = 300)]
    pub invoice_drafts_every_secs: u64,
    /// How long after a UTC month ends its final draft invoices are built (late events first),
    /// in seconds. Drafts are never issued automatically.
    #[arg(long, env = "TF_INVOICE_CLOSE_GRACE_SECS", default_value_t = 3_600)]
    pub invoice_close_grace_secs: u64,
}

/// Options of the `kubernetes` and `local-vllm` fleets (ignored by the others).
#[derive(Debug, Clone, Args)]
pub struct FleetArgs {
    /// Namespace of the Dynamo graphs (default: the kubeconfig context's, or the pod's own).
    #[arg(long, env = "TF_KUBE_NAMESPACE")]
    pub kube_namespace: Option<String>,
    /// The gateway's URL of a graph's frontend; `{graph}` and `{namespace}` are replaced.
    #[arg(long, env = "TF_KUBE_FRONTEND_URL", default_value = crate::fleet::dynamo_render::DEFAULT_FRONTEND_URL)]
    pub kube_frontend_url: String,
    /// A kubeconfig file (default: `KUBECONFIG`, `~/.kube/config`, then the in-cluster config).
    #[arg(long, env = "TF_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// A Secret holding `HF_TOKEN`, referenced by every Dynamo graph's services (`envFromSecret`)
    /// so gated models download; the chart's `hfTokenSecret`.
    #[arg(long, env = "TF_HF_TOKEN_SECRET")]
    pub hf_token_secret: Option<String>,
    /// A Secret with `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` (and optionally `AWS_REGION`,
    /// `AWS_ENDPOINT_URL`) that Dynamo workers download `s3://` adapters with.
    #[arg(long, env = "TF_WORKER_S3_SECRET")]
    pub worker_s3_secret: Option<String>,
    /// A PersistentVolumeClaim holding the shared model cache, mounted by every worker as its
    /// `HF_HOME`: ReadWriteMany lets the first worker of a base fill it for the rest; a
    /// ReadOnlyMany claim filled beforehand makes the mounts read-only (the DGD's mounts have no
    /// read-only flag of their own).
    #[arg(long, env = "TF_MODEL_CACHE_PVC")]
    pub model_cache_pvc: Option<String>,
    /// Where workers mount the model cache (also their `HF_HOME`).
    #[arg(long, env = "TF_MODEL_CACHE_MOUNT", default_value = "/opt/models")]
    pub model_cache_mount: String,
    /// Seconds an adapter may stay `starting` (not loaded on every replica) before it is
    /// `failed` with the backend's last message as the reason.
    #[arg(long, env = "TF_ADAPTER_START_TIMEOUT", default_value_t = 900)]
    pub adapter_start_timeout: u64,
    /// The vLLM executable `local-vllm` runs as `<bin> serve <model> ...`.
    #[arg(long, env = "TF_VLLM_BIN", default_value = "vllm")]
    pub vllm_bin: PathBuf,
    /// GPUs on this machine that `local-vllm` hands to replicas (`CUDA_VISIBLE_DEVICES`); unset:
    /// not pinned.
    #[arg(long, env = "TF_VLLM_GPUS")]
    pub vllm_gpus: Option<u32>,
    /// Seconds a new vLLM process gets to answer `/health` before it is restarted.
    #[arg(long, env = "TF_VLLM_STARTUP_TIMEOUT_SECS", default_value_t = 600)]
    pub vllm_startup_timeout_secs: u64,
}

impl FleetArgs {
    /// The backends' option structs.
    pub fn options(&self) -> crate::fleet::build::BackendOptions {
        crate::fleet::build::BackendOptions {
            kube: crate::fleet::kubernetes::KubeOptions {
                namespace: self.kube_namespace.clone(),
                frontend_url: self.kube_frontend_url.clone(),
                kubeconfig: self.kubeconfig.clone(),
                cluster: crate::fleet::dynamo_render::ClusterPieces {
                    hf_token_secret: non_empty(&self.hf_token_secret),
                    worker_s3_secret: non_empty(&self.worker_s3_secret),
                    model_cache_pvc: non_empty(&self.model_cache_pvc),
                    model_cache_mount: self.model_cache_mount.clone(),
                },
            },
            vllm: crate::fleet::local_vllm::LocalVllmOptions {
                vllm_bin: self.vllm_bin.clone(),
                gpus: self.vllm_gpus,
                startup_timeout: std::time::Duration::from_secs(self.vllm_startup_timeout_secs),
            },
        }
    }
}

/// An empty value (a chart's unset string) counts as unset.
fn non_empty(v: &Option<String>) -> Option<String> {
    v.clone().filter(|s| !s.trim().is_empty())
}

/// Admission flags; the defaults are [`QuotaOptions::DEFAULT`]'s (one place for them).
#[derive(Debug, Clone, Args)]
pub struct QuotaArgs {
    /// Share of each limit one replica enforces on its own while Redis is unreachable (fail-open
    /// for rates: with N replicas the cluster admits about N x this share of each limit).
    #[arg(long, env = "TF_LOCAL_LIMIT_FRACTION", default_value_t = QuotaOptions::DEFAULT.local_limit_fraction)]
    pub local_limit_fraction: f64,
    /// Lifetime of an in-flight or long-prompt slot (and of a spend reservation) in Redis, in
    /// milliseconds. Renewed while the request runs; a dead replica's slots expire after this.
    #[arg(long, env = "TF_QUOTA_LEASE_MS", default_value_t = QuotaOptions::DEFAULT.quota_lease_ms)]
    pub quota_lease_ms: u64,
    /// Longest wait for a Redis answer at admission, in milliseconds; slower answers count as
    /// Redis down (this replica then uses its local limits for a second).
    #[arg(long, env = "TF_QUOTA_REDIS_TIMEOUT_MS", default_value_t = QuotaOptions::DEFAULT.quota_redis_timeout_ms)]
    pub quota_redis_timeout_ms: u64,
    /// How often the cluster's leader resets spend counters from billed usage, in milliseconds.
    #[arg(long, env = "TF_QUOTA_RECONCILE_MS", default_value_t = QuotaOptions::DEFAULT.quota_reconcile_ms)]
    pub quota_reconcile_ms: u64,
    /// The completion cap of a request that sets no limit the engine reads: sent upstream as
    /// `max_tokens`, and what admission reserves for (token and spend estimates; corrected at
    /// completion), so the reservation and the engine agree.
    #[arg(long, env = "TF_QUOTA_DEFAULT_MAX_TOKENS", default_value_t = QuotaOptions::DEFAULT.quota_default_max_tokens)]
    pub quota_default_max_tokens: u64,
    /// Prompt tokens from which a request counts as long, where a tenant's limits do not say.
    #[arg(long, env = "TF_LONG_PROMPT_TOKENS", default_value_t = QuotaOptions::DEFAULT.long_prompt_tokens)]
    pub long_prompt_tokens: u64,
}

impl From<&QuotaArgs> for QuotaOptions {
    fn from(a: &QuotaArgs) -> Self {
        Self {
            local_limit_fraction: a.local_limit_fraction,
            quota_lease_ms: a.quota_lease_ms,
            quota_redis_timeout_ms: a.quota_redis_timeout_ms,
            quota_reconcile_ms: a.quota_reconcile_ms,
            quota_default_max_tokens: a.quota_default_max_tokens,
            long_prompt_tokens: a.long_prompt_tokens,
        }
    }
}

/// The local usage journal.
#[derive(Debug, Clone, Args)]
pub struct JournalArgs {
    /// Directory of this replica's usage journal (one process per directory).
    #[arg(long, env = "TF_JOURNAL_DIR", default_value = ".tokenfactory/journal")]
    pub journal_dir: PathBuf,
    /// `process`: an event is handed to the OS before the response ends (survives a crash);
    /// `machine`: it is fsynced first (survives power loss); `off`: straight to PostgreSQL.
    #[arg(long, env = "TF_JOURNAL_DURABILITY", default_value = "process")]
    pub journal_durability: crate::journal::Durability,
    /// How often the group committer fsyncs in `process` mode, in milliseconds: what a power cut
    /// may lose at that level (a crash of the process loses nothing).
    #[arg(long, env = "TF_JOURNAL_GROUP_COMMIT_MS", default_value_t = crate::journal::durability::DEFAULT_GROUP_COMMIT_MS)]
    pub journal_group_commit_ms: u64,
    /// How long in-flight requests may run after SIGTERM before they are cut and billed, in seconds.
    #[arg(long, env = "TF_DRAIN_SECONDS", default_value_t = 30)]
    pub drain_seconds: u64,
}

/// Request-path limits and timeouts; the defaults are [`GatewayOptions::default`]'s.
#[derive(Debug, Clone, Args)]
pub struct GatewayArgs {
    /// Largest accepted request body, in bytes (larger: 413).
    #[arg(long, env = "TF_MAX_BODY_BYTES", default_value_t = GatewayOptions::default().max_body_bytes)]
    pub max_body_bytes: usize,
    /// Largest whole JSON answer relayed from an engine, in bytes. A larger one (an engine that
    /// ignored `stream`, a huge embeddings batch) is answered 502 and billed nothing: the client
    /// received nothing. Streamed and assembled answers are not bounded by it.
    #[arg(long, env = "TF_MAX_ANSWER_BYTES", default_value_t = GatewayOptions::default().max_answer_bytes)]
    pub max_answer_bytes: usize,
    /// Largest body of a portal form, server function or `/api/v1` call other than an adapter
    /// upload, in bytes (larger: 413). Uploads are bounded by the adapter size limits.
    #[arg(long, env = "TF_MAX_FORM_BYTES", default_value_t = GatewayOptions::default().max_form_bytes)]
    pub max_form_bytes: usize,
    /// Time allowed to open a connection to an upstream, in milliseconds.
    #[arg(long, env = "TF_UPSTREAM_CONNECT_TIMEOUT_MS", default_value_t = GatewayOptions::default().upstream_connect_timeout_ms)]
    pub upstream_connect_timeout_ms: u64,
    /// Time allowed for an upstream to start answering (response headers), in milliseconds.
    #[arg(long, env = "TF_UPSTREAM_FIRST_BYTE_TIMEOUT_MS", default_value_t = GatewayOptions::default().upstream_first_byte_timeout_ms)]
    pub upstream_first_byte_timeout_ms: u64,
    /// Longest silence allowed between two reads of an upstream's body, in milliseconds; a
    /// stream silent longer ends with an error event and is billed for what it produced.
    #[arg(long, env = "TF_UPSTREAM_CHUNK_TIMEOUT_MS", default_value_t = GatewayOptions::default().upstream_chunk_timeout_ms)]
    pub upstream_chunk_timeout_ms: u64,
    /// Idle keep-alive connections kept per upstream.
    #[arg(long, env = "TF_UPSTREAM_POOL_IDLE", default_value_t = GatewayOptions::default().upstream_pool_idle)]
    pub upstream_pool_idle: usize,
    /// Time every request body gets before the minimum rate applies, in milliseconds.
    #[arg(long, env = "TF_BODY_TIMEOUT_MS", default_value_t = GatewayOptions::default().body_timeout_ms)]
    pub body_timeout_ms: u64,
    /// Slowest a request body may arrive after that, in bytes per second (slower: 408).
    #[arg(long, env = "TF_BODY_MIN_BYTES_PER_SEC", default_value_t = GatewayOptions::default().body_min_bytes_per_sec)]
    pub body_min_bytes_per_sec: u64,
    /// Longest a request for an idle model is held while its graph wakes, in milliseconds
    /// (longer: 503 with `retry-after`).
    #[arg(long, env = "TF_HOLD_LIMIT_MS", default_value_t = GatewayOptions::default().hold_limit_ms)]
    pub hold_limit_ms: u64,
    /// Peers (comma-separated CIDRs) whose W3C `traceparent` a `/v1` request's trace joins, e.g.
    /// an in-cluster caller or an ingress that traces. From any other peer the header is
    /// ignored and the request starts a trace of its own: a client on the internet does not
    /// choose trace ids. Default: none. Only with --otlp-endpoint.
    #[arg(long, env = "TF_TRUST_TRACEPARENT_FROM", default_value = "", value_parser = clap::value_parser!(tf_app::ssr::client_addr::TrustedProxies))]
    pub trust_traceparent_from: tf_app::ssr::client_addr::TrustedProxies,
}

impl From<&GatewayArgs> for GatewayOptions {
    fn from(a: &GatewayArgs) -> Self {
        Self {
            max_body_bytes: a.max_body_bytes,
            max_answer_bytes: a.max_answer_bytes,
            max_form_bytes: a.max_form_bytes,
            upstream_connect_timeout_ms: a.upstream_connect_timeout_ms,
            upstream_first_byte_timeout_ms: a.upstream_first_byte_timeout_ms,
            upstream_chunk_timeout_ms: a.upstream_chunk_timeout_ms,
            upstream_pool_idle: a.upstream_pool_idle,
            body_timeout_ms: a.body_timeout_ms,
            body_min_bytes_per_sec: a.body_min_bytes_per_sec,
            hold_limit_ms: a.hold_limit_ms,
            trust_traceparent_from: a.trust_traceparent_from.clone(),
        }
    }
}

/// Client connections to the portal and `/v1`; the defaults are [`ServerOptions::default`]'s.
#[derive(Debug, Clone, Args)]
pub struct HttpArgs {
    /// Time a connection gets to send a complete request head, counted from when it opens or its
    /// previous response ends; so it is also the idle keep-alive timeout, in seconds.
    #[arg(long, env = "TF_HEADER_TIMEOUT_SECS", default_value_t = ServerOptions::default().header_timeout.as_secs())]
    pub header_timeout_secs: u64,
    /// Most client connections open at once; further ones wait in the listen backlog.
    #[arg(long, env = "TF_MAX_CONNECTIONS", default_value_t = ServerOptions::default().max_connections)]
    pub max_connections: usize,
}

impl From<&HttpArgs> for ServerOptions {
    fn from(a: &HttpArgs) -> Self {
        Self {
            header_timeout: std::time::Duration::from_secs(a.header_timeout_secs.max(1)),
            max_connections: a.max_connections.max(1),
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum AdminCommand {
    /// Create a platform administrator (prints a generated password if none is given).
    CreateAdmin {
        #[command(flatten)]
        db: DbArgs,
        /// Login email.
        #[arg(long, env = "TF_ADMIN_EMAIL")]
        email: String,
        /// Password (at least 10 characters); generated and printed when absent.
        #[arg(long, env = "TF_ADMIN_PASSWORD")]
        password: Option<Secret>,
    },
    /// Create a tenant, optionally with a first portal user.
    CreateTenant {
        #[command(flatten)]
        db: DbArgs,
        /// Short handle: lower-case letters, digits, '-' and '_'.
        #[arg(long)]
        name: String,
        /// Name shown in the portal (defaults to the handle).
        #[arg(long)]
        display_name: Option<String>,
        /// Email of a first member to create (the tenant's owner).
        #[arg(long)]
        member_email: Option<String>,
        /// That member's password; generated and printed when absent.
        #[arg(long, env = "TF_MEMBER_PASSWORD")]
        member_password: Option<Secret>,
    },
    /// Issue an API key for a tenant; the key is printed once and never stored.
    IssueKey {
        #[command(flatten)]
        db: DbArgs,
        /// Tenant handle.
        #[arg(long)]
        tenant: String,
        /// A label for the key.
        #[arg(long, default_value = "")]
        name: String,
    },
    /// Set a new password for a portal user (prints a generated one if none is given) and end
    /// every portal session they have.
    ResetPassword {
        #[command(flatten)]
        db: DbArgs,
        /// The user's email.
        #[arg(long)]
        email: String,
        /// New password; generated and printed when absent.
        #[arg(long, env = "TF_NEW_PASSWORD")]
        password: Option<Secret>,
    },
    /// Revoke an API key of any tenant; every replica refuses it within a second.
    RevokeKey {
        #[command(flatten)]
        db: DbArgs,
        /// The key: its id (a UUID), its visible prefix (`tf-` and 8 characters) or the whole key.
        key: String,
    },
    /// Suspend a tenant: its API keys get 403 within a second on every replica and its users'
    /// portal sessions end. Data is kept.
    SuspendTenant {
        #[command(flatten)]
        db: DbArgs,
        /// Tenant handle.
        #[arg(long)]
        tenant: String,
    },
    /// Reactivate a suspended tenant: its keys work again; its users sign in again.
    ReactivateTenant {
        #[command(flatten)]
        db: DbArgs,
        /// Tenant handle.
        #[arg(long)]
        tenant: String,
    },
    /// Print stored usage events as JSON lines, oldest first.
    Usage {
        #[command(flatten)]
        db: DbArgs,
        /// Only this tenant (handle).
        #[arg(long)]
        tenant: Option<String>,
        /// Only events that started at or after this RFC 3339 time.
        #[arg(long)]
        since: Option<String>,
        /// Only events that started before this RFC 3339 time.
        #[arg(long)]
        until: Option<String>,
    },
    /// Set or show the limits of a tenant or a key (no value flags: show limits and consumption).
    Limits(LimitsArgs),
    /// Show or set prices, or list the price versions (a change is a new version, never an edit).
    Prices(PricesArgs),
    /// Re-rate a tenant's events of a period under one price version: a new rating run, the old
    /// runs kept for audit, the events untouched.
    Rerate {
        #[command(flatten)]
        db: DbArgs,
        /// Tenant handle.
        #[arg(long)]
        tenant: String,
        /// Events started at or after this RFC 3339 time.
        #[arg(long)]
        since: String,
        /// Events started before this RFC 3339 time.
        #[arg(long)]
        until: String,
        /// The price version (see `admin prices versions`); default: the one in effect now.
        #[arg(long)]
        version: Option<i64>,
    },
    /// Export rated usage for a billing platform, to stdout.
    Export {
        #[command(flatten)]
        db: DbArgs,
        #[arg(long, value_enum)]
        format: ExportFormat,
        /// Events started at or after this RFC 3339 time.
        #[arg(long)]
        since: String,
        /// Events started before this RFC 3339 time.
        #[arg(long)]
        until: String,
        /// This deployment's name (CloudEvents `source`).
        #[arg(long, default_value = "tokenfactory")]
        source: String,
    },
    /// Invoices: build a month's draft, issue it, correct an issued one, or list a tenant's.
    Invoices(InvoicesArgs),
    /// Grant a tenant prepaid credit (burns down before charges are invoiced).
    Credit {
        #[command(flatten)]
        db: DbArgs,
        /// Tenant handle.
        #[arg(long)]
        tenant: String,
        /// Amount in currency: `50`, `$50.00`, `0.000125` (parsed exactly into micro-units).
        #[arg(long, value_parser = money_arg)]
        amount: i64,
        /// Burn order: lower first.
        #[arg(long, default_value_t = 0)]
        priority: i32,
        /// RFC 3339 expiry instant (in the future); none: never. The grant stops counting at
        /// that instant.
        #[arg(long)]
        expires: Option<String>,
        #[arg(long, default_value = "")]
        note: String,
    },
    /// Unit economics of every base on one UTC day: warm replica-hours, duty cycle, cost per
    /// million tokens at full load and at the duty cycle, revenue, margin, idle floor cost.
    Economics(EconomicsArgs),
    /// The fleet's per-base policies (`idle`: sleep after a quiet spell, or always on).
    Fleet(FleetAdminArgs),
}

/// Flags of `admin fleet`.
#[derive(Debug, Clone, Args)]
pub struct FleetAdminArgs {
    #[command(flatten)]
    pub db: DbArgs,
    #[command(subcommand)]
    pub action: FleetAdminAction,
}

#[derive(Debug, Clone, Subcommand)]
pub enum FleetAdminAction {
    /// Set a base's sleep policy: its graph goes to zero replicas after `--after` without a
    /// request (the next request is held while it wakes), or stays `--always-on`. With
    /// `--adapters`, the policy of its adapters instead: each is unloaded from the engines after
    /// `--after` without a request of its own and reloaded by the next (held meanwhile), or
    /// stays loaded (`--always-on`) while the graph is up.
    Idle {
        /// The base model.
        #[arg(long)]
        base: String,
        /// Set the policy of the base's adapters, not of its graph.
        #[arg(long)]
        adapters: bool,
        /// Idle time before sleeping: seconds or `90s`, `10m`, `1h30m`, `1d` (1 s to 30 days).
        #[arg(
            long,
            required_unless_present = "always_on",
            conflicts_with = "always_on"
        )]
        after: Option<String>,
        /// Never sleep (keeps the template's floor; wakes a sleeping graph).
        #[arg(long)]
        always_on: bool,
    },
}

/// An export format of `admin export`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ExportFormat {
    Csv,
    Cloudevents,
    Lago,
}

/// Flags of `admin prices`.
#[derive(Debug, Clone, Args)]
pub struct PricesArgs {
    #[command(flatten)]
    pub db: DbArgs,
    #[command(subcommand)]
    pub action: PricesAction,
}

#[derive(Debug, Clone, Subcommand)]
pub enum PricesAction {
    /// The prices in effect (now, or at --at).
    Show {
        /// RFC 3339 time.
        #[arg(long)]
        at: Option<String>,
    },
    /// Set one price from a time on (a new version).
    Set {
        /// Price key: a base's price key, or an adapter's own `adapter:<tenant>/<adapter>` (its
        /// requests are priced by it, else by their base's).
        #[arg(long)]
        key: String,
        #[arg(long, default_value = "standard")]
        tier: String,
        /// Currency per million fresh (uncached) input tokens: `2.50`, `$0.15`.
        #[arg(long, value_parser = money_arg)]
        fresh: i64,
        /// Currency per million cached input tokens.
        #[arg(long, value_parser = money_arg)]
        cached: i64,
        /// Currency per million output tokens.
        #[arg(long, value_parser = money_arg)]
        output: i64,
        /// RFC 3339 time from which it applies: now (the default) or later, after the last
        /// recorded event. To correct charges already rated, re-rate (`admin rerate`).
        #[arg(long)]
        from: Option<String>,
    },
    /// Every version, oldest first.
    Versions,
}

/// Flags of `admin invoices`.
#[derive(Debug, Clone, Args)]
pub struct InvoicesArgs {
    #[command(flatten)]
    pub db: DbArgs,
    #[command(subcommand)]
    pub action: InvoicesAction,
}

#[derive(Debug, Clone, Subcommand)]
pub enum InvoicesAction {
    /// A tenant's invoices and credit notes.
    List {
        #[arg(long)]
        tenant: String,
    },
    /// Build (or rebuild) a tenant's draft for a UTC month: each --run (a re-rate, see `admin
    /// rerate`) over its part of the month's period, the live run over the rest. The draft
    /// remembers the runs: the scheduled rebuilds keep them.
    Build {
        #[arg(long)]
        tenant: String,
        /// The month, YYYY-MM.
        #[arg(long)]
        month: String,
        /// A re-rate run to build from (repeatable; runs may not overlap). None: the runs the
        /// draft was built from so far; `--live` drops them.
        #[arg(long, conflicts_with = "live")]
        run: Vec<i64>,
        /// Build from the live run alone (drops earlier re-rates from the draft).
        #[arg(long)]
        live: bool,
    },
    /// Close a tenant's month early at an instant: the month's invoice covers usage started
    /// before it; what starts from then on is on the next month's invoice.
    Close {
        #[arg(long)]
        tenant: String,
        /// The month, YYYY-MM.
        #[arg(long)]
        month: String,
        /// RFC 3339 instant inside the month (default: now).
        #[arg(long)]
        at: Option<String>,
    },
    /// Issue a draft (immutable from then on): only after its period ended and its final draft
    /// (built after the end) is built.
    Issue { id: uuid::Uuid },
    /// Add an adjustment entry to a draft (negative: a refund).
    Adjust {
        id: uuid::Uuid,
        #[arg(long)]
        description: String,
        /// Amount in currency (`5`, `-$2.50`), parsed exactly into micro-units.
        #[arg(long, allow_hyphen_values = true, value_parser = money_arg)]
        amount: i64,
    },
    /// Correct an issued invoice: a credit note; then `build` makes the new invoice.
    Correct { id: uuid::Uuid },
    /// Who issues invoices (their "From") and the payment terms; copied onto each invoice when
    /// it is issued. Without flags: shows them.
    Issuer {
        #[arg(long)]
        name: Option<String>,
        /// Address lines (and tax number); `\n` separates lines.
        #[arg(long)]
        address: Option<String>,
        /// Days from issue to due date, 0 to 365.
        #[arg(long)]
        due_days: Option<i32>,
    },
}

impl AdminCommand {
    /// The database the command works on.
    pub fn db(&self) -> &DbArgs {
        match self {
            Self::CreateAdmin { db, .. }
            | Self::CreateTenant { db, .. }
            | Self::IssueKey { db, .. }
            | Self::ResetPassword { db, .. }
            | Self::RevokeKey { db, .. }
            | Self::SuspendTenant { db, .. }
            | Self::ReactivateTenant { db, .. }
            | Self::Usage { db, .. }
            | Self::Rerate { db, .. }
            | Self::Export { db, .. }
            | Self::Credit { db, .. } => db,
            Self::Limits(args) => &args.db,
            Self::Prices(args) => &args.db,
            Self::Invoices(args) => &args.db,
            Self::Economics(args) => &args.db,
            Self::Fleet(args) => &args.db,
        }
    }
}

/// A value flag of `admin limits`: a number sets the limit, `none` removes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setting {
    Set(i64),
    Clear,
}

/// A money limit's flag value: an amount of currency (`5`, `$5.00`, `0.000125`, parsed exactly
/// into micro-units by `tf_core::money::parse_money`) or `none` to remove the limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoneySetting {
    Set(i64),
    Clear,
}

impl std::str::FromStr for MoneySetting {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s.eq_ignore_ascii_case("none") {
            return Ok(Self::Clear);
        }
        match tf_core::money::parse_money(s) {
            Ok(n) if n >= 0 => Ok(Self::Set(n)),
            Ok(_) => Err(format!("{s:?} is negative: a limit is 0 or more")),
            Err(e) => Err(format!("{s:?}: {e}")),
        }
    }
}

/// A flag's amount of currency (`5`, `$5.00`, `-2`, `0.000125`) in micro-units, parsed exactly.
pub fn money_arg(s: &str) -> Result<i64, String> {
    tf_core::money::parse_money(s).map_err(|e| format!("{s:?}: {e}"))
}

impl std::str::FromStr for Setting {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s.eq_ignore_ascii_case("none") {
            return Ok(Self::Clear);
        }
        match s.parse::<i64>() {
            Ok(n) if n >= 0 => Ok(Self::Set(n)),
            _ => Err(format!("{s:?} is not a non-negative integer or `none`")),
        }
    }
}

/// Flags of `admin economics`.
#[derive(Debug, Clone, Args)]
pub struct EconomicsArgs {
    #[command(flatten)]
    pub db: DbArgs,
    /// The UTC day, `YYYY-MM-DD` (today: up to now); required without a subcommand.
    #[arg(long)]
    pub day: Option<String>,
    /// `text` (a block per base) or `json` (one document, integers only); also after a
    /// subcommand.
    #[arg(long, value_enum, global = true, default_value_t = OutputFormat::Text)]
    pub format: OutputFormat,
    #[command(subcommand)]
    pub action: Option<EconomicsAction>,
}

#[derive(Debug, Clone, Subcommand)]
pub enum EconomicsAction {
    /// Run a load against a base's graph frontend (the OpenAI endpoint the gateway forwards to),
    /// read the engine's own token counters (`vllm:prompt_tokens_total` +
    /// `vllm:generation_tokens_total` on its `/metrics`) and append a cost version with the
    /// measured peak tokens per second per replica (same GPU cost, marked measured).
    MeasurePeak(MeasurePeakArgs),
    /// Replay a base's last days of requests against every floor (1 to its ceiling) and idle
    /// policy (5 min, 15 min, 1 h, 4 h, always on): GPU cost, cold starts, requests that waited,
    /// duty cycle, margin; recommend the cheapest within the cold-start budget (default: at most
    /// 1 % of requests wait), and with `--apply` set it (audited).
    Advise(AdviseArgs),
    /// Who a base's GPU cost on a UTC day is for: its used part split by the tenants' and
    /// adapters' load, its idle floor by the idle time each one's requests were waited for
    /// (exact integer micros, largest remainder); and each tenant's gross margin.
    Attribution(AttributionArgs),
}

/// Flags of `admin economics attribution`.
#[derive(Debug, Clone, Args)]
pub struct AttributionArgs {
    /// The base model.
    #[arg(long)]
    pub base: String,
    /// The UTC day, `YYYY-MM-DD` (today: up to now).
    #[arg(long)]
    pub day: String,
}

/// Flags of `admin economics advise`.
#[derive(Debug, Clone, Args)]
pub struct AdviseArgs {
    /// The base model (a templated one).
    #[arg(long)]
    pub base: String,
    /// Whole UTC days replayed, ending at today's midnight.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u16).range(1..=366))]
    pub days: u16,
    /// At most this share of requests may wait for a cold start, as a fraction (`0.01` = 1 %,
    /// parsed exactly, at most six decimals).
    #[arg(long, conflicts_with = "max_cold_starts_per_day")]
    pub max_cold_share: Option<String>,
    /// At most this many cold starts (wakes) per day, on average over the days.
    #[arg(long)]
    pub max_cold_starts_per_day: Option<i64>,
    /// The cold start assumed, in seconds, when the graph's history holds no wake in the days
    /// (else the median measured wake is used).
    #[arg(long, default_value_t = tf_core::economics::advisor::FALLBACK_COLD_START_MS / 1000)]
    pub cold_start_secs: i64,
    /// Set the recommended floor and idle policy (`fleet.floor` and `fleet.idle_policy` audit
    /// rows, actor `cli`).
    #[arg(long)]
    pub apply: bool,
}

/// Flags of `admin economics measure-peak`.
#[derive(Debug, Clone, Args)]
pub struct MeasurePeakArgs {
    /// The base model.
    #[arg(long)]
    pub base: String,
    /// The OpenAI base URL to load (default: the base's frontend, as the gateway forwards).
    #[arg(long)]
    pub url: Option<String>,
    /// Where the engine's counters are (default: `/metrics` at the URL's origin).
    #[arg(long)]
    pub metrics_url: Option<String>,
    /// Requests kept in flight.
    #[arg(long, default_value_t = 32)]
    pub concurrency: u32,
    /// How long the load runs (the first fifth, at most 5 s, warms up and is not counted).
    #[arg(long, default_value_t = 30)]
    pub seconds: u64,
    /// Completion tokens asked per request.
    #[arg(long, default_value_t = 256)]
    pub max_tokens: u32,
    /// Replicas behind the URL (default: the graph's ready replicas, else 1).
    #[arg(long)]
    pub replicas: Option<u32>,
}

/// How a report is printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    Text,
    Json,
}

/// Flags of `admin limits`.
#[derive(Debug, Clone, Args)]
pub struct LimitsArgs {
    #[command(flatten)]
    pub db: DbArgs,
    /// The tenant (handle) whose limits to set or show.
    #[arg(long, required_unless_present = "key", conflicts_with = "key")]
    pub tenant: Option<String>,
    /// The key (visible prefix or whole key) whose limits to set or show.
    #[arg(long)]
    pub key: Option<String>,
    /// Requests per minute (`none` removes the limit).
    #[arg(long)]
    pub rpm: Option<Setting>,
    /// Prompt + completion tokens per minute (`none` removes the limit).
    #[arg(long)]
    pub tpm: Option<Setting>,
    /// Spend per calendar month (UTC) in currency: `5`, `$5.00`, `0.000125` (parsed exactly
    /// into micro-units; `none` removes the limit).
    #[arg(long)]
    pub spend_limit: Option<MoneySetting>,
    /// Concurrent requests per graph (tenants only; `none` removes the cap).
    #[arg(long)]
    pub max_in_flight: Option<Setting>,
    /// Concurrent long prompts per graph (tenants only; `none` removes the cap).
    #[arg(long)]
    pub max_long_prompts: Option<Setting>,
    /// Prompt tokens from which a request counts as long (tenants only; `none`: server default).
    #[arg(long)]
    pub long_prompt_tokens: Option<Setting>,
}

/// The `engine-sim` command; the defaults are [`SimConfig::default`]'s.
#[derive(Debug, Clone, Args)]
pub struct SimArgs {
    /// Address to listen on.
    #[arg(long, env = "TF_SIM_LISTEN", default_value = "127.0.0.1:8100")]
    pub listen: SocketAddr,
    /// Base model names served (comma separated).
    #[arg(
        long,
        env = "TF_SIM_MODELS",
        value_delimiter = ',',
        default_values_t = SimConfig::default().models
    )]
    pub models: Vec<String>,
    /// LoRA adapters loaded at start, as name=path (comma separated).
    #[arg(long, env = "TF_SIM_LORAS", value_delimiter = ',')]
    pub loras: Vec<String>,
    /// Fixed time before the first token, in milliseconds.
    #[arg(long, env = "TF_SIM_TTFT_MS", default_value_t = SimConfig::default().ttft_ms)]
    pub ttft_ms: u64,
    /// Prefill speed for uncached prompt tokens (0: free).
    #[arg(long, env = "TF_SIM_PREFILL_TPS", default_value_t = SimConfig::default().prefill_tokens_per_sec)]
    pub prefill_tokens_per_sec: u64,
    /// Decode speed per request (0: no delay).
    #[arg(long, env = "TF_SIM_DECODE_TPS", default_value_t = SimConfig::default().decode_tokens_per_sec)]
    pub decode_tokens_per_sec: u64,
    /// Completion length when a request sets no max_tokens.
    #[arg(long, env = "TF_SIM_DEFAULT_MAX_TOKENS", default_value_t = SimConfig::default().default_max_tokens)]
    pub default_max_tokens: u32,
    /// Answer errors in Dynamo's flat shape instead of OpenAI's envelope.
    #[arg(long, env = "TF_SIM_FLAT_ERRORS", default_value_t = SimConfig::default().flat_errors)]
    pub flat_errors: bool,
    /// Put streamed usage on the last content chunk instead of a separate chunk.
    #[arg(long, env = "TF_SIM_USAGE_ON_LAST_CHUNK", default_value_t = SimConfig::default().usage_on_last_chunk)]
    pub usage_on_last_chunk: bool,
}

impl SimArgs {
    /// The simulator's configuration (`--loras` parsed from name=path).
    pub fn config(&self) -> Result<SimConfig, String> {
        let loras = self
            .loras
            .iter()
            .map(|spec| {
                spec.split_once('=')
                    .map(|(n, p)| (n.to_owned(), p.to_owned()))
                    .ok_or_else(|| format!("--loras takes name=path, got {spec:?}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(SimConfig {
            models: self.models.clone(),
            loras,
            ttft_ms: self.ttft_ms,
            prefill_tokens_per_sec: self.prefill_tokens_per_sec,
            decode_tokens_per_sec: self.decode_tokens_per_sec,
            default_max_tokens: self.default_max_tokens,
            flat_errors: self.flat_errors,
            usage_on_last_chunk: self.usage_on_last_chunk,
            ..SimConfig::default()
        })
    }
}

/// Parses `--fleet`.
pub fn parse_fleet(spec: &str) -> Result<crate::fleet::FleetSpec, String> {
    match spec.split_once(':') {
        None if spec == "local-sim" => Ok(crate::fleet::FleetSpec::LocalSim),
        None if spec == "kubernetes" => Ok(crate::fleet::FleetSpec::Kubernetes),
        None if spec == "local-vllm" => Ok(crate::fleet::FleetSpec::LocalVllm),
        Some(("static", path)) if !path.is_empty() => {
            Ok(crate::fleet::FleetSpec::Static(PathBuf::from(path)))
        }
        _ => Err(format!(
            "unknown fleet {spec:?}: use `local-sim`, `static:FILE`, `kubernetes` or `local-vllm`"
        )),
    }
}
