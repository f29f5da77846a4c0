//! `/version` and the legacy (unaggregated) discovery documents: `/api`, `/api/v1`, `/apis`,
//! `/apis/<group>`, `/apis/<group>/<version>`.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::resources::{BUILTIN_RESOURCES, ResourceType};

/// The `/version` document for a `gitVersion` such as `v1.35.0`.
pub fn version_info(git_version: &str) -> Value {
    let trimmed = git_version.trim_start_matches('v');
    let mut parts = trimmed.split('.');
    let major = parts.next().unwrap_or_default();
    let minor = parts.next().unwrap_or_default();
    json!({
        "major": major,
        "minor": minor,
        "gitVersion": git_version,
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.26.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

/// The discovery document for `path`, if it is one.
pub fn document(path: &str) -> Option<Value> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    match segments.as_slice() {
        ["api"] => Some(json!({
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}],
        })),
        ["api", "v1"] => Some(resource_list("", "v1")),
        ["apis"] => Some(json!({
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": groups().iter().map(|(name, versions)| group(name, versions)).collect::<Vec<_>>(),
        })),
        ["apis", name] => {
            let groups = groups();
            let versions = groups.get(*name)?;
            let mut document = group(name, versions);
            document["kind"] = json!("APIGroup");
            document["apiVersion"] = json!("v1");
            Some(document)
        }
        ["apis", name, version] => {
            let known = BUILTIN_RESOURCES
                .iter()
                .any(|r| r.group == *name && r.version == *version);
            known.then(|| resource_list(name, version))
        }
        _ => None,
    }
}

fn groups() -> BTreeMap<&'static str, Vec<&'static str>> {
    let mut groups: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for resource in BUILTIN_RESOURCES.iter().filter(|r| !r.group.is_empty()) {
        let versions = groups.entry(resource.group).or_default();
        if !versions.contains(&resource.version) {
            versions.push(resource.version);
        }
    }
    groups
}

fn group(name: &str, versions: &[&str]) -> Value {
    let versions: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{name}/{v}"), "version": v}))
        .collect();
    json!({
        "name": name,
        "versions": versions,
        "preferredVersion": versions[0],
    })
}

fn resource_list(group: &str, version: &str) -> Value {
    let mut resources = Vec::new();
    for resource in BUILTIN_RESOURCES
        .iter()
        .filter(|r| r.group == group && r.version == version)
    {
        resources.push(api_resource(resource));
        if resource.status_subresource {
            resources.push(json!({
                "name": format!("{}/status", resource.plural),
                "singularName": "",
                "namespaced": resource.namespaced,
                "kind": resource.kind,
                "verbs": ["get", "patch", "update"],
            }));
        }
    }
    let group_version = if group.is_empty() {
        version.to_owned()
    } else {
        format!("{group}/{version}")
    };
    json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": resources,
    })
}

fn api_resource(resource: &ResourceType) -> Value {
    json!({
        "name": resource.plural,
        "singularName": resource.kind.to_lowercase(),
        "namespaced": resource.namespaced,
        "kind": resource.kind,
        "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discovery_lists_every_served_type() {
        let core = document("/api/v1").unwrap();
        let names: Vec<&str> = core["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap())
            .collect();
        assert!(names.contains(&"nodes") && names.contains(&"pods/status"));
        let resource = document("/apis/resource.k8s.io/v1").unwrap();
        assert_eq!(resource["groupVersion"], "resource.k8s.io/v1");
        assert!(document("/apis/resource.k8s.io/v1beta1").is_none());
        let groups = document("/apis").unwrap();
        assert!(
            groups["groups"]
                .as_array()
                .unwrap()
                .iter()
                .any(|g| g["name"] == "coordination.k8s.io")
        );
        assert_eq!(document("/apis/events.k8s.io").unwrap()["kind"], "APIGroup");
        assert_eq!(version_info("v1.35.2")["minor"], "35");
    }
}
