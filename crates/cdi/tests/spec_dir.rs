//! The spec directory: atomic writes, reads, removal, listing and temp-file cleanup, on a
//! real file system.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, SystemTime};

use pretty_assertions::assert_eq;
use tessera_cdi::{ContainerEdits, Device, Kind, Spec, SpecDir, SpecDirError};

fn kind() -> Kind {
    Kind::new("gpu.tessera.dev", "claim").unwrap()
}

fn spec(device: &str, env: &str) -> Spec {
    Spec::new(
        kind(),
        vec![Device {
            name: device.into(),
            container_edits: ContainerEdits {
                env: vec![env.into()],
                ..Default::default()
            },
        }],
    )
}

fn file_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

#[test]
fn write_read_overwrite_and_remove() {
    let root = tempfile::tempdir().unwrap();
    let cdi_root = root.path().join("var/run/cdi");
    let specs = SpecDir::new(&cdi_root, kind());

    let path = specs.write("uid-1", &spec("uid-1-gpu-0", "A=1")).unwrap();
    assert_eq!(path, cdi_root.join("gpu.tessera.dev-claim_uid-1.json"));
    assert_eq!(
        fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o644
    );
    assert_eq!(
        fs::metadata(&cdi_root).unwrap().permissions().mode() & 0o777,
        0o755
    );
    assert_eq!(
        specs.read("uid-1").unwrap(),
        Some(spec("uid-1-gpu-0", "A=1"))
    );

    specs.write("uid-1", &spec("uid-1-gpu-0", "A=2")).unwrap();
    assert_eq!(
        specs.read("uid-1").unwrap(),
        Some(spec("uid-1-gpu-0", "A=2"))
    );
    assert_eq!(file_names(&cdi_root), ["gpu.tessera.dev-claim_uid-1.json"]);

    assert!(specs.remove("uid-1").unwrap());
    assert!(!specs.remove("uid-1").unwrap());
    assert_eq!(specs.read("uid-1").unwrap(), None);
    assert!(file_names(&cdi_root).is_empty());
}

#[test]
fn a_failed_write_leaves_no_temporary_file_and_keeps_the_old_state() {
    let root = tempfile::tempdir().unwrap();
    let specs = SpecDir::new(root.path(), kind());
    // A directory where the spec should go makes the final rename fail.
    let blocker = specs.path_of("uid-1").unwrap();
    fs::create_dir(&blocker).unwrap();

    let error = specs
        .write("uid-1", &spec("uid-1-gpu-0", "A=1"))
        .unwrap_err();
    assert!(
        matches!(&error, SpecDirError::Io { operation, .. } if operation.starts_with("rename")),
        "{error}"
    );
    assert_eq!(
        file_names(root.path()),
        ["gpu.tessera.dev-claim_uid-1.json"]
    );
    assert!(blocker.is_dir());
}

#[test]
fn invalid_specs_and_foreign_kinds_are_not_written() {
    let root = tempfile::tempdir().unwrap();
    let specs = SpecDir::new(root.path(), kind());

    let mut empty = spec("uid-1-gpu-0", "A=1");
    empty.devices.clear();
    let error = specs.write("uid-1", &empty).unwrap_err();
    assert!(matches!(error, SpecDirError::InvalidSpec { .. }), "{error}");

    let mut foreign = spec("uid-1-gpu-0", "A=1");
    foreign.kind = Kind::new("nvidia.com", "gpu").unwrap();
    let error = specs.write("uid-1", &foreign).unwrap_err();
    assert_eq!(
        error.to_string(),
        "CDI spec for \"uid-1\" has kind nvidia.com/gpu, but this writer manages gpu.tessera.dev/claim"
    );

    let error = specs.write("../escape", &spec("x", "A=1")).unwrap_err();
    assert!(matches!(error, SpecDirError::Name(_)), "{error}");
    assert!(file_names(root.path()).is_empty());
}

#[test]
fn listing_finds_only_this_kinds_specs() {
    let root = tempfile::tempdir().unwrap();
    let specs = SpecDir::new(root.path(), kind());
    assert!(
        SpecDir::new(root.path().join("missing"), kind())
            .list()
            .unwrap()
            .is_empty()
    );

    specs.write("uid-b", &spec("uid-b-gpu-0", "A=1")).unwrap();
    specs.write("uid-a", &spec("uid-a-gpu-0", "A=1")).unwrap();
    let other = |name: &str, body: &str| fs::write(root.path().join(name), body).unwrap();
    // Another vendor's transient spec.
    other(
        "nvidia.com-gpu_uid-c.json",
        r#"{"cdiVersion":"0.5.0","kind":"nvidia.com/gpu","devices":[]}"#,
    );
    // Same vendor, class "claim_x": a name that looks like ours, a kind that is not.
    other(
        "gpu.tessera.dev-claim_x.json",
        r#"{"cdiVersion":"0.5.0","kind":"gpu.tessera.dev/claim_x","devices":[]}"#,
    );
    // Our YAML name, a temporary file and a damaged spec of ours.
    other(
        "gpu.tessera.dev-claim_uid-d.yaml",
        "kind: gpu.tessera.dev/claim",
    );
    other(".gpu.tessera.dev-claim_uid-e.json.tmp-1-0", "{");
    other("gpu.tessera.dev-claim_uid-f.json", "{");

    assert_eq!(specs.list().unwrap(), ["uid-a", "uid-b", "uid-f"]);
}

#[test]
fn only_old_temporary_files_of_this_kind_are_cleaned_up() {
    let root = tempfile::tempdir().unwrap();
    let specs = SpecDir::new(root.path(), kind());
    let create = |name: &str, age: Duration| {
        let file = fs::File::create(root.path().join(name)).unwrap();
        file.set_modified(SystemTime::now() - age).unwrap();
    };
    let hour = Duration::from_secs(3600);
    create(".gpu.tessera.dev-claim_uid-1.json.tmp-42-0", hour);
    create(".gpu.tessera.dev-claim_uid-2.json.tmp-42-1", Duration::ZERO);
    create(".nvidia.com-gpu_uid-3.json.tmp-42-0", hour);
    specs.write("uid-4", &spec("uid-4-gpu-0", "A=1")).unwrap();

    assert_eq!(
        specs
            .remove_stale_temp_files(Duration::from_secs(60))
            .unwrap(),
        1
    );
    assert_eq!(
        file_names(root.path()),
        [
            ".gpu.tessera.dev-claim_uid-2.json.tmp-42-1",
            ".nvidia.com-gpu_uid-3.json.tmp-42-0",
            "gpu.tessera.dev-claim_uid-4.json",
        ]
    );
}
