//! Batch writes and removes (one directory fsync per batch) on a real file system: contents,
//! per-file atomicity under a concurrent reader, and what a failure part-way leaves behind.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use pretty_assertions::assert_eq;
use tessera_cdi::{BatchOperation, ContainerEdits, Device, Kind, Spec, SpecDir, SpecDirError};

fn kind() -> Kind {
    Kind::new("gpu.tessera.dev", "claim").unwrap()
}

fn spec(uid: &str, env: &str) -> Spec {
    Spec::new(
        kind(),
        vec![Device {
            name: format!("{uid}-gpu-0"),
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

fn spec_file(uid: &str) -> String {
    format!("gpu.tessera.dev-claim_{uid}.json")
}

#[test]
fn a_batch_writes_every_spec_and_overwrites_them_together() {
    let root = tempfile::tempdir().unwrap();
    let cdi_root = root.path().join("var/run/cdi");
    let specs = SpecDir::new(&cdi_root, kind());
    let (a, b, c) = (
        spec("uid-a", "A=1"),
        spec("uid-b", "B=1"),
        spec("uid-c", "C=1"),
    );

    let paths = specs
        .write_all(&[("uid-a", &a), ("uid-b", &b), ("uid-c", &c)])
        .unwrap();
    assert_eq!(
        paths,
        ["uid-a", "uid-b", "uid-c"].map(|uid| cdi_root.join(spec_file(uid)))
    );
    for path in &paths {
        assert_eq!(
            fs::metadata(path).unwrap().permissions().mode() & 0o777,
            0o644
        );
    }
    assert_eq!(
        fs::metadata(&cdi_root).unwrap().permissions().mode() & 0o777,
        0o755
    );
    assert_eq!(specs.read("uid-a").unwrap(), Some(a));
    assert_eq!(specs.read("uid-b").unwrap(), Some(b));
    assert_eq!(specs.read("uid-c").unwrap(), Some(c.clone()));
    assert_eq!(specs.list().unwrap(), ["uid-a", "uid-b", "uid-c"]);

    let (a2, b2) = (spec("uid-a", "A=2"), spec("uid-b", "B=2"));
    specs.write_all(&[("uid-a", &a2), ("uid-b", &b2)]).unwrap();
    assert_eq!(specs.read("uid-a").unwrap(), Some(a2));
    assert_eq!(specs.read("uid-b").unwrap(), Some(b2));
    assert_eq!(specs.read("uid-c").unwrap(), Some(c));
    assert_eq!(
        file_names(&cdi_root),
        ["uid-a", "uid-b", "uid-c"].map(spec_file)
    );

    assert_eq!(
        specs.write_all(&[]).unwrap(),
        Vec::<std::path::PathBuf>::new()
    );
}

#[test]
fn a_bad_spec_or_a_repeated_id_writes_nothing() {
    let root = tempfile::tempdir().unwrap();
    let specs = SpecDir::new(root.path(), kind());
    let old = spec("uid-a", "A=old");
    specs.write("uid-a", &old).unwrap();

    let mut empty = spec("uid-b", "B=1");
    empty.devices.clear();
    let error = specs
        .write_all(&[("uid-a", &spec("uid-a", "A=new")), ("uid-b", &empty)])
        .unwrap_err();
    assert!(
        matches!(*error.source, SpecDirError::InvalidSpec { ref transient_id, .. } if transient_id == "uid-b"),
        "{error}"
    );
    assert_eq!(error.failed.as_deref(), Some("uid-b"));
    assert!(error.done.is_empty());

    let again = spec("uid-c", "C=1");
    let error = specs
        .write_all(&[("uid-c", &again), ("uid-c", &again)])
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "the CDI spec batch names \"uid-c\" twice; write each spec once \
         (CDI specs already written: none)"
    );

    let error = specs
        .write_all(&[("uid-c", &again), ("../escape", &again)])
        .unwrap_err();
    assert!(matches!(*error.source, SpecDirError::Name(_)), "{error}");

    assert_eq!(specs.read("uid-a").unwrap(), Some(old));
    assert_eq!(file_names(root.path()), [spec_file("uid-a")]);
}

#[test]
fn a_failed_rename_keeps_the_earlier_specs_reports_them_and_leaves_no_temporary_file() {
    let root = tempfile::tempdir().unwrap();
    let specs = SpecDir::new(root.path(), kind());
    // A directory where uid-b's spec should go makes its rename fail.
    let blocker = specs.path_of("uid-b").unwrap();
    fs::create_dir(&blocker).unwrap();

    let (a, b, c) = (
        spec("uid-a", "A=1"),
        spec("uid-b", "B=1"),
        spec("uid-c", "C=1"),
    );
    let error = specs
        .write_all(&[("uid-a", &a), ("uid-b", &b), ("uid-c", &c)])
        .unwrap_err();
    assert_eq!(error.operation, BatchOperation::Write);
    assert_eq!(error.done, ["uid-a"]);
    assert_eq!(error.failed.as_deref(), Some("uid-b"));
    let message = error.to_string();
    assert!(
        message.starts_with(&format!(
            "cannot rename temporary CDI spec into {}: ",
            blocker.display()
        )),
        "{message}"
    );
    assert!(
        message.ends_with("(CDI specs already written: uid-a)"),
        "{message}"
    );
    assert_eq!(specs.read("uid-a").unwrap(), Some(a));
    assert_eq!(specs.read("uid-c").unwrap(), None);
    assert_eq!(
        file_names(root.path()),
        [spec_file("uid-a"), spec_file("uid-b")]
    );
    assert!(blocker.is_dir());
}

#[test]
fn a_directory_that_cannot_be_created_is_named_and_nothing_is_left() {
    let root = tempfile::tempdir().unwrap();
    let not_a_directory = root.path().join("cdi");
    fs::write(&not_a_directory, "a file").unwrap();
    let specs = SpecDir::new(&not_a_directory, kind());

    let error = specs
        .write_all(&[("uid-a", &spec("uid-a", "A=1"))])
        .unwrap_err();
    assert_eq!(error.failed, None);
    assert!(error.done.is_empty());
    assert!(
        matches!(&*error.source, SpecDirError::Io { operation, path, .. }
            if *operation == "create CDI spec directory" && *path == not_a_directory),
        "{error}"
    );
    assert_eq!(file_names(root.path()), ["cdi"]);
}

#[test]
fn a_reader_sees_each_spec_whole_while_batches_overwrite_them() {
    let root = tempfile::tempdir().unwrap();
    let specs = SpecDir::new(root.path(), kind());
    let uids = ["uid-a", "uid-b", "uid-c", "uid-d"];
    // Large enough that a torn write would be visible as a parse failure.
    let version = |uid: &str, n: usize| spec(uid, &format!("V={}", n.to_string().repeat(4000)));
    let first: Vec<Spec> = uids.iter().map(|uid| version(uid, 0)).collect();
    let batch: Vec<(&str, &Spec)> = uids.iter().copied().zip(&first).collect();
    specs.write_all(&batch).unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (specs, stop) = (specs.clone(), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut reads = 0;
            while !stop.load(Ordering::Relaxed) {
                for uid in uids {
                    let read = specs.read(uid).expect("a whole spec").expect("present");
                    assert_eq!(read.devices[0].name, format!("{uid}-gpu-0"));
                    reads += 1;
                }
            }
            reads
        })
    };
    for n in 1..=100 {
        let next: Vec<Spec> = uids.iter().map(|uid| version(uid, n)).collect();
        let batch: Vec<(&str, &Spec)> = uids.iter().copied().zip(&next).collect();
        specs.write_all(&batch).unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    let reads = reader.join().expect("the reader never saw a partial spec");
    assert!(reads > 0);
    assert_eq!(specs.read("uid-c").unwrap(), Some(version("uid-c", 100)));
    assert_eq!(file_names(root.path()), uids.map(spec_file));
}

#[test]
fn a_batch_remove_reports_what_existed_and_stops_at_a_failure() {
    let root = tempfile::tempdir().unwrap();
    let specs = SpecDir::new(root.path(), kind());
    let (a, c) = (spec("uid-a", "A=1"), spec("uid-c", "C=1"));
    specs.write_all(&[("uid-a", &a), ("uid-c", &c)]).unwrap();

    let error = specs.remove_all(&["uid-a", "../escape"]).unwrap_err();
    assert!(matches!(*error.source, SpecDirError::Name(_)), "{error}");
    assert!(error.done.is_empty());
    assert_eq!(specs.list().unwrap(), ["uid-a", "uid-c"]);

    // uid-b's path is a directory: unlinking it fails.
    let blocker = specs.path_of("uid-b").unwrap();
    fs::create_dir(&blocker).unwrap();
    let error = specs.remove_all(&["uid-a", "uid-b", "uid-c"]).unwrap_err();
    assert_eq!(error.operation, BatchOperation::Remove);
    assert_eq!(error.done, ["uid-a"]);
    assert_eq!(error.failed.as_deref(), Some("uid-b"));
    assert!(
        error
            .to_string()
            .starts_with(&format!("cannot remove CDI spec {}: ", blocker.display())),
        "{error}"
    );
    assert_eq!(specs.read("uid-c").unwrap(), Some(c));
    fs::remove_dir(&blocker).unwrap();

    assert_eq!(
        specs.remove_all(&["uid-a", "uid-b", "uid-c"]).unwrap(),
        ["uid-c"]
    );
    assert!(file_names(root.path()).is_empty());
    assert_eq!(specs.remove_all(&[]).unwrap(), Vec::<String>::new());
}
