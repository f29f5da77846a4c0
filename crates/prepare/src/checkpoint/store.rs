//! The checkpoint file in the state directory: loaded at start (a file that cannot be
//! trusted is quarantined, never crash-looped on), then rewritten atomically on every change.
//! Two plugin processes may share the file during a rolling update: each reads it again
//! ([`CheckpointStore::refresh`]) when the other one has replaced it, and the driver holds the
//! node's state lock (`crate::driver`) around every change, so a change is always made to the
//! records as they are on disk.
//!
//! The schema, version and checksum live in [`super::format`]; this module does the
//! IO. A write goes to a temporary file in the same directory, is fsynced, renamed over the
//! checkpoint, and the directory is fsynced: a reader (or the next start after a crash) sees the
//! old checkpoint or the new one, never a mix.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use tessera_kubelet_grpc::ClaimUid;

use super::format::{self, Checkpoint, CheckpointError, ClaimRecord};
use super::lock::{HeldState, StateLock, StateLockError};

/// The checkpoint's file name in the state directory.
pub const CHECKPOINT_FILE: &str = "checkpoint.json";
/// Where the kernel publishes the current boot's id.
pub const DEFAULT_BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";

const TEMP_PREFIX: &str = ".checkpoint.json.tmp-";
const QUARANTINE_INFIX: &str = ".corrupt-";
const FOREIGN_INFIX: &str = ".foreign-";

/// Failures of checkpoint IO. Each names the file and the operation.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointStoreError {
    /// The state directory could not be created.
    #[error(
        "cannot create the state directory {path}: {source}; check --state-dir and its permissions"
    )]
    CreateDir { path: PathBuf, source: io::Error },
    /// The checkpoint exists but cannot be read (not a content problem: e.g. permissions).
    #[error("cannot read the checkpoint {path}: {source}")]
    Read { path: PathBuf, source: io::Error },
    /// A new checkpoint could not be written; the previous one is still in place.
    #[error("cannot write the checkpoint {path}: {operation}: {source}")]
    Write {
        path: PathBuf,
        operation: &'static str,
        source: io::Error,
    },
    /// A corrupt checkpoint could not be moved aside.
    #[error(
        "cannot quarantine the corrupt checkpoint {path} to {to}: {source}; move it aside by hand"
    )]
    Quarantine {
        path: PathBuf,
        to: PathBuf,
        source: io::Error,
    },
    /// The boot id could not be read.
    #[error("cannot read the boot id from {path}: {source}")]
    BootId { path: PathBuf, source: io::Error },
    /// The checkpoint another plugin process wrote cannot be read back; the records in memory
    /// are kept and nothing is changed until it can.
    #[error(
        "the checkpoint {path} changed on disk (another plugin process on this node wrote it) \
         but cannot be read back: {error}; check the state directory"
    )]
    Reread {
        path: PathBuf,
        error: CheckpointError,
    },
    /// The node's state lock could not be taken.
    #[error(transparent)]
    Lock(#[from] StateLockError),
}

/// What [`CheckpointStore::open`] found.
#[derive(Debug, Clone, PartialEq)]
pub enum LoadOutcome {
    /// No checkpoint file: nothing was prepared, or the state directory is new.
    Missing,
    /// A valid checkpoint of this node written during boot `boot_id`; `migrated` when it was
    /// in the older format (it is written back in the current one).
    Loaded { boot_id: String, migrated: bool },
    /// The file could not be trusted; it was renamed to `moved_to`.
    Quarantined {
        moved_to: PathBuf,
        error: CheckpointError,
    },
}

/// Whose checkpoint this is: the node and pool it must record, and the node's GPUs (what an
/// older checkpoint without a node is checked against).
#[derive(Debug, Clone)]
pub struct CheckpointOwner {
    /// This node's name.
    pub node_name: String,
    /// The pool of this node's devices.
    pub pool_name: String,
    /// UUIDs of this node's GPUs.
    pub gpu_uuids: std::collections::BTreeSet<String>,
}

/// The checkpoint: its in-memory copy and the file behind it.
#[derive(Debug)]
pub struct CheckpointStore {
    path: PathBuf,
    boot_id: String,
    node_name: String,
    pool_name: String,
    records: Mutex<Records>,
    lock: Arc<StateLock>,
    writes: AtomicU64,
    rereads: AtomicU64,
}

