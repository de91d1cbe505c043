//! Which version of Dynamo's API group the cluster serves, asked once at start-up
//! (`GET /apis/nvidia.com`, then the chosen version's resource list): `v1beta1` when it serves
//! both of our kinds there, else `v1alpha1`. Everything after renders and requests that version,
//! so one code path runs against an old and a current operator.

use serde_json::Value;

use super::client::{GRAPHS, MODELS};
use crate::fleet::dynamo_render::ApiVersion;

/// Why no version could be chosen; start-up stops with it.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    /// The API server could not be asked.
    #[error("cannot discover Dynamo's API (GET {path}): {source}")]
    Request {
        path: String,
        #[source]
        source: kube::Error,
    },
    /// The group is missing, or serves neither version with both kinds.
    #[error(
        "the cluster serves no usable Dynamo API: nvidia.com must serve dynamographdeployments \
         and dynamomodels at v1beta1 or v1alpha1 (is the Dynamo operator installed?); it serves \
         {0:?}"
    )]
    NotServed(Vec<String>),
}

/// The version to use on the cluster behind `client`.
pub async fn served_version(client: &kube::Client) -> Result<ApiVersion, DiscoveryError> {
    let group = match get(client, "/apis/nvidia.com").await {
        Ok(g) => g,
        Err(DiscoveryError::Request { source, .. }) if status(&source) == Some(404) => {
            return Err(DiscoveryError::NotServed(Vec::new()))
        }
        Err(e) => return Err(e),
    };
    let served = group_versions(&group);
    for version in ApiVersion::PREFERRED {
        if !served.iter().any(|v| v == version.version()) {
            continue;
        }
        let resources = get(client, &format!("/apis/nvidia.com/{}", version.version())).await?;
        if serves_both(&resources) {
            return Ok(version);
        }
    }
    Err(DiscoveryError::NotServed(served))
}

/// The versions an `APIGroup` lists.
pub fn group_versions(group: &Value) -> Vec<String> {
    group["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v["version"].as_str().map(str::to_owned))
        .collect()
}

/// Whether an `APIResourceList` has both of our kinds.
pub fn serves_both(resources: &Value) -> bool {
    let names: Vec<&str> = resources["resources"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["name"].as_str())
        .collect();
    names.contains(&GRAPHS) && names.contains(&MODELS)
}

async fn get(client: &kube::Client, path: &str) -> Result<Value, DiscoveryError> {
    let request =
        http::Request::get(path)
            .body(Vec::new())
            .map_err(|e| DiscoveryError::Request {
                path: path.to_owned(),
                source: kube::Error::HttpError(e),
            })?;
    client
        .request::<Value>(request)
        .await
        .map_err(|source| DiscoveryError::Request {
            path: path.to_owned(),
            source,
        })
}

fn status(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_group_and_resource_lists_are_read() {
        let group = json!({"kind": "APIGroup", "name": "nvidia.com", "versions": [
            {"groupVersion": "nvidia.com/v1beta1", "version": "v1beta1"},
            {"groupVersion": "nvidia.com/v1alpha1", "version": "v1alpha1"}]});
        assert_eq!(group_versions(&group), ["v1beta1", "v1alpha1"]);
        let both = json!({"resources": [{"name": GRAPHS}, {"name": "dynamographdeployments/status"}, {"name": MODELS}]});
        assert!(serves_both(&both));
        let models_only = json!({"resources": [{"name": MODELS}]});
        assert!(!serves_both(&models_only));
    }
}
