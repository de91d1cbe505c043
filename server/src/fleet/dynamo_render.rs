//! Dynamo's resources as Token Factory renders them: one `DynamoGraphDeployment` per base model
//! (a frontend and a vLLM worker service, from the base's serving template and the cluster's
//! pieces: the Hugging Face token and workers' S3 secrets, the shared model-cache PVC) and one
//! `DynamoModel` per started adapter (`modelType: lora`). Pure functions from desired state to the
//! JSON the Kubernetes API takes, so the exact bodies are tested without a cluster; the kube
//! backend only applies them.
//!
//! Field names, types and enums are those of the operator's CRDs in ai-dynamo/dynamo at commit
//! `50820f5b16d01bf85205a5fa649e76ff68300c65` (`deploy/operator/api/v1beta1`, and the generated
//! `config/crd/bases`), where `v1alpha1` and `v1beta1` give the DGD the same shape (a `services`
//! map), so one renderer serves both and only `apiVersion` follows what the cluster serves.
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

/// The API version of both kinds that this renders by default (the current one).
pub const API_VERSION: &str = "nvidia.com/v1beta1";
/// The annotation holding a hash of the rest of the rendered object: the backend skips the
/// apply when the stored object already carries the hash it would write.
pub const SPEC_HASH: &str = "tokenfactory.dev/spec-hash";
/// Where the replica bounds are written on the worker service (see [`graph_with`]).
pub const REPLICAS_MIN: &str = "tokenfactory.dev/replicas-min";
pub const REPLICAS_MAX: &str = "tokenfactory.dev/replicas-max";
/// The default runtime image of both services: the Dynamo vLLM runtime of the current release.
pub const DEFAULT_RUNTIME_IMAGE: &str = "nvcr.io/nvidia/ai-dynamo/vllm-runtime:1.5.0";

/// The versions of Dynamo's API group this renders for, best first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ApiVersion {
    #[default]
    V1beta1,
    V1alpha1,
}

impl ApiVersion {
    /// Preference order when the cluster serves both.
    pub const PREFERRED: [ApiVersion; 2] = [ApiVersion::V1beta1, ApiVersion::V1alpha1];

    /// `v1beta1` / `v1alpha1`.
    pub fn version(self) -> &'static str {
        match self {
            Self::V1beta1 => "v1beta1",
            Self::V1alpha1 => "v1alpha1",
        }
    }

    /// `nvidia.com/<version>`, the objects' `apiVersion`.
    pub fn api_version(self) -> String {
        format!("nvidia.com/{}", self.version())
    }
}

/// What the cluster provides every graph (the chart's values, passed as serve flags).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterPieces {
    /// A Secret holding `HF_TOKEN`: every service's `envFromSecret` (Dynamo's convention), so
    /// gated models download.
    pub hf_token_secret: Option<String>,
    /// A Secret holding `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` (and optionally
    /// `AWS_REGION`, `AWS_ENDPOINT_URL`): the worker downloads `s3://` adapters with them.
    pub worker_s3_secret: Option<String>,
    /// A PersistentVolumeClaim with the model cache, mounted by every worker (Dynamo's
    /// model-caching pattern: one download job fills it, workers only read).
    pub model_cache_pvc: Option<String>,
    /// Where the cache is mounted in the worker (also its `HF_HOME`).
    pub model_cache_mount: String,
}