/// The records in memory and which version of the file they are.
#[derive(Debug, Default)]
struct Records {
    claims: BTreeMap<ClaimUid, ClaimRecord>,
    /// The file the records were read from or written to; `None`: no file.
    file: Option<FileIdentity>,
}

/// One version of the checkpoint file. Every write is a new file renamed into place, so a
/// file another process wrote has another inode, and inode numbers reused after a deletion
/// differ in size or modification time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileIdentity {
    device: u64,
    inode: u64,
    size: u64,
    modified: (i64, i64),
}

impl FileIdentity {
    fn of(metadata: &fs::Metadata) -> Self {
        FileIdentity {
            device: metadata.dev(),
            inode: metadata.ino(),
            size: metadata.size(),
            modified: (metadata.mtime(), metadata.mtime_nsec()),
        }
    }
}

/// Reads the file at `path` with the identity of exactly what was read (`None`: no file, or
/// something else than a file).
fn read_identified(path: &Path) -> io::Result<Option<(Vec<u8>, FileIdentity)>> {
    let mut file = match File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let metadata = file.metadata()?;
    if !metadata.is_file() {
        // Not a checkpoint any process wrote; writing one over it fails and says so.
        return Ok(None);
    }
    let identity = FileIdentity::of(&metadata);
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    Ok(Some((bytes, identity)))
}

/// Reads the boot id (`/proc/sys/kernel/random/boot_id` by default).
pub fn read_boot_id(path: &Path) -> Result<String, CheckpointStoreError> {
    fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .map_err(|source| CheckpointStoreError::BootId {
            path: path.to_owned(),
            source,
        })
}

impl CheckpointStore {
    /// Opens the checkpoint in `state_dir` for the current boot `boot_id`: creates the
    /// directory, removes temporary files a crash left behind, and loads the checkpoint. A file
    /// that does not parse, has an unknown version or a wrong checksum is renamed to
    /// `checkpoint.json.corrupt-<unix seconds>`, one that is not `owner`'s
    /// ([`format::check_owner`]: copied from another node) to
    /// `checkpoint.json.foreign-<unix seconds>`, and the store starts empty.
    pub fn open(
        state_dir: &Path,
        boot_id: &str,
        owner: &CheckpointOwner,
    ) -> Result<(CheckpointStore, Checkpoint, LoadOutcome), CheckpointStoreError> {
        crate::paths::create_dir(state_dir, crate::paths::PRIVATE_DIR_MODE).map_err(|source| {
            CheckpointStoreError::CreateDir {
                path: state_dir.to_owned(),
                source,
            }
        })?;
        let lock = StateLock::new(state_dir);
        // Another plugin process may be writing (a rolling update): its temporary file is not
        // a leftover, nor is its checkpoint half written.
        let held = lock.hold(|| Ok::<(), CheckpointStoreError>(()))?;
        remove_temp_files(state_dir);
        let path = state_dir.join(CHECKPOINT_FILE);
        let mut file = None;
        let (loaded, outcome) = match read_identified(&path) {
            Ok(None) => (Checkpoint::default(), LoadOutcome::Missing),
            Err(source) => return Err(CheckpointStoreError::Read { path, source }),
            Ok(Some((bytes, identity))) => match format::decode(&bytes).and_then(|loaded| {
                format::check_owner(&loaded, &owner.node_name, &owner.pool_name, |uuid| {
                    owner.gpu_uuids.contains(uuid)
                })
                .map(|()| loaded)
            }) {
                Ok(loaded) => {
                    let boot_id = loaded.boot_id.clone();
                    let migrated = loaded.node_name.is_empty();
                    file = Some(identity);
                    (loaded, LoadOutcome::Loaded { boot_id, migrated })
                }
                Err(error) => {
                    let foreign = matches!(
                        error,
                        CheckpointError::ForeignNode { .. } | CheckpointError::ForeignGpus { .. }
                    );
                    let infix = if foreign {
                        FOREIGN_INFIX
                    } else {
                        QUARANTINE_INFIX
                    };
                    let moved_to = quarantine(&path, infix)?;
                    (
                        Checkpoint::default(),
                        LoadOutcome::Quarantined { moved_to, error },
                    )
                }
            },
        };
        let store = CheckpointStore {
            path,
            boot_id: boot_id.to_owned(),
            node_name: owner.node_name.clone(),
            pool_name: owner.pool_name.clone(),
            records: Mutex::new(Records {
                claims: loaded.claims.clone(),
                file,
            }),
            lock,
            writes: AtomicU64::new(0),
            rereads: AtomicU64::new(0),
        };
        drop(held);
        Ok((store, loaded, outcome))
    }

