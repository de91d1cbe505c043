//! Dynamo's resources as Token Factory renders them: one `DynamoGraphDeployment` per base model
//! (a frontend and a vLLM worker service, from the base's serving template) and one `DynamoModel`
//! per started adapter (`modelType: lora`). Pure functions from desired state to the JSON the
//! Kubernetes API takes, so the exact bodies are tested without a cluster; the kube backend only
//! applies them. Field names are those of the operator's CRDs (`nvidia.com/v1alpha1`).

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

pub const API_VERSION: &str = "nvidia.com/v1alpha1";
/// The field manager of every server-side apply, so a human's `kubectl edit` of another field is
/// kept and a conflict on ours is visible.
pub const FIELD_MANAGER: &str = "tokenfactory";
/// Labels on everything Token Factory creates: what it is for, and which base.
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
pub const BASE_LABEL: &str = "tokenfactory.dev/base";
/// The worker service's name in the graph.
pub const WORKER: &str = "worker";
pub const FRONTEND: &str = "Frontend";

/// The ranks vLLM accepts for `--max-lora-rank`.
pub const LORA_RANKS: [u64; 9] = [1, 8, 16, 32, 64, 128, 256, 320, 512];

/// How a base is served: what the operator sets per base, passed through to the engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServingTemplate {
    /// The model id the engine loads (`--model`), e.g. `meta-llama/Llama-3.1-8B-Instruct`.
    pub model: String,
    /// The runtime image of both services.
    pub image: String,
    pub gpus_per_replica: u32,
    pub replicas: u32,
    pub tensor_parallel_size: u32,
    pub quantization: Option<String>,
    pub max_loras: u32,
    pub max_lora_rank: u64,
    /// Further engine flags, passed through after ours.
    pub extra_args: Vec<String>,
    /// A Secret whose keys become the worker's environment (a hub token, object-store keys).
    pub env_from_secret: Option<String>,
}

/// Why a template or an adapter cannot be rendered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    #[error("max LoRA rank {0} is not one vLLM accepts ({LORA_RANKS:?})")]
    Rank(u64),
    #[error("{0} must be at least 1")]
    Zero(&'static str),
    #[error("tensor parallel size {tp} needs {tp} GPUs per replica, the template gives {gpus}")]
    Gpus { tp: u32, gpus: u32 },
    #[error("adapter source {0:?} is not an s3:// or hf:// URI (the operator refuses others)")]
    Source(String),
}

impl ServingTemplate {
    pub fn validate(&self) -> Result<(), RenderError> {
        if !LORA_RANKS.contains(&self.max_lora_rank) {
            return Err(RenderError::Rank(self.max_lora_rank));
        }
        for (value, what) in [
            (self.gpus_per_replica, "GPUs per replica"),
            (self.tensor_parallel_size, "tensor parallel size"),
            (self.max_loras, "max LoRAs"),
        ] {
            if value == 0 {
                return Err(RenderError::Zero(what));
            }
        }
        if self.tensor_parallel_size > self.gpus_per_replica {
            return Err(RenderError::Gpus {
                tp: self.tensor_parallel_size,
                gpus: self.gpus_per_replica,
            });
        }
        Ok(())
    }

    /// The worker's engine arguments: ours, then the operator's pass-through flags.
    pub fn engine_args(&self) -> Vec<String> {
        let mut args = vec![
            "--model".to_string(),
            self.model.clone(),
            "--tensor-parallel-size".into(),
            self.tensor_parallel_size.to_string(),
            "--enable-lora".into(),
            "--max-loras".into(),
            self.max_loras.to_string(),
            "--max-lora-rank".into(),
            self.max_lora_rank.to_string(),
        ];
        if let Some(q) = &self.quantization {
            args.extend(["--quantization".into(), q.clone()]);
        }
        args.extend(self.extra_args.iter().cloned());
        args
    }
}

/// A Kubernetes name for a base's graph: DNS-1123, short enough that the operator's derived names
/// (`<graph>-frontend`, `<graph>-worker-…`) stay under 63 characters, and unique per base even
/// when two names sanitise alike (a hash of the exact name is appended).
pub fn graph_name(base: &str) -> String {
    let mut name: String = base
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    name.truncate(32);
    let name = name.trim_matches('-');
    let name = if name.is_empty() { "base" } else { name };
    format!("tf-{name}-{}", &hex_sha256(base)[..8])
}

