//! A CDI spec directory (e.g. `/var/run/cdi`) as one driver sees it: the transient specs of
//! one kind, written atomically, read, listed and removed.
//!
//! A write goes to a hidden temporary file in the same directory (`.<name>.tmp-<pid>-<n>`,
//! which the runtime ignores: it loads only `*.json` and `*.yaml`), is fsynced, renamed over
//! the final name, and the directory is fsynced. A reader therefore sees the old spec or the
//! new one, never a partial one, and a crash leaves at most a temporary file behind
//! ([`SpecDir::remove_stale_temp_files`] clears those). [`SpecDir::write_all`] and
//! [`SpecDir::remove_all`] change several specs with one directory fsync.

mod batch;

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::time::{Duration, SystemTime};

use serde::Deserialize;

use crate::names::{Kind, NameError};
use crate::spec::{Spec, SpecError};

pub use batch::{BatchOperation, SpecBatchError};

/// Mode of spec files: the runtime (root) reads them; they hold no secrets.
pub const SPEC_FILE_MODE: u32 = 0o644;
/// Mode of a spec directory this crate creates.
pub const SPEC_DIR_MODE: u32 = 0o755;

/// Failures reading or changing a spec directory.
#[derive(Debug, thiserror::Error)]
pub enum SpecDirError {
    /// A name (transient id) is invalid.
    #[error(transparent)]
    Name(#[from] NameError),
    /// The spec would be rejected by the runtime.
    #[error("CDI spec for {transient_id:?} is invalid: {source}")]
    InvalidSpec {
        /// The transient id it was to be written under.
        transient_id: String,
        /// What is wrong.
        source: SpecError,
    },
    /// The spec's kind is not the directory's kind.
    #[error("CDI spec for {transient_id:?} has kind {found}, but this writer manages {expected}")]
    WrongKind {
        /// The transient id.
        transient_id: String,
        /// The writer's kind.
        expected: Kind,
        /// The spec's kind.
        found: Kind,
    },
    /// A batch names the same transient id twice.
    #[error("the CDI spec batch names {transient_id:?} twice; write each spec once")]
    DuplicateInBatch {
        /// The repeated transient id.
        transient_id: String,
    },
    /// The spec could not be serialized.
    #[error("cannot serialize the CDI spec for {path}: {source}")]
    Serialize {
        /// The target file.
        path: PathBuf,
        /// The underlying error.
        source: serde_json::Error,
    },
    /// A file-system operation failed.
    #[error("cannot {operation} {path}: {source}")]
    Io {
        /// What was being done (e.g. `create temporary spec file`).
        operation: &'static str,
        /// On which path.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// A spec file is not a valid spec.
    #[error("CDI spec file {path} cannot be parsed: {source}; remove it if it is damaged")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: serde_json::Error,
    },
}

fn io_error(operation: &'static str, path: &Path) -> impl FnOnce(io::Error) -> SpecDirError {
    let path = path.to_owned();
    move |source| SpecDirError::Io {
        operation,
        path,
        source,
    }
}

/// Makes temporary file names unique within this process.
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// The transient specs of one kind in one CDI spec directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecDir {
    root: PathBuf,
    kind: Kind,
}

impl SpecDir {
    /// The specs of `kind` in directory `root` (nothing is touched until the first call).
    pub fn new(root: impl Into<PathBuf>, kind: Kind) -> Self {
        Self {
            root: root.into(),
            kind,
        }
    }

    /// The directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The kind whose specs this manages.
    pub fn kind(&self) -> &Kind {
        &self.kind
    }

    /// The file of transient spec `transient_id` (e.g. a claim UID).
    pub fn path_of(&self, transient_id: &str) -> Result<PathBuf, NameError> {
        Ok(self
            .root
            .join(self.kind.transient_spec_file_name(transient_id)?))
    }

    /// Validates `spec` and writes it atomically as transient spec `transient_id`, replacing
    /// any previous version. Creates the directory (mode 0755) if needed. Returns the path.
    pub fn write(&self, transient_id: &str, spec: &Spec) -> Result<PathBuf, SpecDirError> {
        let mut paths = self
            .write_all(&[(transient_id, spec)])
            .map_err(|e| *e.source)?;
        Ok(paths.remove(0))
    }

