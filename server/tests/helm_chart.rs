//! The Helm chart in `deploy/helm/tokenfactory`, rendered the way `helm template` does (Debian
//! ships no Helm): each template through Go's template language (`gtmpl`) with `.Values`,
//! `.Release` and `.Chart` and the few Helm functions the chart uses, then parsed as YAML and
//! checked: the RBAC grants exactly what the kubernetes backend calls, secrets come only from
//! a Secret, the probes and ports line up, and every per-base template renders into a valid
//! `DynamoGraphDeployment`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests may fail loudly

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use gtmpl::{Context, FuncError, Template, Value as Gv};
use serde_json::{json, Value};
use tokenfactory::fleet::dynamo_render::{self, ServingTemplate};

fn chart_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/helm/tokenfactory")
}

fn yaml(text: &str) -> Value {
    serde_saphyr::from_str(text).unwrap_or_else(|e| panic!("invalid YAML: {e}\n{text}"))
}

/// serde_json -> the template engine's values.
fn to_gtmpl(v: &Value) -> Gv {
    match v {
        Value::Null => Gv::Nil,
        Value::Bool(b) => Gv::from(*b),
        Value::Number(n) => n
            .as_i64()
            .map(Gv::from)
            .unwrap_or_else(|| Gv::from(n.as_f64().unwrap())),
        Value::String(s) => Gv::from(s.clone()),
        Value::Array(a) => Gv::Array(a.iter().map(to_gtmpl).collect()),
        Value::Object(m) => Gv::Map(
            m.iter()
                .map(|(k, v)| (k.clone(), to_gtmpl(v)))
                .collect::<HashMap<_, _>>(),
        ),
    }
}

fn empty(v: &Gv) -> bool {
    match v {
        Gv::NoValue | Gv::Nil => true,
        Gv::String(s) => s.is_empty(),
        _ => false,
    }
}

/// Helm's `quote`: the value as a double-quoted YAML string.
fn quote(args: &[Gv]) -> Result<Gv, FuncError> {
    let s = args
        .last()
        .map(|v| {
            if empty(v) {
                String::new()
            } else {
                v.to_string()
            }
        })
        .unwrap_or_default();
    Ok(Gv::from(serde_json::to_string(&s).unwrap()))
}

/// Helm's `default D V`: V unless it is empty.
fn default(args: &[Gv]) -> Result<Gv, FuncError> {
    match args {
        [d, v] if empty(v) => Ok(d.clone()),
        [_, v] => Ok(v.clone()),
        [d] => Ok(d.clone()),
        _ => Err(FuncError::ExactlyXArgs("default".into(), 2)),
    }
}

/// Helm's `add`: integer sum.
fn add(args: &[Gv]) -> Result<Gv, FuncError> {
    let mut sum = 0i64;
    for a in args {
        sum += a
            .to_string()
            .parse::<i64>()
            .map_err(|e| FuncError::Generic(e.to_string()))?;
    }
    Ok(Gv::from(sum))
}

/// The template engine's values -> serde_json.
fn from_gtmpl(v: &Gv) -> Value {
    match v {
        Gv::Bool(b) => Value::Bool(*b),
        Gv::Number(n) => n
            .as_i64()
            .map(Value::from)
            .or_else(|| n.as_f64().map(Value::from))
            .unwrap_or(Value::Null),
        Gv::String(s) => Value::String(s.clone()),
        Gv::Array(a) => Value::Array(a.iter().map(from_gtmpl).collect()),
        Gv::Map(m) | Gv::Object(m) => {
            Value::Object(m.iter().map(|(k, v)| (k.clone(), from_gtmpl(v))).collect())
        }
        _ => Value::Null,
    }
}

/// Helm's `toJson`.
fn to_json(args: &[Gv]) -> Result<Gv, FuncError> {
    match args {
        [v] => Ok(Gv::from(from_gtmpl(v).to_string())),
        _ => Err(FuncError::ExactlyXArgs("toJson".into(), 1)),
    }
}

/// `helm template RELEASE . --namespace NS`: every rendered document, parsed.
fn render(release: &str, namespace: &str) -> Vec<Value> {
    let dir = chart_dir();
    let chart = yaml(&std::fs::read_to_string(dir.join("Chart.yaml")).unwrap());
    let values = yaml(&std::fs::read_to_string(dir.join("values.yaml")).unwrap());
    let ctx = json!({
        "Values": values,
        "Release": {"Name": release, "Namespace": namespace},
        "Chart": {"Name": chart["name"], "Version": chart["version"], "AppVersion": chart["appVersion"]},
    });
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir.join("templates"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    let mut docs = Vec::new();
    for file in files {
        let mut t = Template::default();
        t.add_funcs(&[
            ("quote", quote as gtmpl::Func),
            ("default", default),
            ("add", add),
            ("toJson", to_json),
        ]);
        t.parse(std::fs::read_to_string(&file).unwrap()).unwrap();
        let out = t
            .render(&Context::from(to_gtmpl(&ctx)))
            .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        assert!(
            !out.contains("<no value>"),
            "{}: a value is missing:\n{out}",
            file.display()
        );
        for doc in out.split("\n---") {
            let v = yaml(doc);
            if !v.is_null() {
                docs.push(v);
            }
        }
    }
    docs
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

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
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/health");
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
    env_from_secret: String,
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
            env_from_secret: (!b.env_from_secret.is_empty()).then_some(b.env_from_secret),
        };
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
}