/// The label value the operator puts on a base's worker pods (first 8 hex characters of the
/// SHA-256 of the base model name); a LoRA `DynamoModel` finds its workers by it.
pub fn base_model_hash(model: &str) -> String {
    hex_sha256(model)[..8].to_string()
}

fn hex_sha256(s: &str) -> String {
    format!("{:x}", Sha256::digest(s.as_bytes()))
}

/// The in-cluster URL of a graph's frontend, from the configurable template (`{graph}` and
/// `{namespace}` are replaced), so a test can point the gateway at a local engine.
pub fn frontend_url(template: &str, graph: &str, namespace: &str) -> String {
    template
        .replace("{graph}", graph)
        .replace("{namespace}", namespace)
}

/// The default frontend URL template: the frontend Service the operator creates.
pub const DEFAULT_FRONTEND_URL: &str = "http://{graph}-frontend.{namespace}.svc:8000/v1";

/// The `DynamoGraphDeployment` of `base` (Token Factory's name of the base, labelled on it).
pub fn graph(base: &str, namespace: &str, t: &ServingTemplate) -> Result<Value, RenderError> {
    t.validate()?;
    let mut worker = json!({
        "componentType": "worker",
        "replicas": t.replicas,
        "resources": {"limits": {"gpu": t.gpus_per_replica.to_string()}},
        "extraPodSpec": {"mainContainer": {
            "image": t.image,
            "command": ["python3", "-m", "dynamo.vllm"],
            "args": t.engine_args(),
            "env": [
                {"name": "DYN_LORA_ENABLED", "value": "true"},
                {"name": "DYN_SYSTEM_ENABLED", "value": "true"},
                {"name": "DYN_SYSTEM_PORT", "value": "9090"},
            ],
        }},
    });
    let mut frontend = json!({
        "componentType": "frontend",
        "replicas": 1,
        "extraPodSpec": {"mainContainer": {"image": t.image}},
    });
    if let Some(secret) = &t.env_from_secret {
        worker["envFromSecret"] = json!(secret);
        frontend["envFromSecret"] = json!(secret);
    }
    Ok(json!({
        "apiVersion": API_VERSION,
        "kind": "DynamoGraphDeployment",
        "metadata": {
            "name": graph_name(base),
            "namespace": namespace,
            "labels": {MANAGED_BY: FIELD_MANAGER, BASE_LABEL: label_value(base)},
        },
        "spec": {"services": {FRONTEND: frontend, WORKER: worker}},
    }))
}

/// The `DynamoModel` of a started adapter: served as `served_name` on the graph of `base`, whose
/// engine loads `model`; owned by the graph's object (`graph_uid`) so deleting the graph removes it.
pub fn lora_model(
    served_name: &str,
    base: &str,
    model: &str,
    source_uri: &str,
    namespace: &str,
    graph_uid: &str,
) -> Result<Value, RenderError> {
    if !(source_uri.starts_with("s3://") || source_uri.starts_with("hf://")) {
        return Err(RenderError::Source(source_uri.to_string()));
    }
    let graph = graph_name(base);
    Ok(json!({
        "apiVersion": API_VERSION,
        "kind": "DynamoModel",
        "metadata": {
            "name": lora_model_name(&graph, served_name),
            "namespace": namespace,
            "labels": {MANAGED_BY: FIELD_MANAGER, BASE_LABEL: label_value(base)},
            "ownerReferences": [{
                "apiVersion": API_VERSION,
                "kind": "DynamoGraphDeployment",
                "name": graph,
                "uid": graph_uid,
                "controller": false,
                "blockOwnerDeletion": true,
            }],
        },
        "spec": {
            "modelName": served_name,
            "baseModelName": model,
            "modelType": "lora",
            "source": {"uri": source_uri},
        },
    }))
}

/// The `DynamoModel` object name of an adapter served as `served_name` on `graph`: unique per
/// served name (hashed, since served names may hold characters Kubernetes names may not).
pub fn lora_model_name(graph: &str, served_name: &str) -> String {
    format!("{graph}-{}", &hex_sha256(served_name)[..10])
}

