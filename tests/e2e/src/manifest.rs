//! Manifests: the YAML files of deploy/examples and of the chart's DeviceClasses, read into typed
//! objects and server-side applied. Only the kinds Tessera's examples use are accepted, so a typo
//! in a manifest fails here with the file and the document named, not later in the cluster.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Pod, ResourceQuota};
use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice,
};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::api::{Api, Patch, PatchParams};
use serde::de::DeserializeOwned;

use crate::wait::{Progress, until};

/// The field manager of everything the suite writes.
pub const FIELD_MANAGER: &str = "tessera-e2e";

/// One object of a manifest.
#[derive(Debug, Clone)]
pub enum Object {
    Namespace(Namespace),
    DeviceClass(DeviceClass),
    ResourceClaimTemplate(ResourceClaimTemplate),
    ResourceClaim(ResourceClaim),
    Pod(Pod),
    Deployment(Deployment),
    /// Another driver's devices, standing in for it (deploy/examples/gpu-nic-aligned).
    ResourceSlice(ResourceSlice),
    /// A namespace's quota (deploy/examples/gpu-quota).
    ResourceQuota(ResourceQuota),
    /// Pod priorities (deploy/examples/scavenger).
    PriorityClass(PriorityClass),
}

impl Object {
    /// `Kind namespace/name`, for messages.
    pub fn describe(&self) -> String {
        let (kind, meta) = match self {
            Object::Namespace(o) => ("Namespace", &o.metadata),
            Object::DeviceClass(o) => ("DeviceClass", &o.metadata),
            Object::ResourceClaimTemplate(o) => ("ResourceClaimTemplate", &o.metadata),
            Object::ResourceClaim(o) => ("ResourceClaim", &o.metadata),
            Object::Pod(o) => ("Pod", &o.metadata),
            Object::Deployment(o) => ("Deployment", &o.metadata),
            Object::ResourceSlice(o) => ("ResourceSlice", &o.metadata),
            Object::ResourceQuota(o) => ("ResourceQuota", &o.metadata),
            Object::PriorityClass(o) => ("PriorityClass", &o.metadata),
        };
        let name = meta.name.as_deref().unwrap_or("<no name>");
        match &meta.namespace {
            Some(ns) => format!("{kind} {ns}/{name}"),
            None => format!("{kind} {name}"),
        }
    }
}

/// The objects of a set of YAML files, in file and document order.
#[derive(Debug, Clone, Default)]
pub struct Manifest {
    pub objects: Vec<Object>,
}

impl Manifest {
    /// Reads every `*.yaml` file of `dir` (sorted by name).
    pub fn read_dir(dir: &Path) -> anyhow::Result<Self> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .with_context(|| format!("cannot list {}", dir.display()))?
            .filter_map(|entry| entry.ok().map(|e| e.path()))
            .filter(|path| path.extension().is_some_and(|ext| ext == "yaml"))
            .collect();
        files.sort();
        if files.is_empty() {
            bail!("{} has no *.yaml manifests", dir.display());
        }
        let mut manifest = Manifest::default();
        for file in files {
            manifest.objects.extend(Self::read_file(&file)?.objects);
        }
        Ok(manifest)
    }

    /// Reads one multi-document YAML file.
    pub fn read_file(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("in {}", path.display()))
    }

    /// Parses a multi-document YAML stream. Empty documents are skipped.
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        let mut objects = Vec::new();
        for (index, document) in serde_yaml::Deserializer::from_str(text).enumerate() {
            let value = <serde_yaml::Value as serde::Deserialize>::deserialize(document)
                .with_context(|| format!("document {} is not valid YAML", index + 1))?;
            if value.is_null() {
                continue;
            }
            let json: serde_json::Value = serde_json::to_value(&value)
                .with_context(|| format!("document {}: not representable as JSON", index + 1))?;
            objects
                .push(object_from_json(json).with_context(|| format!("document {}", index + 1))?);
        }
        Ok(Self { objects })
    }

    /// The namespaces the manifest creates.
    pub fn namespaces(&self) -> Vec<String> {
        self.objects
            .iter()
            .filter_map(|o| match o {
                Object::Namespace(ns) => ns.metadata.name.clone(),
                _ => None,
            })
            .collect()
    }

    /// The pods of the manifest.
    pub fn pods(&self) -> impl Iterator<Item = &Pod> {
        self.objects.iter().filter_map(|o| match o {
            Object::Pod(pod) => Some(pod),
            _ => None,
        })
    }

    /// The Deployments of the manifest.
    pub fn deployments(&self) -> impl Iterator<Item = &Deployment> {
        self.objects.iter().filter_map(|o| match o {
            Object::Deployment(d) => Some(d),
            _ => None,
        })
    }

    /// Server-side applies every object, in order; after a ResourceQuota, waits until the API
    /// server enforces it ([`apply_object`]).
    pub async fn apply(&self, client: &kube::Client) -> anyhow::Result<()> {
        for object in &self.objects {
            apply_object(client, object)
                .await
                .with_context(|| format!("cannot apply {}", object.describe()))?;
        }
        Ok(())
    }
}

