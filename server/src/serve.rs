//! The `serve` command: check the database role (and migrate when allowed to be the owner), start the fleet, build the app, print how to use it, serve until
//! SIGINT/SIGTERM, then drain.

use std::io::Write;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use crate::app::{self, AppOptions};
use crate::cli::ServeArgs;
use crate::fleet::{self, FleetSpec};

/// After the deadline cut, how long streams get to send their last bytes.
const CUT_GRACE: Duration = Duration::from_secs(5);
/// How long the final shipping of the journal may take before exit.
const FINAL_SHIP: Duration = Duration::from_secs(10);

pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let fd_limit = crate::fd_limit::raise_to_hard_limit();
    let fleet_spec = crate::cli::parse_fleet(&args.fleet).map_err(anyhow::Error::msg)?;
    shared_store_for(&fleet_spec, &args.adapter_store)?;
    let url = args.db.database_url.expose();
    let pool = tf_core::db::connect(url, 32).await?;
    crate::db_start::for_serve(&pool, url, args.allow_owner_role).await?;

    let journal = match args.journal.journal_durability {
        crate::journal::Durability::Off => None,
        level => Some(std::sync::Arc::new(
            crate::journal::Journal::open(
                &args.journal.journal_dir,
                level,
                Duration::from_millis(args.journal.journal_group_commit_ms),
                Default::default(),
            )
            .with_context(|| {
                format!(
                    "opening the usage journal in {}",
                    args.journal.journal_dir.display()
                )
            })?,
        )),
    };
    let cancel = CancellationToken::new();
    let fleet_tracker = tokio_util::task::TaskTracker::new();
    // If Redis is not up yet, a connector keeps trying on this tracker until `cancel`.
    let redis =
        crate::redis_conn::connect(args.redis_url.expose(), &fleet_tracker, cancel.clone()).await;
    if let Some(path) = &args.base_templates {
        let written = fleet::templates::offer_from(&pool, &fleet_spec, path).await?;
        tracing::info!(bases = written, path = %path.display(), "base templates loaded");
    }
    let sim_backend = fleet::start(&fleet_spec, &pool, &fleet_tracker, &cancel).await?;
    // kubernetes and local-vllm: built here so a bad kubeconfig fails start-up.
    let built = fleet::build::backend(
        &fleet_spec,
        &args.fleet_backend.options(),
        &fleet_tracker,
        &cancel,
    )
    .await?;
    // Opened here so a bad location or S3 configuration fails start-up, naming it.
    let store = crate::lifecycle::AdapterStore::open(&args.adapter_store)?;
    let lifecycle_options = crate::lifecycle::LifecycleOptions {
        store: Some(store.clone()),
        backend: sim_backend.or(built),
        adapter_start_timeout: Duration::from_secs(args.fleet_backend.adapter_start_timeout),
        ..Default::default()
    };
    let demo = if args.demo {
        let lifecycle =
            crate::lifecycle::Lifecycle::new(pool.clone(), store, lifecycle_options.limits);
        let adapters = (fleet_spec == FleetSpec::LocalSim).then_some(&lifecycle);
        Some(crate::demo::ensure(&pool, adapters, &args.demo_state).await?)
    } else {
        None
    };

    let built = app::build(
        pool.clone(),
        AppOptions {
            redis,
            redis_prefix: args.redis_prefix.clone(),
            secure_cookies: args.secure_cookies,
            trusted_proxies: if args.trust_forwarded_for {
                tf_app::ssr::client_addr::TrustedProxies::everyone()
            } else {
                args.trusted_proxies.clone()
            },
            max_keys_per_tenant: args.max_keys_per_tenant,
            gateway: (&args.gateway).into(),
            journal: journal.clone(),
            quota: (&args.quota).into(),
            lifecycle: lifecycle_options,
            rater: Some(crate::billing::rater::RaterOptions {
                drafts_every: Duration::from_secs(args.invoice_drafts_every_secs),
                close_grace: Duration::from_secs(args.invoice_close_grace_secs),
                ..Default::default()
            }),
            ..AppOptions::default()
        },
    )
    .await?;
    // The controller brings the simulated graphs up in a moment: wait for them, so the banner
    // can name a model.
    let routes = built.gateway.routes.clone();
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        while routes.snapshot().visible(uuid::Uuid::nil()).is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let addr = listener.local_addr()?;
    let metrics_listener = tokio::net::TcpListener::bind(args.metrics_listen)
        .await
        .with_context(|| {
            format!(
                "cannot listen on {} (--metrics-listen)",
                args.metrics_listen
            )
        })?;
    let metrics_addr = metrics_listener.local_addr()?;
    {
        let router = built.metrics_router.clone();
        let cancel = cancel.clone();
        fleet_tracker.spawn(async move {
            let served = axum::serve(metrics_listener, router)
                .with_graceful_shutdown(async move { cancel.cancelled().await })
                .await;
            if let Err(e) = served {
                tracing::error!(error = %e, "the metrics listener stopped");
            }
        });
    }
    let model = built
        .gateway
        .routes
        .snapshot()
        .visible(uuid::Uuid::nil())
        .iter()
        // The printed curl line is a chat completion: an embedding base would answer 400.
        .find(|r| crate::endpoint::Endpoint::Chat.serves(r.kind))
        .map(|r| r.served_name.clone());
    // Installed before the banner says the process serves (see `shutdown_signal`).
    let shutdown = shutdown_signal();
    print_banner(
        addr,
        metrics_addr,
        &fleet_spec,
        demo.as_ref().map(|d| (d, args.demo_state.as_path())),
        model.as_deref(),
    )?;

    let stop = CancellationToken::new();
    let stopping = stop.clone();
    let mut options: crate::http_server::ServerOptions = (&args.http).into();
    let cap = crate::fd_limit::connection_cap(options.max_connections, fd_limit);
    if cap < options.max_connections {
        tracing::warn!(
            configured = options.max_connections,
            cap,
            fd_limit,
            "fewer client connections than configured fit the open-files limit; the rest wait in the backlog"
        );
        options.max_connections = cap;
    }
    let mut server = std::pin::pin!(crate::http_server::serve(
        listener,
        built.router.clone(),
        options,
        built.http_metrics.clone(),
        async move { stopping.cancelled().await },
    ));
    tokio::select! {
        () = &mut server => {}
        () = shutdown => {
            tracing::info!("shutting down: no new connections, draining in-flight requests");
            stop.cancel();
            let deadline = Duration::from_secs(args.journal.drain_seconds);
            if tokio::time::timeout(deadline, &mut server).await.is_err() {
                tracing::warn!("drain deadline passed: cutting the streams still running (they are billed)");
                built.cut.cancel();
                let _ = tokio::time::timeout(CUT_GRACE, &mut server).await;
            }
        }
    }
    built.cancel.cancel();
    built.tracker.close();
    let _ = tokio::time::timeout(CUT_GRACE, built.tracker.wait()).await;
    if let Some(journal) = &journal {
        journal.close();
    }
    if let Some(shipper) = &built.shipper {
        if let Err(e) = shipper.drain(FINAL_SHIP).await {
            tracing::warn!(error = %e, "usage left in the journal; it ships at the next start");
        }
    }
    cancel.cancel();
    fleet_tracker.close();
    fleet_tracker.wait().await;
    pool.close().await;
    Ok(())
}