    /// The checkpoint file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The record of claim `uid`, if any.
    pub fn get(&self, uid: &ClaimUid) -> Option<ClaimRecord> {
        self.lock().claims.get(uid).cloned()
    }

    /// Every record, by claim UID.
    pub fn records(&self) -> BTreeMap<ClaimUid, ClaimRecord> {
        self.lock().claims.clone()
    }

    /// How many checkpoint writes this store made.
    pub fn writes(&self) -> u64 {
        self.writes.load(Ordering::Relaxed)
    }

    /// How many times the file was read again because another process had replaced it.
    pub fn rereads(&self) -> u64 {
        self.rereads.load(Ordering::Relaxed)
    }

    /// Holds the node's state lock (blocking: call it off the async runtime), reading the file
    /// again first if another plugin process replaced it. Every change the driver makes to the
    /// node's claim state happens while it holds this; never call it while holding it already.
    pub fn hold(&self) -> Result<HeldState, CheckpointStoreError> {
        self.lock.hold(|| self.refresh().map(drop))
    }

    /// Reads the file again if it is no longer the version the records in memory came from
    /// (another plugin process on the node wrote it); returns whether it did. A missing file (or
    /// something else in its place) leaves the records as they are (they are written again with the next change). A file
    /// that does not decode is an error and changes nothing.
    pub fn refresh(&self) -> Result<bool, CheckpointStoreError> {
        let mut records = self.lock();
        let read = read_identified(&self.path).map_err(|source| CheckpointStoreError::Read {
            path: self.path.clone(),
            source,
        })?;
        let Some((bytes, identity)) = read else {
            return Ok(false);
        };
        if records.file == Some(identity) {
            return Ok(false);
        }
        let checkpoint = format::decode(&bytes).map_err(|error| CheckpointStoreError::Reread {
            path: self.path.clone(),
            error,
        })?;
        records.claims = checkpoint.claims;
        records.file = Some(identity);
        self.rereads.fetch_add(1, Ordering::Relaxed);
        Ok(true)
    }

