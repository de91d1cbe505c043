//! What the operator reports, read back into the backend trait's terms. Pure functions over the
//! objects' JSON, so every mapping is tested without an API server. Unknown or missing status
//! fields read as "not ready yet", never as an error: a freshly applied object has no status.

use serde_json::Value;

use crate::fleet::backend::{AdapterObserved, GraphObserved, Phase};
use crate::fleet::dynamo_render::WORKER;

/// Whether the API server has started deleting the object (a finalizer still holds it).
pub fn terminating(obj: &Value) -> bool {
    obj["metadata"]["deletionTimestamp"].is_string()
}

/// A `DynamoGraphDeployment` as the trait reports it: `status.state` gives the phase, the worker
/// service's replica counts the replicas.
pub fn graph(obj: &Value, frontend_url: String) -> GraphObserved {
    let desired = count(&obj["spec"]["services"][WORKER]["replicas"]).unwrap_or(1);
    let phase = if terminating(obj) {
        Phase::Pending
    } else {
        match obj["status"]["state"].as_str() {
            Some("successful") => Phase::Ready,
            Some("failed") => Phase::Failed(failure_reason(&obj["status"]["conditions"])),
            _ => Phase::Pending,
        }
    };
    // Newer operators report per-service replica counts; older ones only the state.
    let ready = count(&obj["status"]["services"][WORKER]["readyReplicas"])
        .unwrap_or(if phase == Phase::Ready { desired } else { 0 });
    GraphObserved {
        phase,
        replicas_ready: ready,
        replicas_desired: desired,
        frontend_url,
    }
}

/// A LoRA `DynamoModel`: ready when every endpoint the operator found has the adapter loaded.
/// The operator has no failed state for a model (it retries a failed load every 30 s), so a model
/// is pending until all of its endpoints are ready.
pub fn adapter(obj: &Value) -> AdapterObserved {
    let ready = count(&obj["status"]["readyEndpoints"]).unwrap_or(0);
    let total = count(&obj["status"]["totalEndpoints"]).unwrap_or(0);
    let all_ready = total > 0 && ready == total && condition_true(obj, "EndpointsReady");
    AdapterObserved {
        phase: if all_ready && !terminating(obj) {
            Phase::Ready
        } else {
            Phase::Pending
        },
        ready_endpoints: ready,
        total_endpoints: total,
        message: model_message(obj, ready, total),
    }
}

/// Why a model is not (yet) ready, for its owner: the message of the operator's first condition
/// that is not true (`ServicesFound` before `EndpointsReady`), else the endpoint counts.
fn model_message(obj: &Value, ready: u32, total: u32) -> Option<String> {
    let conditions = obj["status"]["conditions"].as_array();
    let failing = conditions
        .into_iter()
        .flatten()
        .find(|c| c["status"] != "True" && matches!(c["type"].as_str(), Some("ServicesFound")));
    let failing = failing.or_else(|| {
        conditions
            .into_iter()
            .flatten()
            .find(|c| c["status"] != "True")
    });
    if let Some(c) = failing {
        let reason = c["reason"].as_str().unwrap_or("NotReady");
        return Some(match c["message"].as_str() {
            Some(m) if !m.is_empty() => format!("{reason}: {m}"),
            _ => reason.to_owned(),
        });
    }
    if total > 0 && ready == total {
        None
    } else if obj["status"].is_null() {
        Some("waiting for the operator".to_owned())
    } else {
        Some(format!("loaded on {ready} of {total} endpoints"))
    }
}

/// The model id the graph's worker serves (its `modelRef.name`, else `--model`), which a LoRA
/// `DynamoModel` names as its `baseModelName` so the operator finds the worker pods.
pub fn worker_model(obj: &Value) -> Option<String> {
    if let Some(name) = obj["spec"]["services"][WORKER]["modelRef"]["name"].as_str() {
        return Some(name.to_owned());
    }
    let args =
        obj["spec"]["services"][WORKER]["extraPodSpec"]["mainContainer"]["args"].as_array()?;
    let at = args.iter().position(|a| a == "--model")?;
    args.get(at + 1)?.as_str().map(str::to_owned)
}

