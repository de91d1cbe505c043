//! The Helm chart in `deploy/helm/tokenfactory`, rendered the way `helm template` does (Debian
//! ships no Helm): each template through Go's template language (`gtmpl`) with `.Values`,
//! `.Release` and `.Chart` and the few Helm functions the chart uses, then parsed as YAML and
//! checked: the RBAC grants exactly what the kubernetes backend calls, secrets come only from
//! a Secret, the probes and ports line up (and the probes answer 200 on the real binary), every
//! per-base template renders into a valid `DynamoGraphDeployment`, `values.yaml` passes
//! `values.schema.json` and bad values do not, the cluster pieces (Hugging Face token, S3
//! credentials, model cache) reach Token Factory's environment, and the pre-delete hook releases
//! exactly Token Factory's finalizer.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests may fail loudly

use crate::common;

use std::collections::BTreeSet;

use common::helm::{check_values, default_values, find, render, render_values, render_with};
use serde_json::{json, Value};
use tokenfactory::fleet::dynamo_render::{self, ServingTemplate};

#[test]
fn every_document_is_a_named_kubernetes_object() {
    let docs = render("tf", "gateway");
    let kinds: BTreeSet<String> = docs
        .iter()
        .map(|d| d["kind"].as_str().unwrap().to_owned())
        .collect();
    let expected: BTreeSet<String> = [
        "ConfigMap",
        "Deployment",
        "Job",
        "Role",
        "RoleBinding",
        "Service",
        "ServiceAccount",
    ]
    .map(String::from)
    .into();
    assert_eq!(kinds, expected);
    for d in &docs {
        assert!(d["apiVersion"].is_string(), "{d}");
        assert!(
            d["metadata"]["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("tf")),
            "{d}"
        );
        assert_eq!(d["metadata"]["namespace"], "gateway");
    }
}

#[test]
fn rbac_grants_exactly_what_the_kubernetes_backend_uses() {
    let docs = render("tf", "gateway");
    let role = find(&docs, "Role", "tf-fleet");
    let mut grants = BTreeSet::new();
    for rule in role["rules"].as_array().unwrap() {
        assert_eq!(
            rule["apiGroups"],
            json!(["nvidia.com"]),
            "only Dynamo's group"
        );
        for r in rule["resources"].as_array().unwrap() {
            for v in rule["verbs"].as_array().unwrap() {
                grants.insert(format!("{}:{}", r.as_str().unwrap(), v.as_str().unwrap()));
            }
        }
    }
    let mut expected = BTreeSet::new();
    for r in ["dynamographdeployments", "dynamomodels"] {
        // get/list: observe and clean up; create+patch: server-side apply; delete: stop/teardown.
        for v in ["get", "list", "create", "patch", "delete"] {
            expected.insert(format!("{r}:{v}"));
        }
        expected.insert(format!("{r}/status:get"));
    }
    // blockOwnerDeletion on a model's owner reference to its graph.
    expected.insert("dynamographdeployments/finalizers:update".to_owned());
    assert_eq!(grants, expected);
    let binding = find(&docs, "RoleBinding", "tf-fleet");
    assert_eq!(binding["roleRef"]["name"], "tf-fleet");
    assert_eq!(binding["subjects"][0]["kind"], "ServiceAccount");
    assert_eq!(binding["subjects"][0]["name"], "tf");
    assert_eq!(binding["subjects"][0]["namespace"], "gateway");
}

#[test]
fn secrets_come_from_a_secret_and_the_pod_uses_the_service_account() {
    let docs = render("tf", "gateway");
    let deploy = find(&docs, "Deployment", "tf");
    let pod = &deploy["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "tf");
    assert_eq!(pod["terminationGracePeriodSeconds"], 45, "drain 30 s + 15");
    let c = &pod["containers"][0];
    for (var, key) in [("DATABASE_URL", "database-url"), ("REDIS_URL", "redis-url")] {
        let env = c["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == var)
            .unwrap();
        assert!(
            env.get("value").is_none(),
            "{var} must not be written in the chart"
        );
        assert_eq!(
            env["valueFrom"]["secretKeyRef"],
            json!({"name": "tokenfactory-secrets", "key": key})
        );
    }
    // Login throttling sees clients through the ingress (its X-Forwarded-For is trusted), and
    // the value parses as the server parses it.
    let proxies = c["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "TF_TRUSTED_PROXIES")
        .unwrap()["value"]
        .as_str()
        .unwrap()
        .to_owned();
    let parsed: tf_app::ssr::client_addr::TrustedProxies = proxies.parse().unwrap();
    assert!(!parsed.is_empty(), "{proxies}");
    let config = find(&docs, "ConfigMap", "tf-config");
    for (k, v) in config["data"].as_object().unwrap() {
        assert!(v.is_string(), "ConfigMap values are strings: {k}");
        assert!(
            !k.contains("DATABASE") && !k.contains("REDIS_URL"),
            "no secrets in a ConfigMap"
        );
    }
    assert_eq!(config["data"]["TF_FLEET"], "kubernetes");
    assert_eq!(
        config["data"]["TF_KUBE_NAMESPACE"], "gateway",
        "defaults to the release namespace"
    );
    assert_eq!(config["data"]["TF_DRAIN_SECONDS"], "30");
    assert_eq!(c["envFrom"][0]["configMapRef"]["name"], "tf-config");
    // The Service reaches the container's named port; probes hit the health endpoint.
    let svc = find(&docs, "Service", "tf");
    assert_eq!(svc["spec"]["ports"][0]["targetPort"], "http");
    assert_eq!(c["ports"][0]["name"], "http");
    assert_eq!(
        svc["spec"]["selector"],
        deploy["spec"]["selector"]["matchLabels"]
    );
    assert_eq!(
        deploy["spec"]["selector"]["matchLabels"],
        deploy["spec"]["template"]["metadata"]["labels"]
    );
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(c["readinessProbe"]["httpGet"]["port"], "http");
    assert_eq!(c["livenessProbe"]["httpGet"]["port"], "http");
    // The named port is the one the binary listens on.
    let port = c["ports"][0]["containerPort"].as_u64().unwrap();
    assert_eq!(config["data"]["TF_LISTEN"], format!("0.0.0.0:{port}"));
    // The image's non-root user.
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(pod["securityContext"]["runAsUser"], 10001);
}

/// The serving template a base's ConfigMap entry holds.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct BaseFile {
    base: String,
    model: String,
    image: String,
    gpus_per_replica: u32,
    replicas: u32,
    tensor_parallel_size: u32,
    quantization: String,
    max_loras: u32,
    max_lora_rank: u64,
    offered: bool,
    replicas_max: Option<u32>,
    /// Per-base override of the Hugging Face secret (the chart's values set none).
    #[serde(default)]
    env_from_secret: Option<String>,
    /// The config.json beside it (loaded in `the_base_configmap_loads_as_base_templates`).
    #[serde(rename = "config_json")]
    _config_json: String,
}

#[test]
fn every_base_template_renders_a_valid_graph() {
    let docs = render("tf", "gateway");
    let bases = find(&docs, "ConfigMap", "tf-bases");
    let data = bases["data"].as_object().unwrap();
    assert_eq!(data.len(), 4, "a template and a config.json per base");
    for (file, text) in data.iter().filter(|(f, _)| f.ends_with(".yaml")) {
        let b: BaseFile = serde_saphyr::from_str(text.as_str().unwrap()).unwrap();
        assert_eq!(file, &format!("{}.yaml", b.base));
        let t = ServingTemplate {
            model: b.model,
            image: b.image,
            gpus_per_replica: b.gpus_per_replica,
            replicas: b.replicas,
            tensor_parallel_size: b.tensor_parallel_size,
            quantization: (!b.quantization.is_empty()).then_some(b.quantization),
            max_loras: b.max_loras,
            max_lora_rank: b.max_lora_rank,
            extra_args: Vec::new(),
            env_from_secret: b.env_from_secret.filter(|s| !s.is_empty()),
        };
        assert!(!b.offered, "{file}: installing the chart starts no GPU");
        assert!(b.replicas_max.is_some_and(|m| m >= b.replicas), "{file}");
        let dgd =
            dynamo_render::graph(&b.base, "gateway", &t).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(dgd["spec"]["services"]["worker"]["replicas"], b.replicas);
    }
}

/// The mounted ConfigMap is what `TF_BASE_TEMPLATES` reads at start-up: its files load through
/// the product's own loader (every field known, each config.json found beside its template).
#[test]
fn the_base_configmap_loads_as_base_templates() {
    let docs = render("tf", "gateway");
    let bases = find(&docs, "ConfigMap", "tf-bases");
    let dir = tempfile::tempdir().unwrap();
    for (file, text) in bases["data"].as_object().unwrap() {
        std::fs::write(dir.path().join(file), text.as_str().unwrap()).unwrap();
    }
    let loaded = tokenfactory::fleet::templates::load(dir.path()).unwrap();
    let names: Vec<&str> = loaded.iter().map(|t| t.base.as_str()).collect();
    assert_eq!(names, ["llama-3.1-8b-instruct", "qwen2.5-7b-instruct"]);
    assert_eq!(loaded[0].row.config_json["hidden_size"], 4096);
    assert_eq!(loaded[1].row.quantization.as_deref(), Some("fp8"));
    assert_eq!(loaded[1].row.config_json["num_key_value_heads"], 4);
    assert!(loaded.iter().all(|t| t.row.tokenizer_json.is_none()));
    // `offered` defaults to true in the loader: the chart must say false explicitly.
    assert!(loaded.iter().all(|t| !t.offered));
    assert!(loaded.iter().all(|t| t.row.replicas_max == 2));
}

/// `values` with the value at the JSON pointer `at` replaced (or removed with `None`).
fn with(mut values: Value, at: &str, value: Option<Value>) -> Value {
    let (parent, key) = at.rsplit_once('/').unwrap();
    let parent = values.pointer_mut(parent).unwrap_or_else(|| panic!("{at}"));
    let map = parent.as_object_mut().unwrap();
    match value {
        Some(v) => map.insert(key.to_owned(), v),
        None => map.remove(key),
    };
    values
}

#[test]
fn values_pass_the_schema_and_bad_values_are_refused() {
    check_values(&default_values()).unwrap();
    let base = "/bases/llama-3.1-8b-instruct";
    let at_base = |k: &str| format!("{base}/{k}");
    // (where, the bad value or None to remove it, what the error must name)
    let bad: Vec<(String, Option<Value>, String)> = vec![
        (
            "/replicaCount".into(),
            Some(json!("two")),
            "/replicaCount".into(),
        ),
        (
            "/replicaCount".into(),
            Some(json!(0)),
            "/replicaCount".into(),
        ),
        (
            "/adapterStore".into(),
            Some(json!("/var/adapters")),
            "/adapterStore".into(),
        ),
        (
            "/huggingface/tokenSecret".into(),
            Some(json!("HF_Token")),
            "/huggingface/tokenSecret".into(),
        ),
        (
            "/modelCache/mountPath".into(),
            Some(json!("cache")),
            "/modelCache/mountPath".into(),
        ),
        (
            "/modelCache/size".into(),
            Some(json!("lots")),
            "/modelCache/size".into(),
        ),
        (
            "/image/pullPolicy".into(),
            Some(json!("Sometimes")),
            "/image/pullPolicy".into(),
        ),
        ("/probes".into(), None, "probes".into()),
        ("/s3".into(), None, "s3".into()),
        ("/typo".into(), Some(json!(1)), "typo".into()),
        (
            at_base("max_lora_rank"),
            Some(json!(48)),
            "/max_lora_rank".into(),
        ),
        (at_base("offered"), Some(json!("no")), "/offered".into()),
        (at_base("gpus"), Some(json!(1)), "gpus".into()),
        (
            at_base("config/hidden_size"),
            Some(json!(0)),
            "/hidden_size".into(),
        ),
    ];
    for (at, value, named) in bad {
        let values = with(default_values(), &at, value.clone());
        let errors = check_values(&values)
            .err()
            .unwrap_or_else(|| panic!("{at} = {value:?} was accepted"));
        assert!(
            errors.iter().any(|e| e.contains(&named)),
            "{at}: the error names it: {errors:?}"
        );
    }
}

fn env_of(docs: &[Value]) -> (Value, Value) {
    let deploy = find(docs, "Deployment", "tf");
    let c = deploy["spec"]["template"]["spec"]["containers"][0].clone();
    let config = find(docs, "ConfigMap", "tf-config")["data"].clone();
    (c, config)
}

/// The Hugging Face token secret, the S3 credentials and the model cache reach Token Factory's
/// environment under the names its flags read; the S3 Secret is also the pod's own `AWS_*`.
#[test]
fn the_cluster_pieces_reach_the_environment() {
    let docs = render("tf", "gateway");
    let (c, config) = env_of(&docs);
    assert_eq!(config["TF_HF_TOKEN_SECRET"], "hf-token");
    assert_eq!(config["TF_WORKER_S3_SECRET"], "tokenfactory-s3");
    assert_eq!(config["TF_MODEL_CACHE_PVC"], "tokenfactory-model-cache");
    assert_eq!(config["TF_MODEL_CACHE_MOUNT"], "/model-cache");
    assert_eq!(config["TF_ADAPTER_START_TIMEOUT"], "900");
    assert!(config["TF_ADAPTER_STORE"]
        .as_str()
        .unwrap()
        .starts_with("s3://"));
    assert_eq!(
        c["envFrom"][1]["secretRef"]["name"], "tokenfactory-s3",
        "the pod's own AWS_* for the adapter store"
    );
    assert!(
        docs.iter().all(|d| d["kind"] != "PersistentVolumeClaim"),
        "an existing PVC by default"
    );
    // Every base runs a current Dynamo vLLM runtime.
    let bases = find(&docs, "ConfigMap", "tf-bases");
    for (file, text) in bases["data"].as_object().unwrap() {
        if file.ends_with(".yaml") {
            let text = text.as_str().unwrap();
            assert!(
                text.contains("nvcr.io/nvidia/ai-dynamo/vllm-runtime:1.3.0"),
                "{file}: {text}"
            );
        }
    }

    // Without an S3 Secret (cloud identity) and without a cache: neither is referenced.
    let values = with(default_values(), "/s3/credentialsSecret", Some(json!("")));
    let values = with(values, "/modelCache/pvc", Some(json!("")));
    let values = with(values, "/huggingface/tokenSecret", Some(json!("")));
    let docs = render_values("tf", "gateway", values);
    let (c, config) = env_of(&docs);
    assert_eq!(c["envFrom"].as_array().unwrap().len(), 1, "{c}");
    for var in [
        "TF_WORKER_S3_SECRET",
        "TF_MODEL_CACHE_PVC",
        "TF_MODEL_CACHE_MOUNT",
        "TF_HF_TOKEN_SECRET",
    ] {
        assert!(config.get(var).is_none(), "{var}: {config}");
    }

    // The chart can make the cache: ReadWriteMany, beside the graphs, kept at uninstall.
    let values = with(default_values(), "/modelCache/create", Some(json!(true)));
    let values = with(values, "/dynamoNamespace", Some(json!("gpus")));
    let docs = render_values("tf", "gateway", values);
    let pvc = find(&docs, "PersistentVolumeClaim", "tokenfactory-model-cache");
    assert_eq!(pvc["metadata"]["namespace"], "gpus");
    assert_eq!(pvc["spec"]["accessModes"], json!(["ReadWriteMany"]));
    assert_eq!(pvc["spec"]["resources"]["requests"]["storage"], "500Gi");
    assert_eq!(
        pvc["metadata"]["annotations"]["helm.sh/resource-policy"],
        "keep"
    );
}

/// The pre-delete hook stops Token Factory, then removes exactly its finalizer from the graphs
/// it labelled, with RBAC for exactly that; it can be turned off.
#[test]
fn the_pre_delete_hook_releases_token_factorys_finalizer() {
    use tokenfactory::fleet::dynamo_render::{FIELD_MANAGER, MANAGED_BY};
    use tokenfactory::fleet::kubernetes::FINALIZER;
    let values = with(default_values(), "/dynamoNamespace", Some(json!("gpus")));
    let docs = render_values("tf", "gateway", values);
    let job = find(&docs, "Job", "tf-cleanup");
    assert_eq!(job["metadata"]["annotations"]["helm.sh/hook"], "pre-delete");
    let pod = &job["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "tf-cleanup");
    let c = &pod["containers"][0];
    let env: std::collections::HashMap<String, String> = c["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap().to_owned(),
                e["value"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(env["FINALIZER"], FINALIZER);
    assert_eq!(env["GRAPH_NAMESPACE"], "gpus");
    assert_eq!(env["RELEASE"], "tf");
    let script = c["args"][0].as_str().unwrap();
    let scale = script.find("kubectl scale deployment").unwrap();
    let patch = script.find("kubectl patch").unwrap();
    assert!(scale < patch, "Token Factory is stopped first: {script}");
    assert!(
        script.contains(&format!("-l {MANAGED_BY}={FIELD_MANAGER}")),
        "{script}"
    );
    assert!(
        script.contains(r#"\"op\":\"test\""#),
        "guarded removal: {script}"
    );
    // Every hook object exists before the Job runs and is removed after.
    for d in docs.iter().filter(|d| {
        d["metadata"]["name"]
            .as_str()
            .is_some_and(|n| n.starts_with("tf-cleanup"))
    }) {
        let a = &d["metadata"]["annotations"];
        assert_eq!(a["helm.sh/hook"], "pre-delete", "{d}");
        let weight: i32 = a["helm.sh/hook-weight"].as_str().unwrap().parse().unwrap();
        assert!(d["kind"] == "Job" || weight < 0, "{d}");
    }
    let role = find(&docs, "Role", "tf-cleanup-graphs");
    assert_eq!(role["metadata"]["namespace"], "gpus");
    assert_eq!(
        role["rules"],
        json!([{"apiGroups": ["nvidia.com"], "resources": ["dynamographdeployments"],
                "verbs": ["get", "list", "patch"]}])
    );
    let binding = find(&docs, "RoleBinding", "tf-cleanup-graphs");
    assert_eq!(binding["subjects"][0]["name"], "tf-cleanup");
    assert_eq!(binding["subjects"][0]["namespace"], "gateway");

    let off = with(default_values(), "/cleanup/enabled", Some(json!(false)));
    let docs = render_values("tf", "gateway", off);
    assert!(docs
        .iter()
        .all(|d| !(d["kind"] == "Job" && d["metadata"]["name"] == "tf-cleanup")));
}

/// Two database roles (issue 31): a pre-install/pre-upgrade Job migrates with the owner's URL
/// (Secret key `migrate-database-url`), which only it gets; the replicas get `database-url`.
#[test]
fn migrations_run_as_the_owner_in_a_hook_job_and_replicas_never_see_its_url() {
    let docs = render("tf", "gateway");
    let job = find(&docs, "Job", "tf-migrate");
    let a = &job["metadata"]["annotations"];
    assert_eq!(a["helm.sh/hook"], "pre-install,pre-upgrade");
    let c = &job["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["args"], json!(["migrate"]));
    let env = c["env"].as_array().unwrap();
    let owner = env
        .iter()
        .find(|e| e["name"] == "TF_MIGRATE_DATABASE_URL")
        .unwrap();
    assert_eq!(
        owner["valueFrom"]["secretKeyRef"],
        json!({"name": "tokenfactory-secrets", "key": "migrate-database-url"})
    );
    assert!(env.iter().all(|e| e["name"] != "TF_GRANT_APP_ROLE"));
    // The replicas never get the owner's URL, nor the flag that lets serve run as the owner.
    let deploy = find(&docs, "Deployment", "tf");
    let text = deploy.to_string();
    assert!(!text.contains("migrate-database-url"), "{text}");
    assert!(!text.contains("TF_ALLOW_OWNER_ROLE"), "{text}");

    let granting = with(
        default_values(),
        "/migrations/grantAppRole",
        Some(json!("tf_serve")),
    );
    let docs = render_values("tf", "gateway", granting);
    let c = &find(&docs, "Job", "tf-migrate")["spec"]["template"]["spec"]["containers"][0];
    assert!(c["env"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["name"] == "TF_GRANT_APP_ROLE" && e["value"] == "tf_serve"));

    let off = with(default_values(), "/migrations/job", Some(json!(false)));
    let docs = render_values("tf", "gateway", off);
    assert!(docs.iter().all(|d| d["metadata"]["name"] != "tf-migrate"));
    // A role name that is not an identifier is refused at install.
    let bad = with(
        default_values(),
        "/migrations/grantAppRole",
        Some(json!("tf; DROP")),
    );
    assert!(check_values(&bad).is_err());
}

/// The probe paths of the rendered Deployment answer 200 on the real binary (spawned as a child
/// process, as the pod runs it).
#[sqlx::test(migrator = "tf_core::db::MIGRATOR")]
async fn the_probes_hit_real_routes_of_the_real_binary(pool: sqlx::PgPool) {
    let docs = render("tf", "gateway");
    let c = &find(&docs, "Deployment", "tf")["spec"]["template"]["spec"]["containers"][0];
    let paths: Vec<String> = ["livenessProbe", "readinessProbe"]
        .iter()
        .map(|p| c[*p]["httpGet"]["path"].as_str().unwrap().to_owned())
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let deployment = common::TestApp::builder(pool).process(dir.path()).await;
    let gw = deployment.start().await;
    for path in &paths {
        let r = reqwest::get(gw.url(path)).await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
    }
    gw.kill().await;
}

/// The chart with its monitoring objects switched on.
fn render_monitoring() -> Vec<Value> {
    render_with("tf", "gateway", |values| {
        for part in ["serviceMonitor", "prometheusRule", "dashboard"] {
            values["monitoring"][part]["enabled"] = json!(true);
        }
    })
}

#[test]
fn metrics_listen_on_their_own_port_reached_only_inside_the_cluster() {
    let docs = render("tf", "gateway");
    let config = find(&docs, "ConfigMap", "tf-config");
    assert_eq!(config["data"]["TF_METRICS_LISTEN"], "0.0.0.0:9464");
    let pod = &find(&docs, "Deployment", "tf")["spec"]["template"]["spec"]["containers"][0];
    assert!(
        pod["ports"]
            .as_array()
            .unwrap()
            .contains(&json!({"name": "metrics", "containerPort": 9464})),
        "{pod}"
    );
    let service = find(&docs, "Service", "tf-metrics");
    assert_eq!(service["spec"]["type"], "ClusterIP");
    assert_eq!(
        service["spec"]["ports"],
        json!([{"name": "metrics", "port": 9464, "targetPort": "metrics"}])
    );
    // The client Service does not carry it.
    let client = find(&docs, "Service", "tf");
    assert_eq!(client["spec"]["ports"].as_array().unwrap().len(), 1);
    // Off by default: the monitoring CRDs may not be installed.
    assert!(!docs
        .iter()
        .any(|d| d["kind"] == "PrometheusRule" || d["kind"] == "ServiceMonitor"));
}

#[test]
fn monitoring_objects_render_when_enabled() {
    let docs = render_monitoring();
    let monitor = find(&docs, "ServiceMonitor", "tf");
    assert_eq!(
        monitor["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"],
        find(&docs, "Service", "tf-metrics")["metadata"]["labels"]["app.kubernetes.io/component"]
    );
    let rule = find(&docs, "PrometheusRule", "tf");
    let alerts: BTreeSet<&str> = rule["spec"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .map(|r| r["alert"].as_str().unwrap())
        .collect();
    for a in [
        "TokenFactoryAvailabilityFastBurn",
        "TokenFactoryTTFTFastBurn",
        "TokenFactoryUsageShipLag",
        "TokenFactoryUsageShipFailures",
        "TokenFactoryWakeFailures",
    ] {
        assert!(alerts.contains(a), "{a} in {alerts:?}");
    }
    let fast = &rule["spec"]["groups"][0]["rules"][0]["expr"];
    assert!(
        fast.as_str().unwrap().contains("(14.4 * 0.005)"),
        "the budget is substituted: {fast}"
    );
    let dashboard = find(&docs, "ConfigMap", "tf-dashboard");
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1");
    let json: Value =
        serde_json::from_str(dashboard["data"]["tokenfactory.json"].as_str().unwrap()).unwrap();
    assert!(json["panels"].as_array().unwrap().len() > 20);
}

/// Traces are off unless a collector is named; set, the pod gets the endpoint and the trusted
/// traceparent peers, and both parse as the server parses them.
#[test]
fn traces_are_off_by_default_and_on_with_a_collector() {
    let env_of = |docs: &[Value]| -> Vec<(String, String)> {
        let d = find(docs, "Deployment", "tf");
        d["spec"]["template"]["spec"]["containers"][0]["env"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|e| {
                Some((
                    e["name"].as_str()?.to_owned(),
                    e["value"].as_str()?.to_owned(),
                ))
            })
            .collect()
    };
    let off = env_of(&render("tf", "serving"));
    assert!(off
        .iter()
        .all(|(k, _)| k != "OTEL_EXPORTER_OTLP_ENDPOINT" && k != "TF_TRUST_TRACEPARENT_FROM"));
    let on = env_of(&render_with("tf", "serving", |v| {
        v["tracing"]["otlpEndpoint"] = json!("http://otel-collector:4318");
        v["tracing"]["trustTraceparentFrom"] = json!("10.0.0.0/8");
    }));
    let get = |k: &str| on.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    assert_eq!(
        get("OTEL_EXPORTER_OTLP_ENDPOINT").as_deref(),
        Some("http://otel-collector:4318")
    );
    let trusted: tf_app::ssr::client_addr::TrustedProxies =
        get("TF_TRUST_TRACEPARENT_FROM").unwrap().parse().unwrap();
    assert!(!trusted.is_empty());
    let mut bad = default_values();
    bad["tracing"]["otlpEndpoint"] = json!("otel-collector:4318");
    assert!(
        check_values(&bad).is_err(),
        "an endpoint without a scheme is refused at install"
    );
}
