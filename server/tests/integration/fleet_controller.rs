//! The fleet controller (issue 14): one leader per cluster, idempotent passes, errors counted by
//! kind and retried with backoff, graphs created with their first model and torn down with their
//! last (unless the bare base is offered), history with replica counts for replica-hours.

#![allow(
    clippy::disallowed_methods,
    reason = "controllers under test run on their own tasks until the test cancels them"
)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests may fail loudly

use crate::common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use common::eventually;
use common::lifecycle::{offer, valid_adapter};
use sqlx::PgPool;
use tf_engine_sim::SimConfig;
use tokenfactory::fleet::backend::*;
use tokenfactory::fleet::sim_fleet::SimFleet;
use tokenfactory::lifecycle::transitions::Command;
use tokenfactory::lifecycle::{
    Actor, AdapterStore, Controller, ControllerOptions, FleetMetrics, Lifecycle, UploadLimits,
};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

/// Fails the first `fails` adapter registrations as unavailable, then delegates.
struct Flaky {
    inner: SimFleet,
    fails: AtomicU32,
}

#[async_trait]
impl FleetBackend for Flaky {
    fn kind(&self) -> &'static str {
        "local-sim"
    }
    async fn apply_graph(&self, g: &GraphSpec) -> Result<GraphObserved, FleetError> {
        self.inner.apply_graph(g).await
    }
    async fn delete_graph(&self, g: &str) -> Result<(), FleetError> {
        self.inner.delete_graph(g).await
    }
    async fn observe_graph(&self, g: &str) -> Result<Option<GraphObserved>, FleetError> {
        self.inner.observe_graph(g).await
    }
    async fn apply_adapter(&self, a: &AdapterSpec) -> Result<AdapterObserved, FleetError> {
        if self
            .fails
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(FleetError::Unavailable("injected".into()));
        }
        self.inner.apply_adapter(a).await
    }
    async fn remove_adapter(&self, a: &AdapterSpec) -> Result<(), FleetError> {
        self.inner.remove_adapter(a).await
    }
    async fn observe_adapter(
        &self,
        a: &AdapterSpec,
    ) -> Result<Option<AdapterObserved>, FleetError> {
        self.inner.observe_adapter(a).await
    }
}

fn sim() -> SimFleet {
    SimFleet::new(
        TaskTracker::new(),
        CancellationToken::new(),
        SimConfig::default(),
    )
}

fn actor() -> Actor {
    Actor {
        user_id: None,
        label: "test".into(),
    }
}

struct Setup {
    service: Lifecycle,
    tenant: Uuid,
    _dir: tempfile::TempDir,
}

async fn setup(pool: &PgPool, base: &str, offered: bool) -> Setup {
    offer(pool, base, 2, offered).await;
    let tenant = tf_core::accounts::create_tenant(pool, "acme", "Acme")
        .await
        .unwrap()
        .id;
    let dir = tempfile::tempdir().unwrap();
    let service = Lifecycle::new(
        pool.clone(),
        AdapterStore::local(dir.path()).unwrap(),
        UploadLimits::default(),
    );
    Setup {
        service,
        tenant,
        _dir: dir,
    }
}

impl Setup {
    async fn started(&self, name: &str, base: &str) {
        let (config, weights) = valid_adapter(base);
        self.service
            .upload_bytes(self.tenant, name, base, config, weights, &actor())
            .await
            .unwrap();
        self.service
            .command(self.tenant, name, Command::Start, &actor())
            .await
            .unwrap();
    }

    async fn state(&self, name: &str) -> String {
        self.service
            .view(self.tenant, name)
            .await
            .map_or("absent".into(), |v| v.state)
    }
}

#[sqlx::test(migrator = "tf_core::db::MIGRATOR")]
async fn errors_are_counted_by_kind_and_retried(pool: PgPool) {
    let s = setup(&pool, "flaky-base", true).await;
    let metrics = Arc::new(FleetMetrics::default());
    let backend = Arc::new(Flaky {
        inner: sim(),
        fails: AtomicU32::new(3),
    });
    let c = tokio::sync::Mutex::new(Controller::new(
        pool.clone(),
        backend,
        metrics.clone(),
        ControllerOptions::default(),
    ));
    s.started("bot", "flaky-base").await;
    eventually(
        Duration::from_secs(15),
        "ready after the injected failures",
        || async {
            c.lock().await.reconcile_once().await.unwrap();
            s.state("bot").await == "ready"
        },
    )
    .await;
    assert_eq!(metrics.errors("unavailable"), 3);
    assert_eq!(metrics.errors("rejected"), 0);
    let mut text = String::new();
    metrics.render(&mut text);
    assert!(
        text.contains("tf_fleet_errors_total{kind=\"unavailable\"} 3"),
        "{text}"
    );
    // Idempotent: more passes change nothing.
    let before: i64 = sqlx::query_scalar("SELECT count(*) FROM lifecycle_history")
        .fetch_one(&pool)
        .await
        .unwrap();
    for _ in 0..3 {
        c.lock().await.reconcile_once().await.unwrap();
    }
    let after: i64 = sqlx::query_scalar("SELECT count(*) FROM lifecycle_history")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(before, after);
}