    /// Applies `change` to a copy of the records and persists the result; the in-memory
    /// records change only once the file is written. Writers are serialized, and each write
    /// persists the records as they are then, so concurrent callers never lose each other's
    /// changes.
    pub fn update<R>(
        &self,
        change: impl FnOnce(&mut BTreeMap<ClaimUid, ClaimRecord>) -> R,
    ) -> Result<R, CheckpointStoreError> {
        let mut records = self.lock();
        let mut next = records.claims.clone();
        let out = change(&mut next);
        let bytes = format::encode(&Checkpoint {
            boot_id: self.boot_id.clone(),
            node_name: self.node_name.clone(),
            pool_name: self.pool_name.clone(),
            claims: next,
        });
        let identity = write_atomically(&self.path, &bytes)?;
        self.writes.fetch_add(1, Ordering::Relaxed);
        // Decode what was written rather than keep `next`: both are equal, and this keeps a
        // single source of truth for the in-memory copy.
        records.claims = format::decode(&bytes).map(|c| c.claims).unwrap_or_default();
        records.file = Some(identity);
        Ok(out)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Records> {
        // A panic while holding the lock cannot leave the map half-changed: changes are made
        // on a copy. Keep going with the last committed records.
        self.records.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn quarantine(path: &Path, infix: &str) -> Result<PathBuf, CheckpointStoreError> {
    let seconds = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    let base = format!("{}{infix}{seconds}", path.display());
    let mut to = PathBuf::from(&base);
    let mut n = 1;
    while to.exists() {
        to = PathBuf::from(format!("{base}.{n}"));
        n += 1;
    }
    fs::rename(path, &to).map_err(|source| CheckpointStoreError::Quarantine {
        path: path.to_owned(),
        to: to.clone(),
        source,
    })?;
    sync_dir(path);
    Ok(to)
}

/// The quarantined checkpoints in `state_dir` (corrupt or foreign), by name.
pub fn quarantined_files(state_dir: &Path) -> Vec<PathBuf> {
    let prefixes =
        [QUARANTINE_INFIX, FOREIGN_INFIX].map(|infix| format!("{CHECKPOINT_FILE}{infix}"));
    let mut files: Vec<PathBuf> = fs::read_dir(state_dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            prefixes.iter().any(|prefix| name.starts_with(prefix))
        })
        .map(|e| e.path())
        .collect();
    files.sort();
    files
}

fn remove_temp_files(state_dir: &Path) {
    for entry in fs::read_dir(state_dir).into_iter().flatten().flatten() {
        if entry.file_name().to_string_lossy().starts_with(TEMP_PREFIX) {
            // Best effort: a leftover temporary file is harmless, only untidy.
            let _ = fs::remove_file(entry.path());
        }
    }
}

/// Writes `bytes` to `path` atomically and durably: temporary file in the same directory,
/// fsync, rename, fsync of the directory. Returns the identity of the file written (a rename
/// keeps the inode and the modification time).
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<FileIdentity, CheckpointStoreError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let temp = dir.join(format!("{TEMP_PREFIX}{}", std::process::id()));
    let failed = |operation: &'static str| {
        let path = path.to_owned();
        move |source| CheckpointStoreError::Write {
            path,
            operation,
            source,
        }
    };
    let result = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(crate::paths::PRIVATE_FILE_MODE)
            .open(&temp)
            .map_err(failed("create the temporary file"))?;
        // Exactly this mode whatever the umask (and for a leftover file opened again).
        file.set_permissions(fs::Permissions::from_mode(crate::paths::PRIVATE_FILE_MODE))
            .map_err(failed("set the temporary file's mode"))?;
        file.write_all(bytes)
            .map_err(failed("write the temporary file"))?;
        file.sync_all()
            .map_err(failed("fsync the temporary file"))?;
        let identity = file
            .metadata()
            .map(|m| FileIdentity::of(&m))
            .map_err(failed("inspect the temporary file"))?;
        fs::rename(&temp, path).map_err(failed("rename the temporary file over it"))?;
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(failed("fsync the state directory"))?;
        Ok(identity)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&temp);
    }
    result
}

