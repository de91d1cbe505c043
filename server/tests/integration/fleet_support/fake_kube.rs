//! A fake Kubernetes API server over plain HTTP on loopback, for Dynamo's two resources only. It
//! answers discovery (`/apis/nvidia.com` and each served version's resource list) for the
//! versions a test makes it serve, checks every request the way the real one would refuse it
//! (path with group, a served version, namespace and plural; `fieldManager`, `force` and
//! `fieldValidation` on applies; content types; bodies against the CRDs' schema
//! ([`crd_schema`]) and the body's `apiVersion` against the path's; owner references naming a
//! live graph; resourceVersion preconditions), keeps the objects with server-side-apply-like
//! merging, finalizers and owner garbage collection, and plays the operator:
//! - a graph goes `pending`, then `successful` with its workers' replicas ready, on its first
//!   reads after a create; after a new spec it is `pending` while the old replicas still serve
//!   (a rolling update), then `successful` on the new ones;
//! - a `DynamoModel` finds endpoints only on the worker services of successful graphs whose
//!   `modelRef.name` equals its `baseModelName` (as Dynamo's controller does, through the
//!   headless Service it creates for those workers): `totalEndpoints` is their replicas, the
//!   adapter loads on them on the next read, and the conditions `ServicesFound` and
//!   `EndpointsReady` say so with messages.
//!
//! Applies (PATCH requests) are counted so a test can assert that nothing is written while
//! nothing changed. Whatever it refuses is also recorded as a violation, which tests assert empty.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::crd_schema;

pub const GRAPHS: &str = "dynamographdeployments";
pub const MODELS: &str = "dynamomodels";
const OPERATOR_FINALIZER: &str = "nvidia.com/finalizer";

/// One request as received.
#[derive(Debug, Clone)]
pub struct Request {
    pub method: String,
    pub path: String,
    pub query: BTreeMap<String, String>,
    pub content_type: String,
    pub body: Value,
}

#[derive(Default)]
struct State {
    objects: BTreeMap<(String, String), Value>,
    requests: Vec<Request>,
    violations: Vec<String>,
    /// Statuses an object takes one after another, one per read (the operator's progress).
    scripts: HashMap<(String, String), VecDeque<Value>>,
    /// The next request with this method on this plural answers this status code.
    faults: Vec<(String, String, u16)>,
    serial: u64,
    /// Whether applied objects get the operator's default status script.
    operator: bool,
    /// The versions of `nvidia.com` served, best first.
    versions: Vec<String>,
    /// Per model: the endpoints it was last found on, and whether the adapter is loaded there.
    loads: HashMap<String, (u32, bool)>,
    /// Whether models carry the operator's finalizer (deletion waits for `operator_unloaded`).
    model_finalizer: bool,
}

#[derive(Clone)]
pub struct FakeKube {
    pub addr: SocketAddr,
    pub namespace: String,
    state: Arc<Mutex<State>>,
}

impl FakeKube {
    /// Serves `v1beta1` and `v1alpha1` until the test ends; the operator plays its part.
    pub async fn start(namespace: &str) -> Self {
        Self::serving(namespace, &["v1beta1", "v1alpha1"]).await
    }

