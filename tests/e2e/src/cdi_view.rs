//! What a container gets from CDI device ids, computed the way a CDI-aware runtime does it
//! (pure): find each id's device in the spec directory, apply the spec-wide edits once per spec
//! and then the device's edits, in the order the ids were given; for environment variables the
//! last value wins.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use tessera_cdi::{QualifiedDevice, Spec};

/// The specs of one CDI spec directory, with the file each came from.
#[derive(Debug, Clone, Default)]
pub struct SpecDirectory {
    pub specs: Vec<(PathBuf, Spec)>,
}

impl SpecDirectory {
    /// Reads every `*.json` spec of `dir` (temporary files, which start with `.`, are skipped).
    /// A missing directory has no specs.
    pub fn read(dir: &Path) -> anyhow::Result<Self> {
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Self::default());
            }
            Err(error) => {
                return Err(error).with_context(|| format!("cannot list {}", dir.display()));
            }
        };
        let mut specs = Vec::new();
        for entry in entries {
            let path = entry
                .with_context(|| format!("cannot list {}", dir.display()))?
                .path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if name.starts_with('.') || !name.ends_with(".json") {
                continue;
            }
            let bytes = match std::fs::read(&path) {
                Ok(bytes) => bytes,
                // Removed between the listing and the read (an unprepare): not there.
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => continue,
                Err(error) => {
                    return Err(error).with_context(|| format!("cannot read {}", path.display()));
                }
            };
            let spec: Spec = serde_json::from_slice(&bytes).with_context(|| {
                format!(
                    "{} is not a CDI spec a runtime would accept",
                    path.display()
                )
            })?;
            specs.push((path, spec));
        }
        specs.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(Self { specs })
    }

    /// The files holding a device whose name starts with `prefix` (e.g. a claim UID).
    pub fn files_with_device_prefix(&self, prefix: &str) -> Vec<&Path> {
        self.specs
            .iter()
            .filter(|(_, spec)| spec.devices.iter().any(|d| d.name.starts_with(prefix)))
            .map(|(path, _)| path.as_path())
            .collect()
    }

    /// The environment a container given `ids` (in this order) would see.
    pub fn environment(&self, ids: &[String]) -> anyhow::Result<BTreeMap<String, String>> {
        let mut env = BTreeMap::new();
        let mut specs_applied: Vec<&Path> = Vec::new();
        let mut unresolved = Vec::new();
        for id in ids {
            let qualified: QualifiedDevice = id
                .parse()
                .with_context(|| format!("`{id}` is not a qualified CDI device id"))?;
            let found = self.specs.iter().find_map(|(path, spec)| {
                (spec.kind == *qualified.kind())
                    .then(|| spec.devices.iter().find(|d| d.name == qualified.name()))
                    .flatten()
                    .map(|device| (path, spec, device))
            });
            let Some((path, spec, device)) = found else {
                unresolved.push(id.clone());
                continue;
            };
            if !specs_applied.contains(&path.as_path()) {
                apply_env(&mut env, &spec.container_edits.env, path)?;
                specs_applied.push(path);
            }
            apply_env(&mut env, &device.container_edits.env, path)?;
        }
        if !unresolved.is_empty() {
            let files: Vec<String> = self
                .specs
                .iter()
                .map(|(p, _)| p.display().to_string())
                .collect();
            bail!(
                "no CDI spec defines {} (spec files: {})",
                unresolved.join(", "),
                if files.is_empty() {
                    "none".to_owned()
                } else {
                    files.join(", ")
                }
            );
        }
        Ok(env)
    }
}

fn apply_env(
    env: &mut BTreeMap<String, String>,
    entries: &[String],
    path: &Path,
) -> anyhow::Result<()> {
    for entry in entries {
        let (name, value) = entry.split_once('=').with_context(|| {
            format!("{}: env entry `{entry}` is not NAME=value", path.display())
        })?;
        env.insert(name.to_owned(), value.to_owned());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use pretty_assertions::assert_eq;

    use super::*;

    fn write_spec(dir: &Path, file: &str, json: &str) {
        std::fs::write(dir.join(file), json).unwrap();
    }

    const SPEC: &str = r#"{
      "cdiVersion": "0.5.0",
      "kind": "gpu.tessera.dev/claim",
      "containerEdits": {"env": ["SPEC_WIDE=1"]},
      "devices": [
        {"name": "uid1-gpu-0", "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=GPU-a,GPU-b"], "deviceNodes": [{"path": "/dev/nvidia0"}]}},
        {"name": "uid1-gpu-1", "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=GPU-b,GPU-a"], "deviceNodes": [{"path": "/dev/nvidia1"}]}}
      ]
    }"#;

    #[test]
    fn resolves_ids_like_a_runtime() {
        let dir = tempfile::tempdir().unwrap();
        write_spec(dir.path(), "gpu.tessera.dev-claim_uid1.json", SPEC);
        write_spec(dir.path(), ".gpu.tessera.dev-claim_tmp.json", "garbage");
        let specs = SpecDirectory::read(dir.path()).unwrap();
        assert_eq!(specs.specs.len(), 1);
        let env = specs
            .environment(&[
                "gpu.tessera.dev/claim=uid1-gpu-0".to_owned(),
                "gpu.tessera.dev/claim=uid1-gpu-1".to_owned(),
            ])
            .unwrap();
        assert_eq!(env["SPEC_WIDE"], "1");
        // The last device's value wins.
        assert_eq!(env["NVIDIA_VISIBLE_DEVICES"], "GPU-b,GPU-a");
        assert_eq!(specs.files_with_device_prefix("uid1-").len(), 1);
        assert!(specs.files_with_device_prefix("uid2-").is_empty());
    }

    #[test]
    fn unknown_ids_are_named() {
        let dir = tempfile::tempdir().unwrap();
        write_spec(dir.path(), "gpu.tessera.dev-claim_uid1.json", SPEC);
        let specs = SpecDirectory::read(dir.path()).unwrap();
        let error = specs
            .environment(&["gpu.tessera.dev/claim=uid9-gpu-0".to_owned()])
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("no CDI spec defines gpu.tessera.dev/claim=uid9-gpu-0"),
            "{error}"
        );
        // Same device name under another kind does not count.
        let error = specs
            .environment(&["other.example/claim=uid1-gpu-0".to_owned()])
            .unwrap_err()
            .to_string();
        assert!(error.contains("other.example/claim=uid1-gpu-0"), "{error}");
        assert!(specs.environment(&["not-an-id".to_owned()]).is_err());
    }

    #[test]
    fn a_missing_directory_is_empty_and_a_broken_spec_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        assert!(
            SpecDirectory::read(&dir.path().join("absent"))
                .unwrap()
                .specs
                .is_empty()
        );
        write_spec(dir.path(), "broken.json", "{\"cdiVersion\": 1}");
        let error = format!("{:#}", SpecDirectory::read(dir.path()).unwrap_err());
        assert!(error.contains("broken.json is not a CDI spec"), "{error}");
    }
}
