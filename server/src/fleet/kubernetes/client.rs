//! The few Kubernetes calls the backend makes, on Dynamo's two resources, with errors mapped to
//! [`FleetError`] kinds: server-side apply (`fieldManager=tokenfactory`, `force`, strict field
//! validation so a field the CRD does not define is an error, not silently pruned), get, list by
//! label, delete, and releasing our finalizer with an optimistic-concurrency merge patch.

use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
};
use serde_json::{json, Value};

use crate::fleet::backend::FleetError;
use crate::fleet::dynamo_render::{ApiVersion, FIELD_MANAGER};

/// The plural of graphs and models in Dynamo's API group.
pub const GRAPHS: &str = "dynamographdeployments";
pub const MODELS: &str = "dynamomodels";

/// `nvidia.com/<version>` `dynamographdeployments`.
pub fn graph_resource(version: ApiVersion) -> ApiResource {
    resource(version, "DynamoGraphDeployment", GRAPHS)
}

/// `nvidia.com/<version>` `dynamomodels`.
pub fn model_resource(version: ApiVersion) -> ApiResource {
    resource(version, "DynamoModel", MODELS)
}

fn resource(version: ApiVersion, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("nvidia.com", version.version(), kind),
        plural,
    )
}

/// One resource type in one namespace.
#[derive(Clone)]
pub struct Resource {
    api: Api<DynamicObject>,
    kind: &'static str,
}

impl Resource {
    pub fn new(
        client: kube::Client,
        namespace: &str,
        ar: &ApiResource,
        kind: &'static str,
    ) -> Self {
        Self {
            api: Api::namespaced_with(client, namespace, ar),
            kind,
        }
    }

    /// Server-side apply of `body` (the whole object as we want it); the object as stored.
    pub async fn apply(&self, name: &str, body: &Value) -> Result<Value, FleetError> {
        let params = PatchParams::apply(FIELD_MANAGER)
            .force()
            .validation_strict();
        let obj = self
            .api
            .patch(name, &params, &Patch::Apply(body))
            .await
            .map_err(|e| self.error("apply", name, e))?;
        Ok(to_json(&obj))
    }

    pub async fn get(&self, name: &str) -> Result<Option<Value>, FleetError> {
        let obj = self
            .api
            .get_opt(name)
            .await
            .map_err(|e| self.error("get", name, e))?;
        Ok(obj.as_ref().map(to_json))
    }

    /// The objects carrying every label of `selector` (`k=v,k=v`).
    pub async fn list(&self, selector: &str) -> Result<Vec<Value>, FleetError> {
        let list = self
            .api
            .list(&ListParams::default().labels(selector))
            .await
            .map_err(|e| self.error("list", selector, e))?;
        Ok(list.items.iter().map(to_json).collect())
    }

    /// Deletes the object; `None` when it is gone (or was never there), else the object as it
    /// is now (a finalizer holds it, `deletionTimestamp` set). The API server answers with the
    /// object in both cases; only a remaining finalizer means it is still there.
    pub async fn delete(&self, name: &str) -> Result<Option<Value>, FleetError> {
        match self.api.delete(name, &DeleteParams::background()).await {
            Ok(either) => Ok(either.left().as_ref().map(to_json).filter(|o| {
                o["metadata"]["finalizers"]
                    .as_array()
                    .is_some_and(|f| !f.is_empty())
            })),
            Err(e) if status_code(&e) == Some(404) => Ok(None),
            Err(e) => Err(self.error("delete", name, e)),
        }
    }

    /// Removes `finalizer` from the object, keeping the others. The patch names the
    /// `resourceVersion` it read, so a concurrent change answers 409 (a [`FleetError::Conflict`],
    /// retried) instead of dropping someone else's finalizer.
    pub async fn release(&self, obj: &Value, finalizer: &str) -> Result<(), FleetError> {
        let Some(finalizers) = obj["metadata"]["finalizers"].as_array() else {
            return Ok(());
        };
        if !finalizers.iter().any(|f| f == finalizer) {
            return Ok(());
        }
        let name = obj["metadata"]["name"].as_str().unwrap_or_default();
        let rest: Vec<&Value> = finalizers.iter().filter(|f| *f != finalizer).collect();
        let patch = json!({"metadata": {
            "resourceVersion": obj["metadata"]["resourceVersion"],
            "finalizers": rest,
        }});
        match self
            .api
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if status_code(&e) == Some(404) => Ok(()),
            Err(e) => Err(self.error("release finalizer of", name, e)),
        }
    }

    fn error(&self, verb: &str, name: &str, e: kube::Error) -> FleetError {
        let what = format!("{verb} {} {name}: {e}", self.kind);
        match status_code(&e) {
            Some(409) => FleetError::Conflict(what),
            // Invalid or refused by an admission webhook: the same body will fail again.
            Some(400 | 422) => FleetError::Rejected(what),
            // Anything else (5xx, throttling, RBAC, a missing CRD, no connection) is the
            // cluster's state, not the request's: retry with backoff.
            _ => FleetError::Unavailable(what),
        }
    }
}

/// The HTTP status the API server answered with, when it answered.
fn status_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

fn to_json(obj: &DynamicObject) -> Value {
    serde_json::to_value(obj).unwrap_or(Value::Null)
}