fn condition_true(obj: &Value, kind: &str) -> bool {
    obj["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == kind && c["status"] == "True")
    })
}

/// The message of the first condition that is not true, for the owner to read.
fn failure_reason(conditions: &Value) -> String {
    conditions
        .as_array()
        .and_then(|cs| {
            cs.iter().find(|c| c["status"] != "True").map(|c| {
                let reason = c["reason"].as_str().unwrap_or("Failed");
                match c["message"].as_str() {
                    Some(m) if !m.is_empty() => format!("{reason}: {m}"),
                    _ => reason.to_owned(),
                }
            })
        })
        .unwrap_or_else(|| "the operator reports the graph failed".to_owned())
}

fn count(v: &Value) -> Option<u32> {
    v.as_u64().and_then(|n| u32::try_from(n).ok())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn dgd(status: Value) -> Value {
        json!({
            "metadata": {"name": "g"},
            "spec": {"services": {"worker": {"replicas": 2, "extraPodSpec": {"mainContainer": {
                "args": ["--model", "meta-llama/Llama-3.1-8B-Instruct", "--enable-lora"]}}}}},
            "status": status,
        })
    }

    #[test]
    fn graph_state_maps_to_phase_and_replicas() {
        let url = || "http://f/v1".to_owned();
        let fresh = graph(&dgd(Value::Null), url());
        assert_eq!(
            (fresh.phase, fresh.replicas_ready, fresh.replicas_desired),
            (Phase::Pending, 0, 2)
        );
        let ok = graph(&dgd(json!({"state": "successful"})), url());
        assert_eq!((ok.phase, ok.replicas_ready), (Phase::Ready, 2));
        let partial = graph(
            &dgd(json!({"state": "pending", "services": {"worker": {"readyReplicas": 1}}})),
            url(),
        );
        assert_eq!((partial.phase, partial.replicas_ready), (Phase::Pending, 1));
        let failed = graph(
            &dgd(json!({"state": "failed", "conditions": [
                {"type": "Ready", "status": "False", "reason": "Unschedulable", "message": "0/3 nodes have GPUs"}
            ]})),
            url(),
        );
        assert_eq!(
            failed.phase,
            Phase::Failed("Unschedulable: 0/3 nodes have GPUs".into())
        );
        let mut going = dgd(json!({"state": "successful"}));
        going["metadata"]["deletionTimestamp"] = json!("2026-12-03T07:00:00Z");
        assert_eq!(graph(&going, url()).phase, Phase::Pending);
    }

    #[test]
    fn a_model_is_ready_only_on_every_endpoint() {
        let model = |ready: u32, total: u32, cond: &str| {
            json!({"status": {"readyEndpoints": ready, "totalEndpoints": total,
                "conditions": [{"type": "EndpointsReady", "status": cond}]}})
        };
        assert_eq!(adapter(&json!({})).phase, Phase::Pending);
        assert_eq!(adapter(&model(0, 2, "False")).phase, Phase::Pending);
        let half = adapter(&model(1, 2, "True"));
        assert_eq!(
            (half.phase, half.ready_endpoints, half.total_endpoints),
            (Phase::Pending, 1, 2)
        );
        assert_eq!(adapter(&model(2, 2, "True")).phase, Phase::Ready);
        assert_eq!(adapter(&model(0, 0, "False")).phase, Phase::Pending);
    }

    #[test]
    fn the_worker_model_is_read_from_its_args() {
        assert_eq!(
            worker_model(&dgd(Value::Null)).as_deref(),
            Some("meta-llama/Llama-3.1-8B-Instruct")
        );
        assert_eq!(worker_model(&json!({"spec": {}})), None);
    }
}
