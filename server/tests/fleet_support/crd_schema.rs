//! The fields Dynamo's CRDs define (operator `api/v1alpha1`: `DynamoGraphDeployment`,
//! `DynamoComponentDeploymentSharedSpec`, `dynamoCommon.Resources`, `DynamoModel`), as the
//! structural schema the fake API server validates applied bodies against with
//! `fieldValidation=Strict`: an unknown field or a wrong type is refused, as a real API server does.

use serde_json::Value;

pub enum Schema {
    Str,
    Int,
    Bool,
    OneOf(&'static [&'static str]),
    Any,
    List(Box<Schema>),
    Map(Box<Schema>),
    /// Known fields, and which of them are required.
    Obj(Vec<(&'static str, Schema)>, &'static [&'static str]),
}

use Schema::*;

fn obj(fields: Vec<(&'static str, Schema)>) -> Schema {
    Obj(fields, &[])
}
fn list(s: Schema) -> Schema {
    List(Box::new(s))
}
fn map(s: Schema) -> Schema {
    Map(Box::new(s))
}

fn metadata() -> Schema {
    Obj(
        vec![
            ("name", Str),
            ("namespace", Str),
            ("labels", map(Str)),
            ("annotations", map(Str)),
            ("finalizers", list(Str)),
            (
                "ownerReferences",
                list(Obj(
                    vec![
                        ("apiVersion", Str),
                        ("kind", Str),
                        ("name", Str),
                        ("uid", Str),
                        ("controller", Bool),
                        ("blockOwnerDeletion", Bool),
                    ],
                    &["apiVersion", "kind", "name", "uid"],
                )),
            ),
        ],
        &["name"],
    )
}

fn env() -> Schema {
    Obj(
        vec![("name", Str), ("value", Str), ("valueFrom", Any)],
        &["name"],
    )
}

fn container() -> Schema {
    obj(vec![
        ("name", Str),
        ("image", Str),
        ("command", list(Str)),
        ("args", list(Str)),
        ("env", list(env())),
        ("envFrom", Any),
        ("resources", Any),
        ("volumeMounts", Any),
        ("workingDir", Str),
        ("ports", Any),
        ("imagePullPolicy", Str),
        ("securityContext", Any),
        ("livenessProbe", Any),
        ("readinessProbe", Any),
        ("startupProbe", Any),
    ])
}

fn resource_item() -> Schema {
    obj(vec![
        ("cpu", Str),
        ("memory", Str),
        ("gpu", Str),
        ("gpuType", Str),
        ("custom", map(Str)),
    ])
}

fn service() -> Schema {
    obj(vec![
        ("annotations", map(Str)),
        ("labels", map(Str)),
        ("serviceName", Str),
        (
            "componentType",
            OneOf(&["frontend", "worker", "planner", "prefill", "decode", "main"]),
        ),
        ("dynamoNamespace", Str),
        (
            "resources",
            obj(vec![
                ("requests", resource_item()),
                ("limits", resource_item()),
                ("claims", Any),
            ]),
        ),
        ("autoscaling", Any),
        ("envs", list(env())),
        ("envFromSecret", Str),
        ("pvc", Any),
        ("compilationCache", Any),
        ("ingress", Any),
        ("sharedMemory", Any),
        ("extraPodMetadata", Any),
        (
            "extraPodSpec",
            obj(vec![
                ("mainContainer", container()),
                ("volumes", Any),
                ("tolerations", Any),
                ("nodeSelector", map(Str)),
                ("affinity", Any),
                ("serviceAccountName", Str),
                ("imagePullSecrets", Any),
                ("initContainers", Any),
                ("containers", Any),
                ("securityContext", Any),
                ("terminationGracePeriodSeconds", Int),
            ]),
        ),
        ("livenessProbe", Any),
        ("readinessProbe", Any),
        ("replicas", Int),
        ("multinode", Obj(vec![("nodeCount", Int)], &["nodeCount"])),
    ])
}

pub fn graph_deployment() -> Schema {
    Obj(
        vec![
            ("apiVersion", Str),
            ("kind", Str),
            ("metadata", metadata()),
            (
                "spec",
                obj(vec![
                    ("dynamoGraph", Str),
                    ("pvcs", Any),
                    ("services", map(service())),
                    ("envs", list(env())),
                    ("backendFramework", OneOf(&["sglang", "vllm", "trtllm"])),
                ]),
            ),
        ],
        &["apiVersion", "kind", "metadata", "spec"],
    )
}

pub fn model() -> Schema {
    Obj(
        vec![
            ("apiVersion", Str),
            ("kind", Str),
            ("metadata", metadata()),
            (
                "spec",
                Obj(
                    vec![
                        ("modelName", Str),
                        ("baseModelName", Str),
                        ("modelType", OneOf(&["base", "lora", "adapter"])),
                        ("source", Obj(vec![("uri", Str)], &["uri"])),
                    ],
                    &["modelName", "baseModelName"],
                ),
            ),
        ],
        &["apiVersion", "kind", "metadata", "spec"],
    )
}

/// Every violation of `schema` in `v`, as `path: problem` (empty: valid).
pub fn check(schema: &Schema, v: &Value, path: &str, out: &mut Vec<String>) {
    match (schema, v) {
        (Any, _) | (Str, Value::String(_)) | (Bool, Value::Bool(_)) => {}
        (Int, Value::Number(n)) if n.is_i64() || n.is_u64() => {}
        (OneOf(allowed), Value::String(s)) if allowed.contains(&s.as_str()) => {}
        (OneOf(allowed), _) => out.push(format!("{path}: must be one of {allowed:?}, got {v}")),
        (List(item), Value::Array(items)) => {
            for (i, x) in items.iter().enumerate() {
                check(item, x, &format!("{path}[{i}]"), out);
            }
        }
        (Map(item), Value::Object(m)) => {
            for (k, x) in m {
                check(item, x, &format!("{path}.{k}"), out);
            }
        }
        (Obj(fields, required), Value::Object(m)) => {
            for (k, x) in m {
                match fields.iter().find(|(name, _)| name == k) {
                    Some((_, s)) => check(s, x, &format!("{path}.{k}"), out),
                    None => out.push(format!("{path}: unknown field \"{k}\"")),
                }
            }
            for r in *required {
                if !m.contains_key(*r) {
                    out.push(format!("{path}: required field \"{r}\" missing"));
                }
            }
        }
        _ => out.push(format!("{path}: wrong type ({v})")),
    }
}