/// How long a new ResourceQuota may take to be enforced (the quota controller computes its
/// status; until then the API server refuses what the quota covers with "status unknown").
const QUOTA_ACTIVE_TIMEOUT: Duration = Duration::from_secs(60);

fn object_from_json(json: serde_json::Value) -> anyhow::Result<Object> {
    let api_version = json
        .get("apiVersion")
        .and_then(|v| v.as_str())
        .unwrap_or_default()
        .to_owned();
    let kind = json
        .get("kind")
        .and_then(|v| v.as_str())
        .unwrap_or_default()
        .to_owned();
    Ok(match (api_version.as_str(), kind.as_str()) {
        ("v1", "Namespace") => Object::Namespace(typed(json, &kind)?),
        ("v1", "Pod") => Object::Pod(typed(json, &kind)?),
        ("v1", "ResourceQuota") => Object::ResourceQuota(typed(json, &kind)?),
        ("apps/v1", "Deployment") => Object::Deployment(typed(json, &kind)?),
        ("scheduling.k8s.io/v1", "PriorityClass") => Object::PriorityClass(typed(json, &kind)?),
        ("resource.k8s.io/v1", "DeviceClass") => Object::DeviceClass(typed(json, &kind)?),
        ("resource.k8s.io/v1", "ResourceClaimTemplate") => {
            Object::ResourceClaimTemplate(typed(json, &kind)?)
        }
        ("resource.k8s.io/v1", "ResourceClaim") => Object::ResourceClaim(typed(json, &kind)?),
        ("resource.k8s.io/v1", "ResourceSlice") => Object::ResourceSlice(typed(json, &kind)?),
        _ => bail!(
            "apiVersion `{api_version}` kind `{kind}` is not one the e2e suite applies \
             (v1 Namespace/Pod/ResourceQuota; apps/v1 Deployment; scheduling.k8s.io/v1 \
             PriorityClass; resource.k8s.io/v1 DeviceClass/ResourceClaimTemplate/ResourceClaim/\
             ResourceSlice)"
        ),
    })
}

fn typed<T: DeserializeOwned>(json: serde_json::Value, kind: &str) -> anyhow::Result<T> {
    serde_json::from_value(json).with_context(|| format!("not a valid {kind}"))
}

/// Server-side applies one object. A ResourceQuota is waited for until its `status.hard` holds
/// every key of `spec.hard`, so that what the manifest creates next is charged to it.
pub async fn apply_object(client: &kube::Client, object: &Object) -> anyhow::Result<()> {
    apply_one(client, object).await?;
    if let Object::ResourceQuota(quota) = object {
        wait_quota_enforced(client, quota).await?;
    }
    Ok(())
}

async fn wait_quota_enforced(client: &kube::Client, quota: &ResourceQuota) -> anyhow::Result<()> {
    let name = quota
        .metadata
        .name
        .as_deref()
        .context("the quota has no name")?;
    let namespace = quota
        .metadata
        .namespace
        .as_deref()
        .context("the quota has no namespace")?;
    let wanted: Vec<String> = quota
        .spec
        .as_ref()
        .and_then(|s| s.hard.as_ref())
        .map(|h| h.keys().cloned().collect())
        .unwrap_or_default();
    let api = Api::<ResourceQuota>::namespaced(client.clone(), namespace);
    until(
        &format!("ResourceQuota {namespace}/{name} to be enforced"),
        QUOTA_ACTIVE_TIMEOUT,
        || async {
            let current = api.get(name).await?;
            let hard = current.status.and_then(|s| s.hard).unwrap_or_default();
            let missing: Vec<&String> = wanted.iter().filter(|k| !hard.contains_key(*k)).collect();
            Ok(if missing.is_empty() {
                Progress::Done(())
            } else {
                Progress::Waiting(format!("status.hard lacks {missing:?}"))
            })
        },
    )
    .await
}

