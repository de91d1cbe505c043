//! Dynamo's CRDs as the structural schema the fake API server validates applied bodies against,
//! written field by field from the public repository ai-dynamo/dynamo at commit
//! `50820f5b16d01bf85205a5fa649e76ff68300c65`:
//! `deploy/operator/config/crd/bases/nvidia.com_dynamomodels.yaml` (served as `v1alpha1` and
//! `v1beta1`, the same schema) and, for the graph, `deploy/operator/api/v1beta1/`
//! (`dynamographdeployment_types.go`, `dynamocomponentdeployment_types.go`, `common.go`), the
//! kubebuilder types `nvidia.com_dynamographdeployments.yaml` is generated from; at that commit
//! `v1alpha1` and `v1beta1` give the DGD the same shape (`spec.services`, a map of at most 25).
//! Every field we render and all of its parents are spelled out with their types, enums,
//! minimums and required lists; Kubernetes' own embedded types (pod spec, container, probes) are
//! listed by field name with the inner values we never render left open. An unknown field is
//! refused, as a real API server does under `fieldValidation=Strict`.

use serde_json::Value;

pub enum Schema {
    Str,
    /// An integer, with its minimum when the CRD gives one.
    Int(Option<i64>),
    Bool,
    /// `x-kubernetes-int-or-string` (a resource quantity).
    IntOrStr,
    OneOf(&'static [&'static str]),
    Any,
    /// A list, with its `maxItems` when the CRD gives one.
    List(Box<Schema>, Option<usize>),
    /// `additionalProperties`, with its `maxProperties` when the CRD gives one.
    Map(Box<Schema>, Option<usize>),
    /// Known fields, and which of them are required.
    Obj(Vec<(&'static str, Schema)>, &'static [&'static str]),
}

use Schema::*;

const INT: Schema = Int(None);

fn obj(fields: Vec<(&'static str, Schema)>) -> Schema {
    Obj(fields, &[])
}
fn list(s: Schema) -> Schema {
    List(Box::new(s), None)
}
fn map(s: Schema) -> Schema {
    Map(Box::new(s), None)
}

/// `metav1.ObjectMeta` as an apply body may carry it (the CRD says only `type: object`; the API
/// server's own validation refuses the rest).
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

/// `corev1.EnvVar` (`spec.envs`, a service's `envs`, a container's `env`).
fn env() -> Schema {
    let key_ref = || {
        Obj(
            vec![("key", Str), ("name", Str), ("optional", Bool)],
            &["key"],
        )
    };
    Obj(
        vec![
            ("name", Str),
            ("value", Str),
            (
                "valueFrom",
                obj(vec![
                    ("configMapKeyRef", key_ref()),
                    ("secretKeyRef", key_ref()),
                    (
                        "fieldRef",
                        Obj(
                            vec![("apiVersion", Str), ("fieldPath", Str)],
                            &["fieldPath"],
                        ),
                    ),
                    ("fileKeyRef", Any),
                    ("resourceFieldRef", Any),
                ]),
            ),
        ],
        &["name"],
    )
}

/// `corev1.Container` (`extraPodSpec.mainContainer`).
fn container() -> Schema {
    obj(vec![
        ("name", Str),
        ("image", Str),
        ("command", list(Str)),
        ("args", list(Str)),
        ("env", list(env())),
        ("envFrom", Any),
        ("imagePullPolicy", Str),
        ("lifecycle", Any),
        ("livenessProbe", Any),
        ("ports", Any),
        ("readinessProbe", Any),
        ("resizePolicy", Any),
        ("resources", Any),
        ("restartPolicy", Str),
        ("securityContext", Any),
        ("startupProbe", Any),
        ("stdin", Bool),
        ("stdinOnce", Bool),
        ("terminationMessagePath", Str),
        ("terminationMessagePolicy", Str),
        ("tty", Bool),
        ("volumeDevices", Any),
        ("volumeMounts", Any),
        ("workingDir", Str),
    ])
}

/// `ExtraPodSpec`: `corev1.PodSpec` inline, plus `mainContainer`.
fn extra_pod_spec() -> Schema {
    let mut fields: Vec<(&'static str, Schema)> = [
        "activeDeadlineSeconds",
        "affinity",
        "automountServiceAccountToken",
        "containers",
        "dnsConfig",
        "dnsPolicy",
        "enableServiceLinks",
        "ephemeralContainers",
        "hostAliases",
        "hostIPC",
        "hostNetwork",
        "hostPID",
        "hostUsers",
        "hostname",
        "imagePullSecrets",
        "initContainers",
        "nodeName",
        "nodeSelector",
        "os",
        "overhead",
        "preemptionPolicy",
        "priority",
        "priorityClassName",
        "readinessGates",
        "resourceClaims",
        "resources",
        "restartPolicy",
        "runtimeClassName",
        "schedulerName",
        "schedulingGates",
        "securityContext",
        "serviceAccount",
        "serviceAccountName",
        "setHostnameAsFQDN",
        "shareProcessNamespace",
        "subdomain",
        "terminationGracePeriodSeconds",
        "tolerations",
        "topologySpreadConstraints",
        "volumes",
    ]
    .into_iter()
    .map(|f| (f, Any))
    .collect();
    fields.push(("mainContainer", container()));
    obj(fields)
}

/// `ResourceItem` (`resources.requests`, `resources.limits`): every quantity a string.
fn resource_item() -> Schema {
    obj(vec![
        ("cpu", Str),
        ("memory", Str),
        ("gpu", Str),
        ("gpuType", Str),
        ("custom", map(Str)),
    ])
}

/// `DynamoComponentDeploymentSharedSpec`: one entry of `spec.services`.
fn service() -> Schema {
    obj(vec![
        ("annotations", map(Str)),
        ("labels", map(Str)),
        ("serviceName", Str),
        // A plain string in the CRD (no enum): frontend, worker, planner, epp, ...
        ("componentType", Str),
        ("subComponentType", Str),
        ("dynamoNamespace", Str),
        ("globalDynamoNamespace", Bool),
        (
            "resources",
            obj(vec![
                ("requests", resource_item()),
                ("limits", resource_item()),
                ("claims", Any),
            ]),
        ),
        (
            "autoscaling",
            obj(vec![
                ("enabled", Bool),
                ("minReplicas", INT),
                ("maxReplicas", INT),
                ("behavior", Any),
                ("metrics", Any),
            ]),
        ),
        ("envs", list(env())),
        ("envFromSecret", Str),
        (
            "volumeMounts",
            list(Obj(
                vec![
                    ("name", Str),
                    ("mountPoint", Str),
                    ("useAsCompilationCache", Bool),
                ],
                &["name"],
            )),
        ),
        (
            "ingress",
            obj(vec![
                ("enabled", Bool),
                ("host", Str),
                ("useVirtualService", Bool),
                ("virtualServiceGateway", Str),
                ("hostPrefix", Str),
                ("annotations", map(Str)),
                ("labels", map(Str)),
                ("tls", obj(vec![("secretName", Str)])),
                ("hostSuffix", Str),
                ("ingressControllerClassName", Str),
            ]),
        ),
        (
            "modelRef",
            Obj(vec![("name", Str), ("revision", Str)], &["name"]),
        ),
        (
            "sharedMemory",
            obj(vec![("disabled", Bool), ("size", IntOrStr)]),
        ),
        (
            "extraPodMetadata",
            obj(vec![("annotations", map(Str)), ("labels", map(Str))]),
        ),
        ("extraPodSpec", extra_pod_spec()),
        ("livenessProbe", Any),
        ("readinessProbe", Any),
        ("replicas", Int(Some(0))),
        (
            "multinode",
            Obj(vec![("nodeCount", Int(Some(2)))], &["nodeCount"]),
        ),
        ("scalingAdapter", obj(vec![("enabled", Bool)])),
        ("eppConfig", Any),
        (
            "checkpoint",
            obj(vec![
                ("enabled", Bool),
                ("mode", OneOf(&["Auto", "Manual"])),
                ("checkpointRef", Str),
                ("identity", Any),
            ]),
        ),
    ])
}

/// `DynamoGraphDeployment` (both served versions: the same schema at this commit).
pub fn graph_deployment() -> Schema {
    Obj(
        vec![
            ("apiVersion", Str),
            ("kind", Str),
            ("metadata", metadata()),
            (
                "spec",
                obj(vec![
                    (
                        "pvcs",
                        List(
                            Box::new(Obj(
                                vec![
                                    ("create", Bool),
                                    ("name", Str),
                                    ("size", IntOrStr),
                                    ("storageClass", Str),
                                    ("volumeAccessMode", Str),
                                ],
                                &["name"],
                            )),
                            Some(100),
                        ),
                    ),
                    ("services", Map(Box::new(service()), Some(25))),
                    ("envs", list(env())),
                    ("backendFramework", OneOf(&["sglang", "vllm", "trtllm"])),
                    (
                        "restart",
                        Obj(
                            vec![
                                ("id", Str),
                                (
                                    "strategy",
                                    obj(vec![
                                        ("type", OneOf(&["Sequential", "Parallel"])),
                                        ("order", list(Str)),
                                    ]),
                                ),
                            ],
                            &["id"],
                        ),
                    ),
                ]),
            ),
        ],
        &["apiVersion", "kind", "metadata", "spec"],
    )
}

/// `DynamoModel` (`v1alpha1` and `v1beta1`: the same schema).
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
                    &["baseModelName", "modelName"],
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
        (IntOrStr, Value::String(_)) => {}
        (IntOrStr, Value::Number(n)) if n.is_i64() || n.is_u64() => {}
        (Int(min), Value::Number(n)) if n.is_i64() || n.is_u64() => {
            if let (Some(min), Some(x)) = (min, n.as_i64()) {
                if x < *min {
                    out.push(format!("{path}: must be at least {min}, got {x}"));
                }
            }
        }
        (OneOf(allowed), Value::String(s)) if allowed.contains(&s.as_str()) => {}
        (OneOf(allowed), _) => out.push(format!("{path}: must be one of {allowed:?}, got {v}")),
        (List(item, max), Value::Array(items)) => {
            if max.is_some_and(|m| items.len() > m) {
                out.push(format!("{path}: more than {max:?} items"));
            }
            for (i, x) in items.iter().enumerate() {
                check(item, x, &format!("{path}[{i}]"), out);
            }
        }
        (Map(item, max), Value::Object(m)) => {
            if max.is_some_and(|n| m.len() > n) {
                out.push(format!("{path}: more than {max:?} properties"));
            }
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