    /// Serves only `versions` of Dynamo's group (an older operator: `["v1alpha1"]`).
    pub async fn serving(namespace: &str, versions: &[&str]) -> Self {
        let state = Arc::new(Mutex::new(State {
            operator: true,
            versions: versions.iter().map(|v| (*v).to_owned()).collect(),
            ..State::default()
        }));
        let fake = Self {
            addr: "127.0.0.1:0".parse().unwrap(),
            namespace: namespace.to_owned(),
            state,
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let serving = fake.clone();
        let app = axum::Router::new().fallback(
            move |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| {
                let fake = serving.clone();
                async move { fake.handle(method, uri, headers, body) }
            },
        );
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { addr, ..fake }
    }

    /// A kube config pointing at this server (plain HTTP, no credentials).
    pub fn config(&self) -> kube::Config {
        let mut config = kube::Config::new(format!("http://{}", self.addr).parse().unwrap());
        config.default_namespace = self.namespace.clone();
        config
    }

    pub fn requests(&self) -> Vec<Request> {
        self.state.lock().unwrap().requests.clone()
    }

    pub fn clear_requests(&self) {
        self.state.lock().unwrap().requests.clear();
    }

    /// Server-side applies (PATCH with an apply patch) received on `plural` so far.
    pub fn applies(&self, plural: &str) -> usize {
        self.state
            .lock()
            .unwrap()
            .requests
            .iter()
            .filter(|r| {
                r.method == "PATCH"
                    && r.content_type == "application/apply-patch+yaml"
                    && r.path.contains(&format!("/{plural}/"))
            })
            .count()
    }

    pub fn violations(&self) -> Vec<String> {
        self.state.lock().unwrap().violations.clone()
    }

    pub fn object(&self, plural: &str, name: &str) -> Option<Value> {
        let st = self.state.lock().unwrap();
        st.objects.get(&(plural.into(), name.into())).cloned()
    }

    pub fn names(&self, plural: &str) -> Vec<String> {
        let st = self.state.lock().unwrap();
        st.objects
            .keys()
            .filter(|(p, _)| p == plural)
            .map(|(_, n)| n.clone())
            .collect()
    }

    /// Turns the operator's default script off: objects keep the status the test scripts.
    pub fn manual_operator(&self) {
        self.state.lock().unwrap().operator = false;
    }

    pub fn with_model_finalizer(&self) {
        self.state.lock().unwrap().model_finalizer = true;
    }

    /// The statuses the object shows on its next reads, one per read; the last one stays.
    pub fn script(&self, plural: &str, name: &str, statuses: Vec<Value>) {
        let mut st = self.state.lock().unwrap();
        st.scripts
            .insert((plural.into(), name.into()), statuses.into());
    }

    /// The next `method` request on `plural` answers `code`.
    pub fn fail_next(&self, method: &str, plural: &str, code: u16) {
        let mut st = self.state.lock().unwrap();
        st.faults.push((method.into(), plural.into(), code));
    }

    /// A `kubectl delete` of an object: the API server's side only.
    pub fn delete_outside(&self, plural: &str, name: &str) {
        let mut st = self.state.lock().unwrap();
        st.delete(plural, name);
    }

    /// The operator has unloaded a model: its finalizer goes, and the model with it if deleted.
    pub fn operator_unloaded(&self, name: &str) {
        let mut st = self.state.lock().unwrap();
        let key = (MODELS.to_owned(), name.to_owned());
        if let Some(obj) = st.objects.get_mut(&key) {
            remove_finalizer(obj, OPERATOR_FINALIZER);
        }
        st.collect_if_done(MODELS, name);
    }

    fn handle(&self, method: Method, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
        let query: BTreeMap<String, String> = uri
            .query()
            .unwrap_or("")
            .split('&')
            .filter(|kv| !kv.is_empty())
            .map(|kv| {
                let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                (decode(k), decode(v))
            })
            .collect();
        let content_type = headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let parsed: Value = if body.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&body)
                .unwrap_or_else(|_| json!({"unparsable": String::from_utf8_lossy(&body)}))
        };
        let mut st = self.state.lock().unwrap();
        st.requests.push(Request {
            method: method.to_string(),
            path: uri.path().to_owned(),
            query: query.clone(),
            content_type: content_type.clone(),
            body: parsed.clone(),
        });
        if method == Method::GET {
            if let Some(found) = st.discovery(uri.path()) {
                return found;
            }
        }
        let served = st.versions.clone();
        let Some((version, rest)) = served.iter().find_map(|v| {
            let prefix = format!("/apis/nvidia.com/{v}/namespaces/{}/", self.namespace);
            uri.path()
                .strip_prefix(&prefix)
                .map(|rest| (v.clone(), rest.to_owned()))
        }) else {
            return st.refuse(404, "NotFound", format!("no such path {}", uri.path()));
        };
        let (plural, name) = match rest.split_once('/') {
            Some((p, n)) => (p.to_owned(), Some(n.to_owned())),
            None => (rest.to_owned(), None),
        };
        if plural != GRAPHS && plural != MODELS {
            return st.refuse(404, "NotFound", format!("no resource {plural}"));
        }
        if let Some(at) = st
            .faults
            .iter()
            .position(|(m, p, _)| *m == method.as_str() && *p == plural)
        {
            let (_, _, code) = st.faults.remove(at);
            return status(code, "Scripted", format!("scripted failure {code}"));
        }
        match (method, name) {
            (Method::GET, Some(name)) => st.get(&plural, &name),
            (Method::GET, None) => st.list(&plural, query.get("labelSelector")),
            (Method::PATCH, Some(name)) if content_type == "application/apply-patch+yaml" => {
                st.apply(&self.namespace, &version, &plural, &name, &query, parsed)
            }
            (Method::PATCH, Some(name)) if content_type == "application/merge-patch+json" => {
                st.merge(&plural, &name, parsed)
            }
            (Method::DELETE, Some(name)) => match st.delete(&plural, &name) {
                Some(obj) => json_response(200, obj),
                None => status(404, "NotFound", format!("{plural} \"{name}\" not found")),
            },
            (m, _) => st.refuse(
                405,
                "MethodNotAllowed",
                format!("{m} {} ({content_type})", uri),
            ),
        }
    }
}