/// Label values are at most 63 characters of `[A-Za-z0-9._-]`; the graph name is one.
fn label_value(base: &str) -> String {
    graph_name(base)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template() -> ServingTemplate {
        ServingTemplate {
            model: "meta-llama/Llama-3.1-8B-Instruct".into(),
            image: "nvcr.io/nvidia/ai-dynamo/vllm-runtime:0.6.0".into(),
            gpus_per_replica: 2,
            replicas: 1,
            tensor_parallel_size: 2,
            quantization: Some("fp8".into()),
            max_loras: 8,
            max_lora_rank: 64,
            extra_args: vec!["--enforce-eager".into()],
            env_from_secret: Some("hf-token".into()),
        }
    }

    #[test]
    fn the_graph_carries_the_template_into_the_crd_fields() {
        let dgd = graph("llama-3.1-8b", "models", &template()).unwrap_or_default();
        assert_eq!(dgd["kind"], "DynamoGraphDeployment");
        assert_eq!(dgd["apiVersion"], "nvidia.com/v1alpha1");
        assert_eq!(dgd["metadata"]["namespace"], "models");
        let worker = &dgd["spec"]["services"]["worker"];
        assert_eq!(worker["componentType"], "worker");
        assert_eq!(worker["resources"]["limits"]["gpu"], "2");
        assert_eq!(worker["envFromSecret"], "hf-token");
        let args: Vec<&str> = worker["extraPodSpec"]["mainContainer"]["args"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        assert_eq!(
            args.join(" "),
            "--model meta-llama/Llama-3.1-8B-Instruct --tensor-parallel-size 2 --enable-lora \
             --max-loras 8 --max-lora-rank 64 --quantization fp8 --enforce-eager"
        );
        assert_eq!(
            dgd["spec"]["services"]["Frontend"]["componentType"],
            "frontend"
        );
    }

    #[test]
    fn templates_the_engine_would_refuse_are_refused_here() {
        let mut t = template();
        t.max_lora_rank = 48;
        assert_eq!(graph("b", "ns", &t), Err(RenderError::Rank(48)));
        let mut t = template();
        t.tensor_parallel_size = 4;
        assert_eq!(
            graph("b", "ns", &t),
            Err(RenderError::Gpus { tp: 4, gpus: 2 })
        );
        let mut t = template();
        t.max_loras = 0;
        assert_eq!(graph("b", "ns", &t), Err(RenderError::Zero("max LoRAs")));
    }

    #[test]
    fn graph_names_are_dns_labels_unique_per_base() {
        let a = graph_name("Meta-Llama/Llama 3.1 8B Instruct (with a very long suffix)");
        assert!(a.len() <= 63 - "-frontend".len(), "{a}");
        assert!(a
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'));
        assert!(!a.contains("--frontend"));
        assert_ne!(
            graph_name("a/b"),
            graph_name("a-b"),
            "sanitised alike, still distinct"
        );
        assert_eq!(graph_name("a/b"), graph_name("a/b"));
    }

    #[test]
    fn a_lora_model_names_its_base_and_is_owned_by_the_graph() {
        let m = lora_model(
            "acme/support-bot",
            "llama",
            "meta-llama/Llama-3.1-8B-Instruct",
            "s3://adapters/acme/support-bot/v3",
            "models",
            "uid-1",
        )
        .unwrap_or_default();
        assert_eq!(m["kind"], "DynamoModel");
        assert_eq!(m["spec"]["modelType"], "lora");
        assert_eq!(m["spec"]["modelName"], "acme/support-bot");
        assert_eq!(
            m["spec"]["baseModelName"],
            "meta-llama/Llama-3.1-8B-Instruct"
        );
        assert_eq!(
            m["spec"]["source"]["uri"],
            "s3://adapters/acme/support-bot/v3"
        );
        assert_eq!(m["metadata"]["ownerReferences"][0]["uid"], "uid-1");
        assert_eq!(
            m["metadata"]["ownerReferences"][0]["name"],
            graph_name("llama")
        );
        let refused = lora_model("x", "llama", "m", "file:///etc/passwd", "models", "u");
        assert!(matches!(refused, Err(RenderError::Source(_))));
    }

    #[test]
    fn the_base_model_hash_is_the_operators_label() {
        // sha256("Qwen/Qwen3-0.6B"), first 8 hex characters.
        let expected = format!("{:x}", Sha256::digest(b"Qwen/Qwen3-0.6B"));
        assert_eq!(base_model_hash("Qwen/Qwen3-0.6B"), expected[..8]);
        assert_eq!(
            frontend_url(DEFAULT_FRONTEND_URL, "tf-llama-1234", "models"),
            "http://tf-llama-1234-frontend.models.svc:8000/v1"
        );
    }
}
