//! ResourceQuota keys for GPUs that the API server accepts but never enforces.
//!
//! The quota system charges extended resources (`nvidia.com/gpu`, the MIG names, any
//! `<domain>/<name>` outside Kubernetes' own domains) only under `requests.<name>`: a ResourceQuota
//! whose `spec.hard` says `nvidia.com/gpu: 4` or `limits.nvidia.com/gpu: 4` is stored as written and
//! limits nothing, so a team believes it has a quota it does not have. Device-class keys
//! (`<class>.deviceclass.resource.k8s.io/devices`) and object counts (`count/...`) are Kubernetes'
//! own names and are left alone.

use serde_json::Value;

/// Domains whose names are Kubernetes' own quota keys, not extended resources.
fn is_kubernetes_domain(domain: &str) -> bool {
    domain == "k8s.io"
        || domain.ends_with(".k8s.io")
        || domain == "kubernetes.io"
        || domain.ends_with(".kubernetes.io")
}

/// The extended resource a quota key names without the `requests.` prefix (`nvidia.com/gpu` for
/// `nvidia.com/gpu` or `limits.nvidia.com/gpu`), or `None` for a key that is enforced as written.
fn unenforced_extended_resource(key: &str) -> Option<&str> {
    if key.starts_with("requests.") || key.starts_with("count/") {
        return None;
    }
    let name = key.strip_prefix("limits.").unwrap_or(key);
    let (domain, local) = name.split_once('/')?;
    (!local.is_empty() && domain.contains('.') && !is_kubernetes_domain(domain)).then_some(name)
}

/// `(field path, problem)` for each key of `spec.hard` that names an extended resource without
/// `requests.`.
pub fn unenforced_keys(object: &Value) -> Vec<(String, String)> {
    let Some(hard) = object.pointer("/spec/hard").and_then(Value::as_object) else {
        return Vec::new();
    };
    hard.keys()
        .filter_map(|key| {
            let name = unenforced_extended_resource(key)?;
            Some((
                format!("spec.hard[\"{key}\"]"),
                format!(
                    "the API server accepts `{key}` but never enforces it: extended resources are \
                     limited only as `requests.{name}` (write `requests.{name}`; it also counts the \
                     devices of claims whose DeviceClass names `{name}` as its extendedResourceName)"
                ),
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_and_limits_keys_of_extended_resources_are_found() {
        let quota = serde_json::json!({
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "gpus", "namespace": "team-a"},
            "spec": {"hard": {
                "nvidia.com/gpu": "4",
                "limits.nvidia.com/mig-1g.10gb": "2",
                "requests.nvidia.com/gpu": "4",
                "gpu.tessera.dev.deviceclass.resource.k8s.io/devices": "4",
                "count/resourceclaims.resource.k8s.io": "10",
                "requests.cpu": "8",
                "limits.memory": "16Gi",
                "pods": "20",
            }},
        });
        let found = unenforced_keys(&quota);
        let paths: Vec<&str> = found.iter().map(|(path, _)| path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "spec.hard[\"limits.nvidia.com/mig-1g.10gb\"]",
                "spec.hard[\"nvidia.com/gpu\"]"
            ]
        );
        assert!(
            found[1].1.contains("write `requests.nvidia.com/gpu`"),
            "{}",
            found[1].1
        );
        assert!(
            found[0]
                .1
                .contains("write `requests.nvidia.com/mig-1g.10gb`"),
            "{}",
            found[0].1
        );
    }

    #[test]
    fn a_quota_without_hard_limits_has_nothing_to_say() {
        assert!(unenforced_keys(&serde_json::json!({"spec": {}})).is_empty());
        assert!(unenforced_keys(&serde_json::json!({"spec": {"hard": "x"}})).is_empty());
    }
}