    /// Reads transient spec `transient_id`; `None` if there is none.
    pub fn read(&self, transient_id: &str) -> Result<Option<Spec>, SpecDirError> {
        let path = self.path_of(transient_id)?;
        let bytes = match fs::read(&path) {
            Ok(bytes) => bytes,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(error) => return Err(io_error("read CDI spec", &path)(error)),
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|source| SpecDirError::Parse { path, source })
    }

    /// Removes transient spec `transient_id` durably; returns whether it existed.
    pub fn remove(&self, transient_id: &str) -> Result<bool, SpecDirError> {
        self.remove_all(&[transient_id])
            .map(|removed| !removed.is_empty())
            .map_err(|e| *e.source)
    }

    /// The transient ids of this kind's specs in the directory, sorted; empty if the
    /// directory does not exist. A file is listed when its name has this kind's transient
    /// prefix and its `kind` field is this kind, or cannot be read (a damaged spec of ours).
    /// Other vendors' and classes' specs, and temporary files, are ignored.
    pub fn list(&self) -> Result<Vec<String>, SpecDirError> {
        let prefix = self.kind.transient_spec_prefix();
        let entries = match fs::read_dir(&self.root) {
            Ok(entries) => entries,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(error) => return Err(io_error("list CDI spec directory", &self.root)(error)),
        };
        let mut ids = Vec::new();
        for entry in entries {
            let entry = entry.map_err(io_error("list CDI spec directory", &self.root))?;
            let file_name = entry.file_name();
            let Some(id) = file_name
                .to_str()
                .and_then(|name| name.strip_prefix(&prefix))
                .and_then(|rest| rest.strip_suffix(".json"))
            else {
                continue;
            };
            if self.declares_other_kind(&entry.path()) {
                continue;
            }
            ids.push(id.to_owned());
        }
        ids.sort();
        Ok(ids)
    }

    /// True when the file at `path` is readable and declares a kind other than ours.
    fn declares_other_kind(&self, path: &Path) -> bool {
        #[derive(Deserialize)]
        struct KindOnly {
            kind: String,
        }
        let Ok(bytes) = fs::read(path) else {
            return false;
        };
        match serde_json::from_slice::<KindOnly>(&bytes) {
            Ok(declared) => declared.kind != self.kind.to_string(),
            Err(_) => false,
        }
    }

    /// Removes this kind's temporary files last modified more than `older_than` ago (left by
    /// a crash mid-write); returns how many. Younger ones may belong to a write in progress
    /// (another plugin instance during a rolling update) and are kept.
    pub fn remove_stale_temp_files(&self, older_than: Duration) -> Result<usize, SpecDirError> {
        let prefix = format!(".{}", self.kind.transient_spec_prefix());
        let entries = match fs::read_dir(&self.root) {
            Ok(entries) => entries,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(0),
            Err(error) => return Err(io_error("list CDI spec directory", &self.root)(error)),
        };
        let now = SystemTime::now();
        let mut removed = 0;
        for entry in entries {
            let entry = entry.map_err(io_error("list CDI spec directory", &self.root))?;
            let is_temp = entry
                .file_name()
                .to_str()
                .is_some_and(|name| name.starts_with(&prefix) && name.contains(".json.tmp-"));
            if !is_temp {
                continue;
            }
            let path = entry.path();
            let modified = entry
                .metadata()
                .and_then(|metadata| metadata.modified())
                .map_err(io_error("inspect temporary CDI spec", &path))?;
            if now.duration_since(modified).unwrap_or_default() <= older_than {
                continue;
            }
            match fs::remove_file(&path) {
                Ok(()) => removed += 1,
                Err(error) if error.kind() == io::ErrorKind::NotFound => {}
                Err(error) => return Err(io_error("remove temporary CDI spec", &path)(error)),
            }
        }
        if removed > 0 {
            sync_dir(&self.root)?;
        }
        Ok(removed)
    }
}

fn sync_dir(dir: &Path) -> Result<(), SpecDirError> {
    File::open(dir)
        .and_then(|handle| handle.sync_all())
        .map_err(io_error("fsync CDI spec directory", dir))
}
