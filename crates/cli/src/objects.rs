//! The objects `explain` and `top` answer from: read from `--objects` files (YAML or JSON, `List`
//! objects unpacked) or listed from the live cluster (`crate::live`).

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde::Deserialize as _;
use tessera_placement::ClusterObjects;

/// The objects found in the input files.
#[derive(Debug, Default)]
pub struct Objects {
    pub cluster: ClusterObjects,
    /// Upstream PodGroups (`scheduling.k8s.io/v1beta1`) that gangs name.
    pub pod_groups: Vec<k8s_openapi::api::scheduling::v1beta1::PodGroup>,
    /// Kinds that were skipped, with where they came from.
    pub skipped: Vec<String>,
    /// Listed from the live cluster (not read from `--objects` files): what an error's hint
    /// suggests differs.
    pub live: bool,
}

impl Objects {
    /// How to add a missing object: where these objects came from.
    pub fn missing_hint(&self, what: &str) -> String {
        if self.live {
            format!(
                "the cluster has no {what} of that name (the CLI lists every namespace live; check \
                 the name and --namespace, or the kubeconfig's context)"
            )
        } else {
            format!("pass the file that holds the {what} with --objects")
        }
    }
}

impl Objects {
    /// Reads every file under `paths` (directories recursively, `.yaml`, `.yml` and `.json` files).
    pub fn load(paths: &[PathBuf]) -> anyhow::Result<Objects> {
        let mut objects = Objects::default();
        for path in paths {
            objects.load_path(path)?;
        }
        Ok(objects)
    }

    fn load_path(&mut self, path: &Path) -> anyhow::Result<()> {
        let meta = std::fs::metadata(path).with_context(|| format!("read {}", path.display()))?;
        if meta.is_dir() {
            let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
                .with_context(|| format!("list directory {}", path.display()))?
                .map(|e| e.map(|e| e.path()))
                .collect::<Result<_, _>>()
                .with_context(|| format!("list directory {}", path.display()))?;
            entries.sort();
            for entry in entries {
                let is_object_file = entry
                    .extension()
                    .and_then(|e| e.to_str())
                    .is_some_and(|e| matches!(e, "yaml" | "yml" | "json"));
                if entry.is_dir() || is_object_file {
                    self.load_path(&entry)?;
                }
            }
            return Ok(());
        }
        let text =
            std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
        for (index, document) in serde_yaml::Deserializer::from_str(&text).enumerate() {
            let value = serde_yaml::Value::deserialize(document)
                .with_context(|| format!("{}: document {}: not YAML", path.display(), index + 1))?;
            self.add(
                value,
                &format!("{} (document {})", path.display(), index + 1),
            )?;
        }
        Ok(())
    }

    fn add(&mut self, value: serde_yaml::Value, origin: &str) -> anyhow::Result<()> {
        if value.is_null() {
            return Ok(());
        }
        let kind = value
            .get("kind")
            .and_then(|k| k.as_str())
            .unwrap_or_default()
            .to_owned();
        let parse = |what: &str| format!("{origin}: not a valid {what}");
        let cluster = &mut self.cluster;
        match kind.as_str() {
            "ResourceSlice" => cluster
                .slices
                .push(serde_yaml::from_value(value).with_context(|| parse("ResourceSlice"))?),
            "DeviceClass" => cluster
                .classes
                .push(serde_yaml::from_value(value).with_context(|| parse("DeviceClass"))?),
            "ResourceClaim" => cluster
                .claims
                .push(serde_yaml::from_value(value).with_context(|| parse("ResourceClaim"))?),
            "ResourceClaimTemplate" => cluster.templates.push(
                serde_yaml::from_value(value).with_context(|| parse("ResourceClaimTemplate"))?,
            ),
            "Node" => cluster
                .nodes
                .push(serde_yaml::from_value(value).with_context(|| parse("Node"))?),
            "Pod" => cluster
                .pods
                .push(serde_yaml::from_value(value).with_context(|| parse("Pod"))?),
            "PodDisruptionBudget" => cluster
                .budgets
                .push(serde_yaml::from_value(value).with_context(|| parse("PodDisruptionBudget"))?),
            "PodGroup" => self
                .pod_groups
                .push(serde_yaml::from_value(value).with_context(|| parse("PodGroup"))?),
            "List"
            | "ResourceSliceList"
            | "DeviceClassList"
            | "ResourceClaimList"
            | "ResourceClaimTemplateList"
            | "NodeList"
            | "PodList"
            | "PodGroupList"
            | "PodDisruptionBudgetList" => {
                let items = value
                    .get("items")
                    .and_then(|i| i.as_sequence())
                    .cloned()
                    .unwrap_or_default();
                for (i, item) in items.into_iter().enumerate() {
                    self.add(item, &format!("{origin} item {}", i + 1))?;
                }
            }
            "" => bail!("{origin}: object has no kind; add `kind:` and `apiVersion:`"),
            other => self.skipped.push(format!("{other} in {origin}")),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hint_for_a_missing_object_depends_on_where_the_objects_came_from() {
        let files = Objects::default();
        assert_eq!(
            files.missing_hint("pod"),
            "pass the file that holds the pod with --objects"
        );
        let live = Objects {
            live: true,
            ..Objects::default()
        };
        let hint = live.missing_hint("pod");
        assert!(!hint.contains("--objects"), "{hint}");
        assert!(hint.contains("--namespace"), "{hint}");
    }
}