impl State {
    /// The discovery documents: the group, and each served version's resources.
    fn discovery(&self, path: &str) -> Option<Response> {
        if path == "/apis/nvidia.com" {
            let versions: Vec<Value> = self
                .versions
                .iter()
                .map(|v| json!({"groupVersion": format!("nvidia.com/{v}"), "version": v}))
                .collect();
            let body = json!({"kind": "APIGroup", "apiVersion": "v1", "name": "nvidia.com",
                "versions": versions, "preferredVersion": versions.first()});
            return Some(json_response(200, body));
        }
        let version = path.strip_prefix("/apis/nvidia.com/")?;
        if version.contains('/') {
            return None;
        }
        if !self.versions.iter().any(|v| v == version) {
            return Some(status(404, "NotFound", format!("no version {version}")));
        }
        let resource = |name: &str, kind: &str| {
            json!({"name": name, "namespaced": true, "kind": kind,
                "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]})
        };
        Some(json_response(
            200,
            json!({"kind": "APIResourceList", "apiVersion": "v1",
                "groupVersion": format!("nvidia.com/{version}"), "resources": [
                    resource(GRAPHS, "DynamoGraphDeployment"),
                    resource(&format!("{GRAPHS}/status"), "DynamoGraphDeployment"),
                    resource(MODELS, "DynamoModel"),
                    resource(&format!("{MODELS}/status"), "DynamoModel")]}),
        ))
    }

    /// What Dynamo's model controller reports of a model now: endpoints are the replicas of the
    /// successful graphs' worker services whose `modelRef.name` is its `baseModelName`; a LoRA is
    /// loaded on them from the read after they were found.
    fn simulate_model(&mut self, name: &str) -> Option<Value> {
        let model = self.objects.get(&(MODELS.to_owned(), name.to_owned()))?;
        let base = model["spec"]["baseModelName"]
            .as_str()
            .unwrap_or("")
            .to_owned();
        let mut total = 0;
        for ((p, _), g) in &self.objects {
            if p != GRAPHS || g["metadata"]["deletionTimestamp"].is_string() {
                continue;
            }
            // The headless Service's endpoints: the ready pods of each matching worker service.
            for (svc_name, svc) in g["spec"]["services"].as_object().into_iter().flatten() {
                if svc["componentType"] == "worker" && svc["modelRef"]["name"] == base.as_str() {
                    total += g["status"]["services"][svc_name]["readyReplicas"]
                        .as_u64()
                        .unwrap_or(0) as u32;
                }
            }
        }
        let (was, loaded) = self.loads.get(name).copied().unwrap_or((0, false));
        // Loaded where it was: endpoints that go away take nothing from the others; new ones
        // load it on the next read.
        let ready = if total > 0 && was >= total && loaded {
            total
        } else {
            0
        };
        self.loads.insert(name.to_owned(), (total, total > 0));
        let cond = |kind: &str, ok: bool, reason: &str, message: String| {
            json!({"type": kind, "status": if ok { "True" } else { "False" }, "reason": reason,
                "message": message, "lastTransitionTime": "2026-12-03T07:00:00Z"})
        };
        let conditions = if total == 0 {
            vec![
                cond(
                    "ServicesFound",
                    false,
                    "NoServicesFound",
                    format!("no endpoint slices found for base model {base}"),
                ),
                cond(
                    "EndpointsReady",
                    false,
                    "NoEndpoints",
                    "no endpoints found".to_owned(),
                ),
            ]
        } else {
            vec![
                cond(
                    "ServicesFound",
                    true,
                    "ServicesFound",
                    format!("found {total} endpoints"),
                ),
                if ready == total {
                    cond(
                        "EndpointsReady",
                        true,
                        "EndpointsDiscovered",
                        format!("{ready}/{total} endpoints ready"),
                    )
                } else {
                    cond(
                        "EndpointsReady",
                        false,
                        "NotReady",
                        format!("{ready}/{total} endpoints ready"),
                    )
                },
            ]
        };
        let endpoints: Vec<Value> = (0..total)
            .map(|i| json!({"address": format!("http://10.0.0.{i}:9090"), "podName": format!("worker-{i}"), "ready": i < ready}))
            .collect();
        Some(json!({"readyEndpoints": ready, "totalEndpoints": total,
            "endpoints": endpoints, "conditions": conditions}))
    }

    fn refuse(&mut self, code: u16, reason: &str, message: String) -> Response {
        self.violations.push(message.clone());
        status(code, reason, message)
    }

    fn get(&mut self, plural: &str, name: &str) -> Response {
        let key = (plural.to_owned(), name.to_owned());
        if plural == MODELS && self.operator && !self.scripts.contains_key(&key) {
            if let Some(now) = self.simulate_model(name) {
                if let Some(obj) = self.objects.get_mut(&key) {
                    obj["status"] = now;
                }
            }
        }
        let Some(obj) = self.objects.get_mut(&key) else {
            return status(404, "NotFound", format!("{plural} \"{name}\" not found"));
        };
        if let Some(script) = self.scripts.get_mut(&key) {
            if let Some(next) = script.pop_front() {
                obj["status"] = next.clone();
                if script.is_empty() {
                    script.push_back(next);
                }
            }
        }
        json_response(200, obj.clone())
    }

    fn list(&mut self, plural: &str, selector: Option<&String>) -> Response {
        let wanted: Vec<(String, String)> = selector
            .map(|s| {
                s.split(',')
                    .filter_map(|kv| kv.split_once('='))
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    .collect()
            })
            .unwrap_or_default();
        let items: Vec<Value> = self
            .objects
            .iter()
            .filter(|((p, _), _)| p == plural)
            .filter(|(_, o)| {
                wanted
                    .iter()
                    .all(|(k, v)| o["metadata"]["labels"][k] == v.as_str())
            })
            .map(|(_, o)| o.clone())
            .collect();
        json_response(
            200,
            json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": self.serial.to_string()}, "items": items}),
        )
    }

    fn apply(
        &mut self,
        namespace: &str,
        version: &str,
        plural: &str,
        name: &str,
        query: &BTreeMap<String, String>,
        body: Value,
    ) -> Response {
        let mut problems = Vec::new();
        for (k, v) in [
            ("fieldManager", "tokenfactory"),
            ("force", "true"),
            ("fieldValidation", "Strict"),
        ] {
            if query.get(k).map(String::as_str) != Some(v) {
                problems.push(format!("query {k} must be {v}, got {:?}", query.get(k)));
            }
        }
        let (kind, schema) = if plural == GRAPHS {
            ("DynamoGraphDeployment", crd_schema::graph_deployment())
        } else {
            ("DynamoModel", crd_schema::model())
        };
        crd_schema::check(&schema, &body, "", &mut problems);
        if body["apiVersion"] != format!("nvidia.com/{version}").as_str() || body["kind"] != kind {
            problems.push(format!(
                "apiVersion/kind {} {} on {plural}",
                body["apiVersion"], body["kind"]
            ));
        }
        if body["metadata"]["name"] != name || body["metadata"]["namespace"] != namespace {
            problems.push(format!(
                "metadata names {} in {}",
                body["metadata"]["name"], body["metadata"]["namespace"]
            ));
        }
        if plural == MODELS {
            let uri = body["spec"]["source"]["uri"].as_str().unwrap_or("");
            if !(uri.starts_with("s3://") || uri.starts_with("hf://")) {
                problems.push(format!(
                    "admission webhook: source.uri {uri:?} is not s3:// or hf://"
                ));
            }
            for owner in body["metadata"]["ownerReferences"]
                .as_array()
                .into_iter()
                .flatten()
            {
                let graph = self.objects.get(&(
                    GRAPHS.to_owned(),
                    owner["name"].as_str().unwrap_or("").to_owned(),
                ));
                if graph.map(|g| &g["metadata"]["uid"]) != Some(&owner["uid"]) {
                    problems.push(format!(
                        "owner {} uid {} is not a live graph",
                        owner["name"], owner["uid"]
                    ));
                }
            }
        }
        if !problems.is_empty() {
            let message = problems.join("; ");
            return self.refuse(422, "Invalid", message);
        }
        self.serial += 1;
        let serial = self.serial;
        let key = (plural.to_owned(), name.to_owned());
        let mut respecced = false;
        let mut obj = match self.objects.get_mut(&key) {
            Some(obj) => {
                let terminating = obj["metadata"]["deletionTimestamp"].is_string();
                let mut finalizers: Vec<Value> = obj["metadata"]["finalizers"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                for f in body["metadata"]["finalizers"]
                    .as_array()
                    .into_iter()
                    .flatten()
                {
                    if !finalizers.contains(f) {
                        if terminating {
                            let m = format!("metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers [{f}]");
                            return self.refuse(422, "Invalid", m);
                        }
                        finalizers.push(f.clone());
                    }
                }
                if obj["spec"] != body["spec"] {
                    let generation = obj["metadata"]["generation"].as_u64().unwrap_or(1);
                    obj["metadata"]["generation"] = json!(generation + 1);
                    respecced = true;
                }
                obj["spec"] = body["spec"].clone();
                obj["metadata"]["labels"] = body["metadata"]["labels"].clone();
                obj["metadata"]["annotations"] = body["metadata"]["annotations"].clone();
                obj["metadata"]["finalizers"] = json!(finalizers);
                if body["metadata"]["ownerReferences"].is_array() {
                    obj["metadata"]["ownerReferences"] =
                        body["metadata"]["ownerReferences"].clone();
                }
                obj["metadata"]["resourceVersion"] = json!(serial.to_string());
                obj.clone()
            }
            None => {
                let mut obj = body.clone();
                obj["metadata"]["uid"] = json!(format!("uid-{serial}"));
                obj["metadata"]["resourceVersion"] = json!(serial.to_string());
                obj["metadata"]["generation"] = json!(1);
                obj["metadata"]["creationTimestamp"] = json!("2026-12-03T07:00:00Z");
                if plural == MODELS && self.model_finalizer {
                    let mut f = obj["metadata"]["finalizers"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default();
                    f.push(json!(OPERATOR_FINALIZER));
                    obj["metadata"]["finalizers"] = json!(f);
                }
                if self.operator && plural == GRAPHS {
                    let script = self.default_script(&obj);
                    obj["status"] = script[0].clone();
                    self.scripts
                        .insert(key.clone(), script.into_iter().skip(1).collect());
                }
                self.objects.insert(key.clone(), obj.clone());
                obj
            }
        };
        // The model controller reacts to a model at once (it finds its endpoints).
        if plural == MODELS && self.operator && !self.scripts.contains_key(&key) {
            if let Some(now) = self.simulate_model(name) {
                obj["status"] = now.clone();
                if let Some(stored) = self.objects.get_mut(&key) {
                    stored["status"] = now;
                }
            }
        }
        // A graph's new spec (scaled to zero and back, a new template): the operator rolls it
        // out as it did the first one.
        if respecced && plural == GRAPHS && self.operator {
            let mut script = self.default_script(&obj);
            // A rolling update: the replicas ready before keep serving until the new ones are.
            let serving = obj["status"]["services"]["worker"]["readyReplicas"].as_u64();
            let wanted = obj["spec"]["services"]["worker"]["replicas"].as_u64();
            if let (Some(serving), Some(wanted)) = (serving, wanted) {
                if serving > 0 && wanted > 0 {
                    script[0] = json!({"state": "pending", "services": {"worker": {
                        "componentKind": "Deployment", "componentName": "worker",
                        "replicas": serving, "updatedReplicas": 0, "readyReplicas": serving}}});
                }
            }
            obj["status"] = script[0].clone();
            if let Some(stored) = self.objects.get_mut(&key) {
                stored["status"] = script[0].clone();
            }
            self.scripts
                .insert(key, script.into_iter().skip(1).collect());
        }
        json_response(200, obj)
    }

    /// What the operator reports of a graph after a create or a new spec: pending, then
    /// successful with every worker replica ready.
    fn default_script(&self, obj: &Value) -> Vec<Value> {
        let replicas = obj["spec"]["services"]["worker"]["replicas"]
            .as_u64()
            .unwrap_or(1);
        vec![
            json!({"state": "pending"}),
            json!({"state": "successful", "services": {"worker": {
                "componentKind": "Deployment", "componentName": "worker",
                "replicas": replicas, "updatedReplicas": replicas, "readyReplicas": replicas}}}),
        ]
    }

    fn merge(&mut self, plural: &str, name: &str, patch: Value) -> Response {
        let key = (plural.to_owned(), name.to_owned());
        let Some(obj) = self.objects.get(&key) else {
            return status(404, "NotFound", format!("{plural} \"{name}\" not found"));
        };
        let allowed = patch
            .as_object()
            .is_some_and(|p| p.keys().all(|k| k == "metadata"))
            && patch["metadata"].as_object().is_some_and(|m| {
                m.keys()
                    .all(|k| k == "finalizers" || k == "resourceVersion")
            });
        if !allowed {
            return self.refuse(
                422,
                "Invalid",
                format!("merge patch touches more than finalizers: {patch}"),
            );
        }
        if patch["metadata"]["resourceVersion"] != obj["metadata"]["resourceVersion"] {
            return status(
                409,
                "Conflict",
                format!("the object has been modified; {name}"),
            );
        }
        self.serial += 1;
        let serial = self.serial;
        let obj = self.objects.get_mut(&key).unwrap();
        obj["metadata"]["finalizers"] = patch["metadata"]["finalizers"].clone();
        obj["metadata"]["resourceVersion"] = json!(serial.to_string());
        let now = obj.clone();
        self.collect_if_done(plural, name);
        json_response(200, now)
    }

    /// Starts deleting: gone at once without finalizers, else marked with a deletion time.
    fn delete(&mut self, plural: &str, name: &str) -> Option<Value> {
        let key = (plural.to_owned(), name.to_owned());
        let obj = self.objects.get_mut(&key)?;
        if !obj["metadata"]["deletionTimestamp"].is_string() {
            obj["metadata"]["deletionTimestamp"] = json!("2026-12-03T07:30:00Z");
        }
        let now = obj.clone();
        self.collect_if_done(plural, name);
        Some(now)
    }

    /// Removes an object being deleted once no finalizer holds it, and (garbage collection)
    /// everything it owns.
    fn collect_if_done(&mut self, plural: &str, name: &str) {
        let key = (plural.to_owned(), name.to_owned());
        let Some(obj) = self.objects.get(&key) else {
            return;
        };
        let held = obj["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| !f.is_empty());
        if held || !obj["metadata"]["deletionTimestamp"].is_string() {
            return;
        }
        let uid = obj["metadata"]["uid"].clone();
        self.objects.remove(&key);
        self.scripts.remove(&key);
        if plural == MODELS {
            self.loads.remove(name);
        }
        let owned: Vec<(String, String)> = self
            .objects
            .iter()
            .filter(|(_, o)| {
                o["metadata"]["ownerReferences"]
                    .as_array()
                    .is_some_and(|refs| refs.iter().any(|r| r["uid"] == uid))
            })
            .map(|(k, _)| k.clone())
            .collect();
        for (p, n) in owned {
            self.delete(&p, &n);
        }
    }
}

fn remove_finalizer(obj: &mut Value, finalizer: &str) {
    if let Some(f) = obj["metadata"]["finalizers"].as_array_mut() {
        f.retain(|x| x != finalizer);
    }
}

fn json_response(code: u16, body: Value) -> Response {
    (
        StatusCode::from_u16(code).unwrap(),
        [("content-type", "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// A `metav1.Status` failure, as the API server answers errors.
fn status(code: u16, reason: &str, message: String) -> Response {
    json_response(
        code,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": message, "reason": reason, "code": code}),
    )
}

fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => out.push(b),
                    Err(_) => out.extend_from_slice(&bytes[i..i + 3]),
                }
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
