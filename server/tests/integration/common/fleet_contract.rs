//! The contract every `FleetBackend` keeps, as one function each backend's test runs: every call
//! idempotent ("already there" and "already gone" are successes), observed state that follows
//! the calls, and (when the backend serves on this machine) a frontend that serves a registered
//! adapter's name and forgets it once removed.

use tokenfactory::fleet::backend::{AdapterSpec, FleetBackend, GraphSpec, Phase};

/// Whether the contract may call the graph's frontend over HTTP (not for fake API servers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    Http,
    None,
}

/// Asks the frontend at `url` for one completion from `model`; returns the HTTP status.
pub async fn complete(url: &str, model: &str) -> u16 {
    reqwest::Client::new()
        .post(format!("{url}/chat/completions"))
        .json(&super::chat(model, "hello there", 4))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// Runs the whole contract against `backend` with `graph` and an adapter on it.
pub async fn run(backend: &dyn FleetBackend, graph: GraphSpec, lora: &str, probe: Probe) {
    let replicas = graph.template.replicas;
    assert!(backend.observe_graph(&graph.graph).await.unwrap().is_none());
    let first = backend.apply_graph(&graph).await.unwrap();
    let again = backend.apply_graph(&graph).await.unwrap();
    assert_eq!(
        first.frontend_url, again.frontend_url,
        "apply is idempotent"
    );
    assert_eq!(again.replicas_desired, replicas);
    let seen = super::eventually(
        std::time::Duration::from_secs(10),
        "the graph ready",
        || async {
            backend
                .observe_graph(&graph.graph)
                .await
                .unwrap()
                .filter(|o| o.phase == Phase::Ready)
        },
    )
    .await;
    assert_eq!(seen.replicas_ready, replicas);
    let url = seen.frontend_url.clone();
    if probe == Probe::Http {
        assert_eq!(complete(&url, &graph.base).await, 200, "the base is served");
        assert_eq!(complete(&url, lora).await, 404, "no adapter yet");
    }

    let adapter = AdapterSpec {
        graph: graph.graph.clone(),
        base: graph.base.clone(),
        lora_name: lora.to_owned(),
        source_uri: format!("file:///adapters/{lora}/"),
    };
    assert!(backend.observe_adapter(&adapter).await.unwrap().is_none());
    backend.apply_adapter(&adapter).await.unwrap();
    let applied = backend.apply_adapter(&adapter).await.unwrap();
    assert_eq!(
        applied.total_endpoints, replicas,
        "re-applying is a success"
    );
    let observed = super::eventually(
        std::time::Duration::from_secs(10),
        "the adapter on every replica",
        || async {
            backend
                .observe_adapter(&adapter)
                .await
                .unwrap()
                .filter(|o| o.phase == Phase::Ready)
        },
    )
    .await;
    assert_eq!(observed.ready_endpoints, replicas);
    if probe == Probe::Http {
        // Round-robin frontends: every replica must serve it, so ask more often than there are.
        for _ in 0..replicas * 2 {
            assert_eq!(complete(&url, lora).await, 200, "the adapter is served");
        }
    }

    backend.remove_adapter(&adapter).await.unwrap();
    backend.remove_adapter(&adapter).await.unwrap();
    assert!(backend.observe_adapter(&adapter).await.unwrap().is_none());
    if probe == Probe::Http {
        for _ in 0..replicas * 2 {
            assert_eq!(complete(&url, lora).await, 404, "removed everywhere");
        }
        assert_eq!(complete(&url, &graph.base).await, 200, "the base stays");
    }

    backend.delete_graph(&graph.graph).await.unwrap();
    backend.delete_graph(&graph.graph).await.unwrap();
    assert!(backend.observe_graph(&graph.graph).await.unwrap().is_none());
    // Removing an adapter from a graph that is gone is a success too.
    backend.remove_adapter(&adapter).await.unwrap();
}