async fn apply_one(client: &kube::Client, object: &Object) -> anyhow::Result<()> {
    let params = PatchParams::apply(FIELD_MANAGER).force();
    match object {
        Object::Namespace(o) => {
            apply_cluster_scoped::<Namespace>(client, o, &o.metadata, &params).await
        }
        Object::DeviceClass(o) => {
            apply_cluster_scoped::<DeviceClass>(client, o, &o.metadata, &params).await
        }
        Object::ResourceClaimTemplate(o) => {
            apply_namespaced::<ResourceClaimTemplate>(client, o, &o.metadata, &params).await
        }
        Object::ResourceClaim(o) => {
            apply_namespaced::<ResourceClaim>(client, o, &o.metadata, &params).await
        }
        Object::Pod(o) => apply_namespaced::<Pod>(client, o, &o.metadata, &params).await,
        Object::Deployment(o) => {
            apply_namespaced::<Deployment>(client, o, &o.metadata, &params).await
        }
        Object::ResourceSlice(o) => {
            apply_cluster_scoped::<ResourceSlice>(client, o, &o.metadata, &params).await
        }
        Object::ResourceQuota(o) => {
            apply_namespaced::<ResourceQuota>(client, o, &o.metadata, &params).await
        }
        Object::PriorityClass(o) => {
            apply_cluster_scoped::<PriorityClass>(client, o, &o.metadata, &params).await
        }
    }
}

type Meta = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

async fn apply_cluster_scoped<K>(
    client: &kube::Client,
    object: &K,
    meta: &Meta,
    params: &PatchParams,
) -> anyhow::Result<()>
where
    K: kube::Resource<Scope = k8s_openapi::ClusterResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::Serialize
        + DeserializeOwned,
    <K as kube::Resource>::DynamicType: Default,
{
    let name = meta.name.as_deref().context("the object has no name")?;
    Api::<K>::all(client.clone())
        .patch(name, params, &Patch::Apply(object))
        .await?;
    Ok(())
}

async fn apply_namespaced<K>(
    client: &kube::Client,
    object: &K,
    meta: &Meta,
    params: &PatchParams,
) -> anyhow::Result<()>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::Serialize
        + DeserializeOwned,
    <K as kube::Resource>::DynamicType: Default,
{
    let name = meta.name.as_deref().context("the object has no name")?;
    let namespace = meta
        .namespace
        .as_deref()
        .context("the object has no namespace (examples name theirs explicitly)")?;
    Api::<K>::namespaced(client.clone(), namespace)
        .patch(name, params, &Patch::Apply(object))
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repo_root() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
    }

    #[test]
    fn every_example_parses_into_known_kinds_with_its_own_namespace() {
        let examples = repo_root().join("deploy/examples");
        let mut count = 0;
        for entry in std::fs::read_dir(&examples).unwrap() {
            let dir = entry.unwrap().path();
            if !dir.is_dir() {
                continue;
            }
            let name = dir.file_name().unwrap().to_str().unwrap().to_owned();
            let manifest = Manifest::read_dir(&dir).unwrap();
            assert_eq!(
                manifest.namespaces(),
                vec![format!("tessera-example-{name}")],
                "{name}"
            );
            assert!(
                manifest.pods().count() + manifest.deployments().count() >= 1,
                "{name} has no pod or Deployment"
            );
            count += 1;
        }
        assert!(count >= 10, "only {count} examples found");
    }

    #[test]
    fn the_shipped_device_classes_parse() {
        let path = repo_root().join("deploy/helm/tessera/files/deviceclasses.yaml");
        let manifest = Manifest::read_file(&path).unwrap();
        let names: Vec<String> = manifest
            .objects
            .iter()
            .map(|o| match o {
                Object::DeviceClass(c) => c.metadata.name.clone().unwrap(),
                other => panic!("unexpected {}", other.describe()),
            })
            .collect();
        assert_eq!(
            names[..4],
            [
                "gpu.tessera.dev",
                "shared.gpu.tessera.dev",
                "mig.gpu.tessera.dev",
                "imex.gpu.tessera.dev"
            ]
        );
        // One class per MIG profile of the chart's default list, the e2e MIG profile among them.
        assert!(
            names[4..]
                .iter()
                .all(|n| n.starts_with("mig-") && n.ends_with(".gpu.tessera.dev")),
            "{names:?}"
        );
        assert!(
            names.contains(&"mig-1g.10gb.gpu.tessera.dev".to_owned()),
            "{names:?}"
        );
    }

    #[test]
    fn unknown_kinds_and_bad_fields_are_refused_with_the_document_named() {
        let text = "apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n---\n\
                    apiVersion: apps/v1\nkind: StatefulSet\nmetadata: {name: b}\n";
        let error = format!("{:#}", Manifest::parse(text).unwrap_err());
        assert!(
            error.contains("document 2") && error.contains("kind `StatefulSet`"),
            "{error}"
        );
        let text = "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: 3}\n";
        let error = format!("{:#}", Manifest::parse(text).unwrap_err());
        assert!(error.contains("not a valid Pod"), "{error}");
    }

    #[test]
    fn empty_documents_are_skipped() {
        let text =
            "---\n# only a comment\n---\napiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n";
        let manifest = Manifest::parse(text).unwrap();
        assert_eq!(manifest.objects.len(), 1);
        assert_eq!(manifest.objects[0].describe(), "Namespace a");
    }
}