/// On Kubernetes the workers fetch adapters themselves (the DynamoModel's `source.uri`), so
/// the store must be one they can reach: a local directory would accept uploads that can never
/// start. Refused before anything else starts, naming the fix.
fn shared_store_for(fleet: &FleetSpec, adapter_store: &str) -> anyhow::Result<()> {
    if *fleet == FleetSpec::Kubernetes && !adapter_store.starts_with("s3://") {
        anyhow::bail!(
            "--fleet kubernetes needs an adapter store the Dynamo workers can read, but \
             --adapter-store (TF_ADAPTER_STORE) is the local path {adapter_store:?}: set \
             --adapter-store s3://BUCKET/PREFIX (credentials from the AWS_* variables)"
        );
    }
    Ok(())
}

/// Resolves at SIGINT or SIGTERM. The handlers are installed when this is called, not when it is
/// first polled: start-up calls it before printing the banner, so a signal sent as soon as the
/// process says it serves drains it instead of killing it (found by the seeded fault schedule:
/// a SIGTERM just after a restart's banner ended the process by the signal's default action).
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    let installed = {
        use tokio::signal::unix::{signal, SignalKind};
        signal(SignalKind::terminate())
            .and_then(|term| Ok((term, signal(SignalKind::interrupt())?)))
            .ok()
    };
    async move {
        #[cfg(unix)]
        if let Some((mut term, mut int)) = installed {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            return;
        }
        let _ = tokio::signal::ctrl_c().await;
    }
}

fn print_banner(
    addr: SocketAddr,
    metrics_addr: SocketAddr,
    fleet: &FleetSpec,
    demo: Option<(&crate::demo::DemoCredentials, &std::path::Path)>,
    model: Option<&str>,
) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "\nToken Factory is running ({} fleet).", fleet.label())?;
    writeln!(out, "  Portal:   http://{addr}/")?;
    writeln!(out, "  API:      http://{addr}/v1")?;
    writeln!(out, "  Metrics:  http://{metrics_addr}/metrics")?;
    if let Some((d, state)) = demo {
        writeln!(
            out,
            "  Tenant login: {} / {}",
            d.member_email, d.member_password
        )?;
        writeln!(
            out,
            "  Admin login:  {} / {}",
            d.admin_email, d.admin_password
        )?;
        writeln!(out, "  API key:      {}", d.api_key)?;
        if let Some(model) = model {
            writeln!(out, "\nTry it:")?;
            writeln!(
                out,
                "  curl http://{addr}/v1/chat/completions -H 'Authorization: Bearer {}' -H 'Content-Type: application/json' -d '{{\"model\":\"{model}\",\"messages\":[{{\"role\":\"user\",\"content\":\"Hello there\"}}],\"max_tokens\":16}}'",
                d.api_key
            )?;
        }
        writeln!(
            out,
            "\n(Demo credentials are kept in {} (readable only by you) and shown again at every start.)",
            state.display()
        )?;
    }
    out.flush()
}
