//! A fake Kubernetes API server over plain HTTP on loopback, for Dynamo's two resources only. It
//! checks every request the way the real one would refuse it (path with group, version,
//! namespace and plural; `fieldManager`, `force` and `fieldValidation` on applies; content types;
//! bodies against the CRDs' fields; owner references naming a live graph; resourceVersion
//! preconditions), keeps the objects with server-side-apply-like merging, finalizers and owner
//! garbage collection, and plays the operator: scripted status transitions read by read.
//! Whatever it refuses is also recorded as a violation, which tests assert empty.

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
    /// Endpoints the operator finds for a base (DynamoModel `totalEndpoints`).
    endpoints: u32,
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
    /// Serves until the test ends; the operator plays its default script (graphs pending then
    /// successful, models 0/2 then 2/2 endpoints).
    pub async fn start(namespace: &str) -> Self {
        let state = Arc::new(Mutex::new(State {
            operator: true,
            endpoints: 2,
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

    pub fn set_endpoints(&self, n: u32) {
        self.state.lock().unwrap().endpoints = n;
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
        let prefix = format!("/apis/nvidia.com/v1alpha1/namespaces/{}/", self.namespace);
        let Some(rest) = uri.path().strip_prefix(&prefix) else {
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
                st.apply(&self.namespace, &plural, &name, &query, parsed)
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
    fn refuse(&mut self, code: u16, reason: &str, message: String) -> Response {
        self.violations.push(message.clone());
        status(code, reason, message)
    }

    fn get(&mut self, plural: &str, name: &str) -> Response {
        let key = (plural.to_owned(), name.to_owned());
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
            json!({"apiVersion": "nvidia.com/v1alpha1", "kind": "List", "metadata": {"resourceVersion": self.serial.to_string()}, "items": items}),
        )
    }

    fn apply(
        &mut self,
        namespace: &str,
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
        if body["apiVersion"] != "nvidia.com/v1alpha1" || body["kind"] != kind {
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
                if self.operator {
                    let script = self.default_script(plural, &obj);
                    obj["status"] = script[0].clone();
                    self.scripts
                        .insert(key.clone(), script.into_iter().skip(1).collect());
                }
                self.objects.insert(key.clone(), obj.clone());
                obj
            }
        };
        // A graph's new spec (scaled to zero and back, a new template): the operator rolls it
        // out as it did the first one.
        if respecced && plural == GRAPHS && self.operator {
            let script = self.default_script(plural, &obj);
            obj["status"] = script[0].clone();
            if let Some(stored) = self.objects.get_mut(&key) {
                stored["status"] = script[0].clone();
            }
            self.scripts
                .insert(key, script.into_iter().skip(1).collect());
        }
        json_response(200, obj)
    }

    /// What the operator reports after a create: graphs pending, then successful; models found
    /// on every endpoint but loaded nowhere, then everywhere.
    fn default_script(&self, plural: &str, obj: &Value) -> Vec<Value> {
        if plural == GRAPHS {
            let replicas = obj["spec"]["services"]["worker"]["replicas"]
                .as_u64()
                .unwrap_or(1);
            vec![
                json!({"state": "pending"}),
                json!({"state": "successful", "services": {"worker": {"replicas": replicas, "readyReplicas": replicas}}}),
            ]
        } else {
            let n = self.endpoints;
            vec![
                json!({"readyEndpoints": 0, "totalEndpoints": n, "conditions": [
                    {"type": "ServicesFound", "status": "True", "reason": "ServicesFound"},
                    {"type": "EndpointsReady", "status": "False", "reason": "NoReadyEndpoints"}]}),
                json!({"readyEndpoints": n, "totalEndpoints": n, "conditions": [
                    {"type": "ServicesFound", "status": "True", "reason": "ServicesFound"},
                    {"type": "EndpointsReady", "status": "True", "reason": "EndpointsDiscovered"}]}),
            ]
        }
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