fn sync_dir(path: &Path) {
    if let Some(dir) = path.parent() {
        // Best effort: the rename happened; durability of the quarantine is nice to have.
        let _ = File::open(dir).and_then(|d| d.sync_all());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::ClaimState;

    fn record(name: &str) -> ClaimRecord {
        ClaimRecord {
            namespace: "default".into(),
            name: name.into(),
            state: ClaimState::PrepareCompleted,
            devices: vec![],
            mps: None,
            imex: None,
        }
    }

    fn owner() -> CheckpointOwner {
        CheckpointOwner {
            node_name: "node-a".into(),
            pool_name: "node-a".into(),
            gpu_uuids: ["GPU-0".to_owned()].into(),
        }
    }

    #[test]
    fn another_nodes_checkpoint_is_quarantined_as_foreign() {
        let gpu_record = |uuid: &str| ClaimRecord {
            devices: vec![crate::checkpoint::DeviceRecord {
                request: "gpu".into(),
                pool: "node-b".into(),
                device: "gpu-0".into(),
                cdi_device_ids: vec![],
                target: crate::checkpoint::DeviceTarget::Gpu {
                    uuid: uuid.into(),
                    minor: 0,
                },
                sharing: None,
                share: None,
            }],
            ..record("x")
        };
        let of_node_b = Checkpoint {
            boot_id: "b".into(),
            node_name: "node-b".into(),
            pool_name: "node-b".into(),
            claims: BTreeMap::from([("u".into(), gpu_record("GPU-0"))]),
        };
        // Version 1 (no node recorded) naming node B's GPU.
        let v1_of_node_b = String::from_utf8(format::encode(&Checkpoint {
            node_name: String::new(),
            pool_name: String::new(),
            claims: BTreeMap::from([("u".into(), gpu_record("GPU-b"))]),
            ..of_node_b.clone()
        }))
        .unwrap()
        .replace("\"version\": 2", "\"version\": 1");
        for (what, content, complaint) in [
            (
                "version 2",
                format::encode(&of_node_b),
                "belongs to node `node-b`",
            ),
            ("version 1", v1_of_node_b.into_bytes(), "GPU-b"),
        ] {
            let dir = tempfile::tempdir().unwrap();
            fs::write(dir.path().join(CHECKPOINT_FILE), &content).unwrap();
            let (_, loaded, outcome) = CheckpointStore::open(dir.path(), "boot", &owner()).unwrap();
            let LoadOutcome::Quarantined { moved_to, error } = outcome else {
                panic!("{what}: {outcome:?}");
            };
            assert!(error.to_string().contains(complaint), "{what}: {error}");
            assert!(loaded.claims.is_empty(), "{what}");
            assert!(moved_to.to_string_lossy().contains(".foreign-"), "{what}");
            assert_eq!(fs::read(&moved_to).unwrap(), content, "{what}");
            assert_eq!(quarantined_files(dir.path()), vec![moved_to], "{what}");
        }
    }

    #[test]
    fn this_nodes_version_1_checkpoint_is_migrated() {
        let dir = tempfile::tempdir().unwrap();
        let v1 = String::from_utf8(format::encode(&Checkpoint {
            boot_id: "boot".into(),
            node_name: String::new(),
            pool_name: String::new(),
            claims: BTreeMap::from([("u".into(), record("x"))]),
        }))
        .unwrap()
        .replace("\"version\": 2", "\"version\": 1");
        fs::write(dir.path().join(CHECKPOINT_FILE), v1).unwrap();
        let (store, loaded, outcome) = CheckpointStore::open(dir.path(), "boot", &owner()).unwrap();
        assert_eq!(
            outcome,
            LoadOutcome::Loaded {
                boot_id: "boot".into(),
                migrated: true
            }
        );
        assert_eq!(loaded.claims.len(), 1);
        store.update(|_| ()).unwrap();
        let on_disk = format::decode(&fs::read(store.path()).unwrap()).unwrap();
        assert_eq!(
            (on_disk.node_name.as_str(), on_disk.claims.len()),
            ("node-a", 1)
        );
    }

    #[test]
    fn writes_are_loaded_back_with_the_boot_id() {
        let dir = tempfile::tempdir().unwrap();
        let (store, loaded, outcome) =
            CheckpointStore::open(dir.path(), "boot-1", &owner()).unwrap();
        assert_eq!(outcome, LoadOutcome::Missing);
        assert!(loaded.claims.is_empty());
        store
            .update(|claims| claims.insert("uid-1".into(), record("a")))
            .unwrap();
        assert_eq!(store.get(&"uid-1".into()), Some(record("a")));
        assert_eq!(store.writes(), 1);

        let (again, loaded, outcome) =
            CheckpointStore::open(dir.path(), "boot-2", &owner()).unwrap();
        assert_eq!(
            outcome,
            LoadOutcome::Loaded {
                boot_id: "boot-1".into(),
                migrated: false
            }
        );
        assert_eq!(loaded.claims.len(), 1);
        assert_eq!(again.get(&"uid-1".into()), Some(record("a")));
        again.update(|claims| claims.clear()).unwrap();
        let on_disk = format::decode(&fs::read(again.path()).unwrap()).unwrap();
        assert_eq!(on_disk.boot_id, "boot-2");
        assert!(on_disk.claims.is_empty());
    }

    #[test]
    fn corrupt_files_are_quarantined_not_fatal() {
        for (what, content) in [
            ("garbage", b"\x00\x01 not json".to_vec()),
            (
                "truncated",
                b"{\"version\": 1, \"checksum\": \"sha".to_vec(),
            ),
            (
                "future version",
                b"{\"version\": 7, \"checksum\": \"\", \"checkpoint\": {}}".to_vec(),
            ),
            (
                "bad checksum",
                String::from_utf8(format::encode(&Checkpoint {
                    boot_id: "b".into(),
                    node_name: "node-a".into(),
                    pool_name: "node-a".into(),
                    claims: BTreeMap::from([("u".into(), record("x"))]),
                }))
                .unwrap()
                .replace("\"x\"", "\"y\"")
                .into_bytes(),
            ),
        ] {
            let dir = tempfile::tempdir().unwrap();
            fs::write(dir.path().join(CHECKPOINT_FILE), &content).unwrap();
            let (store, loaded, outcome) =
                CheckpointStore::open(dir.path(), "boot", &owner()).unwrap();
            let LoadOutcome::Quarantined { moved_to, .. } = outcome else {
                panic!("{what}: {outcome:?}");
            };
            assert!(loaded.claims.is_empty(), "{what}");
            assert_eq!(
                fs::read(&moved_to).unwrap(),
                content,
                "{what}: kept as it was"
            );
            assert_eq!(quarantined_files(dir.path()), vec![moved_to], "{what}");
            assert!(!dir.path().join(CHECKPOINT_FILE).exists(), "{what}");
            // The store works, and the next start loads what it wrote.
            store
                .update(|claims| claims.insert("u".into(), record("z")))
                .unwrap();
            let (_, _, outcome) = CheckpointStore::open(dir.path(), "boot", &owner()).unwrap();
            assert!(matches!(outcome, LoadOutcome::Loaded { .. }), "{what}");
        }
    }

    #[test]
    fn leftover_temporary_files_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let temp = dir.path().join(format!("{TEMP_PREFIX}12345"));
        fs::write(&temp, b"partial").unwrap();
        CheckpointStore::open(dir.path(), "boot", &owner()).unwrap();
        assert!(!temp.exists());
    }

    #[test]
    fn a_failed_write_keeps_the_previous_records() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _, _) = CheckpointStore::open(dir.path(), "boot", &owner()).unwrap();
        store
            .update(|claims| claims.insert("a".into(), record("a")))
            .unwrap();
        // Make the rename fail: the checkpoint's path becomes a non-empty directory.
        fs::remove_file(store.path()).unwrap();
        fs::create_dir(store.path()).unwrap();
        fs::write(store.path().join("x"), b"").unwrap();
        let err = store
            .update(|claims| claims.insert("b".into(), record("b")))
            .unwrap_err();
        assert!(err.to_string().contains("rename"), "{err}");
        assert!(store.get(&"b".into()).is_none());
        assert_eq!(store.get(&"a".into()), Some(record("a")));
    }

    #[test]
    fn a_store_reads_the_file_again_once_another_process_replaced_it() {
        let dir = tempfile::tempdir().unwrap();
        let (old, _, _) = CheckpointStore::open(dir.path(), "boot", &owner()).unwrap();
        let (new, _, _) = CheckpointStore::open(dir.path(), "boot", &owner()).unwrap();
        assert!(
            !new.refresh().unwrap(),
            "nothing changed since it was opened"
        );
        old.update(|claims| claims.insert("a".into(), record("a")))
            .unwrap();
        assert!(!old.refresh().unwrap(), "its own write is what it holds");
        assert_eq!(new.get(&"a".into()), None, "not read yet");
        assert!(new.refresh().unwrap());
        assert_eq!(new.get(&"a".into()), Some(record("a")));
        assert!(!new.refresh().unwrap());
        // A change made after the refresh keeps the other process's record.
        new.update(|claims| claims.insert("b".into(), record("b")))
            .unwrap();
        assert!(old.refresh().unwrap());
        assert_eq!(old.records().len(), 2);
        assert_eq!((old.rereads(), new.rereads()), (1, 1));
        // A file that does not decode changes nothing and says so.
        fs::write(old.path(), b"garbage").unwrap();
        let error = old.refresh().unwrap_err();
        assert!(
            error.to_string().contains("another plugin process"),
            "{error}"
        );
        assert_eq!(old.records().len(), 2);
        // A missing file (moved aside by the other process) keeps the records in memory.
        fs::remove_file(old.path()).unwrap();
        assert!(!old.refresh().unwrap());
        assert_eq!(old.records().len(), 2);
    }

    #[test]
    fn boot_ids_are_read_trimmed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("boot_id");
        fs::write(&path, "0f1e2d3c-aaaa\n").unwrap();
        assert_eq!(read_boot_id(&path).unwrap(), "0f1e2d3c-aaaa");
        assert!(read_boot_id(&dir.path().join("none")).is_err());
    }
}