#[sqlx::test(migrator = "tf_core::db::MIGRATOR")]
async fn the_graph_leaves_with_its_last_model_unless_the_base_is_offered(pool: PgPool) {
    let s = setup(&pool, "private-base", false).await;
    offer(&pool, "public-base", 1, true).await;
    let fleet = Arc::new(sim());
    let metrics = Arc::new(FleetMetrics::default());
    let c = tokio::sync::Mutex::new(Controller::new(
        pool.clone(),
        fleet.clone(),
        metrics,
        ControllerOptions::default(),
    ));
    c.lock().await.reconcile_once().await.unwrap();
    // Only the offered base has a graph while no model needs the other.
    assert!(fleet
        .observe_graph("local-sim/public-base")
        .await
        .unwrap()
        .is_some());
    assert!(fleet
        .observe_graph("local-sim/private-base")
        .await
        .unwrap()
        .is_none());

    // A bare upload (stopped) starts no GPUs.
    let (config, weights) = valid_adapter("private-base");
    s.service
        .upload_bytes(s.tenant, "idle", "private-base", config, weights, &actor())
        .await
        .unwrap();
    for _ in 0..5 {
        c.lock().await.reconcile_once().await.unwrap();
    }
    assert_eq!(s.state("idle").await, "stopped");
    assert!(fleet
        .observe_graph("local-sim/private-base")
        .await
        .unwrap()
        .is_none());

    s.started("a", "private-base").await;
    s.started("b", "private-base").await;
    eventually(Duration::from_secs(10), "both ready", || async {
        c.lock().await.reconcile_once().await.unwrap();
        s.state("a").await == "ready" && s.state("b").await == "ready"
    })
    .await;
    assert_eq!(fleet.replicas("local-sim/private-base").await.len(), 2);

    // Deleting one model leaves the graph (the other is started); stopping the last started one
    // takes it down: a stopped model holds no GPUs (issue 30).
    s.service
        .command(s.tenant, "a", Command::Delete, &actor())
        .await
        .unwrap();
    eventually(Duration::from_secs(10), "a gone", || async {
        c.lock().await.reconcile_once().await.unwrap();
        s.state("a").await == "absent"
    })
    .await;
    assert!(fleet
        .observe_graph("local-sim/private-base")
        .await
        .unwrap()
        .is_some());
    s.service
        .command(s.tenant, "b", Command::Stop, &actor())
        .await
        .unwrap();
    eventually(
        Duration::from_secs(10),
        "b stopped, the graph torn down",
        || async {
            c.lock().await.reconcile_once().await.unwrap();
            s.state("b").await == "stopped"
                && fleet
                    .observe_graph("local-sim/private-base")
                    .await
                    .unwrap()
                    .is_none()
        },
    )
    .await;
    // Started again: the graph comes back with it; deleted: gone again.
    s.service
        .command(s.tenant, "b", Command::Start, &actor())
        .await
        .unwrap();
    eventually(Duration::from_secs(10), "b ready again", || async {
        c.lock().await.reconcile_once().await.unwrap();
        s.state("b").await == "ready"
    })
    .await;
    s.service
        .command(s.tenant, "b", Command::Delete, &actor())
        .await
        .unwrap();
    eventually(Duration::from_secs(10), "the graph torn down", || async {
        c.lock().await.reconcile_once().await.unwrap();
        fleet
            .observe_graph("local-sim/private-base")
            .await
            .unwrap()
            .is_none()
    })
    .await;
    assert!(fleet
        .observe_graph("local-sim/public-base")
        .await
        .unwrap()
        .is_some());

    // Replica counts over time: created with 2 replicas, deleted to 0.
    let rows: Vec<(String, Option<i32>)> = sqlx::query_as(
        "SELECT to_state, replicas FROM lifecycle_history WHERE entity = 'graph' AND name = 'local-sim/private-base' ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(rows.first().unwrap().1, Some(2), "{rows:?}");
    assert_eq!(
        rows.last().unwrap(),
        &("deleted".to_owned(), Some(0)),
        "{rows:?}"
    );
    let url: String =
        sqlx::query_scalar("SELECT upstream_url FROM base_models WHERE name = 'private-base'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(url, "", "a base without a graph is not routable");
}

#[sqlx::test(migrator = "tf_core::db::MIGRATOR")]
async fn one_controller_leads_and_another_takes_over(pool: PgPool) {
    offer(&pool, "led-base", 1, true).await;
    let (m1, m2) = (
        Arc::new(FleetMetrics::default()),
        Arc::new(FleetMetrics::default()),
    );
    let (c1, c2) = (CancellationToken::new(), CancellationToken::new());
    let opts = ControllerOptions {
        tick: Duration::from_millis(50),
    };
    tokio::spawn(Controller::new(pool.clone(), Arc::new(sim()), m1.clone(), opts).run(c1.clone()));
    tokio::spawn(Controller::new(pool.clone(), Arc::new(sim()), m2.clone(), opts).run(c2.clone()));
    eventually(Duration::from_secs(10), "a leader", || async {
        m1.is_leader() || m2.is_leader()
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(m1.is_leader() ^ m2.is_leader(), "exactly one leader");
    let (leader, follower, cancel) = if m1.is_leader() {
        (&m1, &m2, &c1)
    } else {
        (&m2, &m1, &c2)
    };
    assert_eq!(follower.passes(), 0, "the follower does not reconcile");
    assert!(leader.passes() > 0);
    cancel.cancel();
    eventually(Duration::from_secs(10), "the other takes over", || async {
        follower.is_leader()
    })
    .await;
    eventually(Duration::from_secs(5), "and reconciles", || async {
        follower.passes() > 0
    })
    .await;
    c1.cancel();
    c2.cancel();
}