/// Everything a graph is rendered with besides its template.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RenderContext {
    pub version: ApiVersion,
    pub cluster: ClusterPieces,
    /// The replica ceiling (`replicas_max`); `None` or at most the floor: a fixed count.
    pub replicas_max: Option<u32>,
}
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

    /// [`Self::engine_args`] serving the model as `base`: Token Factory's name of the base is
    /// what the gateway sends upstream as `model`, whatever path the weights come from.
    pub fn engine_args_serving(&self, base: &str) -> Vec<String> {
        let mut args = self.engine_args();
        args.extend(["--served-model-name".to_owned(), base.to_owned()]);
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

/// The `DynamoGraphDeployment` of `base` at the default version, without cluster pieces.
pub fn graph(base: &str, namespace: &str, t: &ServingTemplate) -> Result<Value, RenderError> {
    graph_with(base, namespace, t, &RenderContext::default())
}

/// The `DynamoGraphDeployment` of `base` (Token Factory's name of the base, labelled on it).
///
/// The worker carries `modelRef: {name: <the model it loads>}`: the operator creates a headless
/// Service over such workers, and that is the only way a `DynamoModel` (whose `baseModelName` is
/// the same name) finds its endpoints. It serves the base under Token Factory's name of it
/// (`--served-model-name`), the name the gateway sends as `model`: without it the frontend would
/// list only the model path and answer every request for the base 404.
///
/// Replica bounds: at this commit the DGD's own `autoscaling` (`minReplicas`/`maxReplicas`) is
/// deprecated and ignored by the operator, so it is not rendered. The floor is the worker's
/// `replicas` (what the operator deploys). With a ceiling above the floor the worker enables
/// `scalingAdapter`: the operator then creates a `DynamoGraphDeploymentScalingAdapter` with the
/// Scale subresource, which is the one way the operator takes replica changes from an autoscaler
/// (HPA, KEDA or Planner); the DGDSA itself has no bounds, so both are written as the worker's
/// `annotations` ([`REPLICAS_MIN`], [`REPLICAS_MAX`]) for the autoscaler the cluster points at it.
/// We did not render a Planner service: it needs Prometheus and profiling data per model.
pub fn graph_with(
    base: &str,
    namespace: &str,
    t: &ServingTemplate,
    cx: &RenderContext,
) -> Result<Value, RenderError> {
    t.validate()?;
    let image = if t.image.is_empty() {
        DEFAULT_RUNTIME_IMAGE
    } else {
        t.image.as_str()
    };
    let mut env = vec![
        json!({"name": "DYN_LORA_ENABLED", "value": "true"}),
        json!({"name": "DYN_SYSTEM_ENABLED", "value": "true"}),
        json!({"name": "DYN_SYSTEM_PORT", "value": "9090"}),
    ];
    let cluster = &cx.cluster;
    if cluster.model_cache_pvc.is_some() {
        // vLLM and the hub client read (and, with a writable claim, fill) the cache here.
        env.push(json!({"name": "HF_HOME", "value": cluster.model_cache_mount}));
    }
    let mut worker = json!({
        "componentType": "worker",
        "replicas": t.replicas,
        "modelRef": {"name": t.model},
        "resources": {"limits": {"gpu": t.gpus_per_replica.to_string()}},
        "extraPodSpec": {"mainContainer": {
            "image": image,
            "command": ["python3", "-m", "dynamo.vllm"],
            "args": t.engine_args_serving(base),
            "env": env,
        }},
    });
    let mut frontend = json!({
        "componentType": "frontend",
        "replicas": 1,
        "extraPodSpec": {"mainContainer": {"image": image}},
    });
    // The cluster's token secret wins over a template's: one Secret per service is all the CRD
    // takes (`envFromSecret` is a single name).
    if let Some(secret) = cluster
        .hf_token_secret
        .as_ref()
        .or(t.env_from_secret.as_ref())
    {
        worker["envFromSecret"] = json!(secret);
        frontend["envFromSecret"] = json!(secret);
    }
    if let Some(secret) = &cluster.worker_s3_secret {
        let key = |name: &str, optional: bool| {
            json!({"name": name, "valueFrom": {"secretKeyRef": {
                "name": secret, "key": name, "optional": optional}}})
        };
        worker["envs"] = json!([
            key("AWS_ACCESS_KEY_ID", false),
            key("AWS_SECRET_ACCESS_KEY", false),
            key("AWS_REGION", true),
            key("AWS_ENDPOINT_URL", true),
        ]);
    }
    if let Some(pvc) = &cluster.model_cache_pvc {
        // The CRD's volumeMount has no readOnly: the claim's access mode decides. The chart's
        // claim is ReadWriteMany so the first worker fills HF_HOME and the rest reuse it; a
        // ReadOnlyMany claim filled beforehand makes every mount read-only.
        worker["volumeMounts"] = json!([{"name": pvc, "mountPoint": cluster.model_cache_mount}]);
    }
    if let Some(max) = cx
        .replicas_max
        .filter(|m| *m > t.replicas && t.replicas > 0)
    {
        worker["scalingAdapter"] = json!({"enabled": true});
        worker["annotations"] = json!({
            REPLICAS_MIN: t.replicas.to_string(),
            REPLICAS_MAX: max.to_string(),
        });
    }
    let mut spec = json!({
        "backendFramework": "vllm",
        "services": {FRONTEND: frontend, WORKER: worker},
    });
    if let Some(pvc) = &cluster.model_cache_pvc {
        spec["pvcs"] = json!([{"name": pvc, "create": false}]);
    }
    let mut body = json!({
        "apiVersion": cx.version.api_version(),
        "kind": "DynamoGraphDeployment",
        "metadata": {
            "name": graph_name(base),
            "namespace": namespace,
            "labels": {MANAGED_BY: FIELD_MANAGER, BASE_LABEL: label_value(base)},
        },
        "spec": spec,
    });
    stamp(&mut body);
    Ok(body)
}

/// Writes [`SPEC_HASH`] on `body`: a hash of everything else in it, so an unchanged render is
/// recognised on the stored object without comparing fields the API server adds.
pub fn stamp(body: &mut Value) {
    let hash = hex_sha256(&body.to_string())[..16].to_owned();
    body["metadata"]["annotations"] = json!({SPEC_HASH: hash});
}

/// The hash [`stamp`] wrote on an object, if any.
pub fn stamped(obj: &Value) -> Option<&str> {
    obj["metadata"]["annotations"][SPEC_HASH].as_str()
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
    version: ApiVersion,
) -> Result<Value, RenderError> {
    if !(source_uri.starts_with("s3://") || source_uri.starts_with("hf://")) {
        return Err(RenderError::Source(source_uri.to_string()));
    }
    let graph = graph_name(base);
    let mut body = json!({
        "apiVersion": version.api_version(),
        "kind": "DynamoModel",
        "metadata": {
            "name": lora_model_name(&graph, served_name),
            "namespace": namespace,
            "labels": {MANAGED_BY: FIELD_MANAGER, BASE_LABEL: label_value(base)},
            "ownerReferences": [{
                "apiVersion": version.api_version(),
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
    });
    stamp(&mut body);
    Ok(body)
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
        assert_eq!(dgd["apiVersion"], "nvidia.com/v1beta1");
        assert_eq!(dgd["spec"]["backendFramework"], "vllm");
        assert_eq!(dgd["metadata"]["namespace"], "models");
        let worker = &dgd["spec"]["services"]["worker"];
        assert_eq!(worker["componentType"], "worker");
        assert_eq!(
            worker["modelRef"],
            json!({"name": "meta-llama/Llama-3.1-8B-Instruct"}),
            "the operator finds the workers of a base only by modelRef"
        );
        assert_eq!(worker["resources"]["limits"]["gpu"], "2");
        assert_eq!(worker["envFromSecret"], "hf-token");
        let args: Vec<&str> = worker["extraPodSpec"]["mainContainer"]["args"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        assert_eq!(
            args.join(" "),
            "--model meta-llama/Llama-3.1-8B-Instruct --tensor-parallel-size 2 --enable-lora \
             --max-loras 8 --max-lora-rank 64 --quantization fp8 --enforce-eager \
             --served-model-name llama-3.1-8b"
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
            ApiVersion::V1alpha1,
        )
        .unwrap_or_default();
        assert_eq!(m["apiVersion"], "nvidia.com/v1alpha1");
        assert_eq!(
            m["metadata"]["ownerReferences"][0]["apiVersion"],
            "nvidia.com/v1alpha1"
        );
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
        let refused = lora_model(
            "x",
            "llama",
            "m",
            "file:///etc/passwd",
            "models",
            "u",
            ApiVersion::V1beta1,
        );
        assert!(matches!(refused, Err(RenderError::Source(_))));
    }

    #[test]
    fn cluster_pieces_reach_every_worker() {
        let cx = RenderContext {
            version: ApiVersion::V1alpha1,
            cluster: ClusterPieces {
                hf_token_secret: Some("hf-token-secret".into()),
                worker_s3_secret: Some("tf-worker-s3".into()),
                model_cache_pvc: Some("model-cache".into()),
                model_cache_mount: "/opt/models".into(),
            },
            replicas_max: Some(4),
        };
        let mut t = template();
        t.env_from_secret = None;
        t.image = String::new();
        let dgd = graph_with("llama", "models", &t, &cx).unwrap_or_default();
        assert_eq!(dgd["apiVersion"], "nvidia.com/v1alpha1");
        assert_eq!(
            dgd["spec"]["pvcs"],
            json!([{"name": "model-cache", "create": false}])
        );
        let worker = &dgd["spec"]["services"]["worker"];
        assert_eq!(worker["envFromSecret"], "hf-token-secret");
        assert_eq!(
            dgd["spec"]["services"]["Frontend"]["envFromSecret"],
            "hf-token-secret"
        );
        assert_eq!(
            worker["volumeMounts"],
            json!([{"name": "model-cache", "mountPoint": "/opt/models"}])
        );
        assert_eq!(
            worker["envs"][0]["valueFrom"]["secretKeyRef"],
            json!({"name": "tf-worker-s3", "key": "AWS_ACCESS_KEY_ID", "optional": false})
        );
        assert_eq!(
            worker["extraPodSpec"]["mainContainer"]["image"],
            DEFAULT_RUNTIME_IMAGE
        );
        let env = &worker["extraPodSpec"]["mainContainer"]["env"];
        assert!(env
            .as_array()
            .is_some_and(|e| e.contains(&json!({"name": "HF_HOME", "value": "/opt/models"}))));
        // The floor is what the operator deploys; the ceiling goes with the scaling adapter.
        assert_eq!(worker["replicas"], 1);
        assert_eq!(worker["scalingAdapter"], json!({"enabled": true}));
        assert_eq!(worker["annotations"][REPLICAS_MAX], "4");
        let fixed = graph_with(
            "llama",
            "models",
            &t,
            &RenderContext {
                replicas_max: Some(1),
                ..cx.clone()
            },
        )
        .unwrap_or_default();
        assert!(fixed["spec"]["services"]["worker"]["scalingAdapter"].is_null());
    }

    #[test]
    fn the_spec_hash_changes_with_the_template_only() {
        let a = graph("llama", "models", &template()).unwrap_or_default();
        let b = graph("llama", "models", &template()).unwrap_or_default();
        assert!(stamped(&a).is_some_and(|h| h.len() == 16));
        assert_eq!(stamped(&a), stamped(&b));
        let mut t = template();
        t.max_loras = 4;
        let c = graph("llama", "models", &t).unwrap_or_default();
        assert_ne!(stamped(&a), stamped(&c));
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
