//! Writing and removing several specs with one directory fsync.
//!
//! A batch write validates and serializes every spec first (nothing is touched if one is
//! bad), writes and fsyncs each to its own temporary file, renames them all over their final
//! names, and fsyncs the directory once. Each file is still replaced atomically — a reader sees
//! a spec's old version or its new one, never a partial one — but the batch as a whole is not
//! atomic: a crash between two renames leaves some specs new and some not yet, and a crash
//! before the directory fsync may lose renames already made. A batch remove unlinks every spec
//! and fsyncs the directory once.

use std::collections::BTreeSet;
use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use super::{
    SPEC_DIR_MODE, SPEC_FILE_MODE, SpecDir, SpecDirError, TEMP_COUNTER, io_error, sync_dir,
};
use crate::spec::Spec;

/// A batch write or remove stopped part-way.
#[derive(Debug, thiserror::Error)]
#[error("{source} (CDI specs already {}: {})", verb(*.operation), list(.done))]
pub struct SpecBatchError {
    /// Whether the batch wrote or removed specs.
    pub operation: BatchOperation,
    /// Transient ids whose change is already visible in the directory, in batch order. After a
    /// failed write, these final files hold the new specs; no temporary file is left. When the
    /// failure is the final directory fsync, every spec of the batch is listed: visible, but
    /// possibly not durable.
    pub done: Vec<String>,
    /// The transient id whose write or removal failed, or `None` when the failure is the
    /// directory itself (creating or fsyncing it).
    pub failed: Option<String>,
    /// What failed; it names the file or directory.
    pub source: Box<SpecDirError>,
}

/// What a batch did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchOperation {
    /// [`SpecDir::write_all`].
    Write,
    /// [`SpecDir::remove_all`].
    Remove,
}

fn verb(operation: BatchOperation) -> &'static str {
    match operation {
        BatchOperation::Write => "written",
        BatchOperation::Remove => "removed",
    }
}

fn list(ids: &[String]) -> String {
    if ids.is_empty() {
        "none".to_owned()
    } else {
        ids.join(", ")
    }
}

/// A spec ready to be written: its id, final path and serialized bytes.
struct Serialized<'a> {
    transient_id: &'a str,
    path: PathBuf,
    json: Vec<u8>,
}

impl SpecDir {
    /// Validates and writes several transient specs, each atomically (see [`SpecDir::write`]),
    /// with one directory fsync for the whole batch; returns their paths in batch order.
    ///
    /// If any spec is invalid, of another kind, badly named or named twice, nothing is written.
    /// If writing a temporary file fails, no final file has changed and every temporary file is
    /// removed. If a rename fails, the specs renamed before it are in place (listed in
    /// [`SpecBatchError::done`]; the directory is still fsynced for them) and the remaining
    /// temporary files are removed.
    pub fn write_all(&self, specs: &[(&str, &Spec)]) -> Result<Vec<PathBuf>, SpecBatchError> {
        let failure = |failed: Option<&str>, done: Vec<String>, source| SpecBatchError {
            operation: BatchOperation::Write,
            done,
            failed: failed.map(str::to_owned),
            source: Box::new(source),
        };
        if specs.is_empty() {
            return Ok(Vec::new());
        }
        let mut seen = BTreeSet::new();
        let mut batch = Vec::with_capacity(specs.len());
        for (transient_id, spec) in specs {
            if !seen.insert(*transient_id) {
                let source = SpecDirError::DuplicateInBatch {
                    transient_id: (*transient_id).to_owned(),
                };
                return Err(failure(Some(transient_id), Vec::new(), source));
            }
            let serialized = self
                .serialize(transient_id, spec)
                .map_err(|source| failure(Some(transient_id), Vec::new(), source))?;
            batch.push(serialized);
        }
        let created = !self.root.exists();
        fs::DirBuilder::new()
            .recursive(true)
            .mode(SPEC_DIR_MODE)
            .create(&self.root)
            .and_then(|()| {
                // Exactly this mode whatever the umask; a directory that existed (shared with
                // other vendors) keeps the mode it has.
                if created {
                    fs::set_permissions(&self.root, fs::Permissions::from_mode(SPEC_DIR_MODE))
                } else {
                    Ok(())
                }
            })
            .map_err(|e| {
                failure(
                    None,
                    Vec::new(),
                    io_error("create CDI spec directory", &self.root)(e),
                )
            })?;

        let mut temps: Vec<PathBuf> = Vec::with_capacity(batch.len());
        for spec in &batch {
            match write_temp_file(&spec.path, &spec.json) {
                Ok(temp) => temps.push(temp),
                Err(source) => {
                    remove_all_quietly(&temps);
                    return Err(failure(Some(spec.transient_id), Vec::new(), source));
                }
            }
        }

        let mut done = Vec::with_capacity(batch.len());
        for (index, (spec, temp)) in batch.iter().zip(&temps).enumerate() {
            if let Err(e) = fs::rename(temp, &spec.path) {
                remove_all_quietly(&temps[index..]);
                // The renames made so far are the caller's to keep or undo; make them durable.
                let _ = sync_dir(&self.root);
                let source = io_error("rename temporary CDI spec into", &spec.path)(e);
                return Err(failure(Some(spec.transient_id), done, source));
            }
            done.push(spec.transient_id.to_owned());
        }
        sync_dir(&self.root).map_err(|source| failure(None, done, source))?;
        Ok(batch.into_iter().map(|spec| spec.path).collect())
    }

    /// Removes several transient specs with one directory fsync; returns the ids of those that
    /// existed, in batch order. Missing specs are not an error. If an id is badly named nothing
    /// is removed; if an unlink fails, the specs removed before it are listed in
    /// [`SpecBatchError::done`] (the directory is still fsynced for them) and later ones stay.
    pub fn remove_all(&self, transient_ids: &[&str]) -> Result<Vec<String>, SpecBatchError> {
        let failure = |failed: Option<&str>, done: Vec<String>, source| SpecBatchError {
            operation: BatchOperation::Remove,
            done,
            failed: failed.map(str::to_owned),
            source: Box::new(source),
        };
        let mut paths = Vec::with_capacity(transient_ids.len());
        for transient_id in transient_ids {
            let path = self
                .path_of(transient_id)
                .map_err(|e| failure(Some(transient_id), Vec::new(), e.into()))?;
            paths.push((*transient_id, path));
        }
        let mut removed = Vec::new();
        for (transient_id, path) in &paths {
            match fs::remove_file(path) {
                Ok(()) => removed.push((*transient_id).to_owned()),
                Err(error) if error.kind() == io::ErrorKind::NotFound => {}
                Err(error) => {
                    if !removed.is_empty() {
                        let _ = sync_dir(&self.root);
                    }
                    let source = io_error("remove CDI spec", path)(error);
                    return Err(failure(Some(transient_id), removed, source));
                }
            }
        }
        if !removed.is_empty() {
            sync_dir(&self.root).map_err(|source| failure(None, removed.clone(), source))?;
        }
        Ok(removed)
    }

    /// Checks `spec` against this directory and serializes it (no IO).
    fn serialize<'a>(
        &self,
        transient_id: &'a str,
        spec: &Spec,
    ) -> Result<Serialized<'a>, SpecDirError> {
        if spec.kind != self.kind {
            return Err(SpecDirError::WrongKind {
                transient_id: transient_id.to_owned(),
                expected: self.kind.clone(),
                found: spec.kind.clone(),
            });
        }
        spec.validate()
            .map_err(|source| SpecDirError::InvalidSpec {
                transient_id: transient_id.to_owned(),
                source,
            })?;
        let path = self.path_of(transient_id)?;
        let mut json =
            serde_json::to_vec_pretty(spec).map_err(|source| SpecDirError::Serialize {
                path: path.clone(),
                source,
            })?;
        json.push(b'\n');
        Ok(Serialized {
            transient_id,
            path,
            json,
        })
    }
}

/// Writes `bytes` to a new hidden temporary file next to `path` (`.<name>.tmp-<pid>-<n>`) and
/// fsyncs it; returns the temporary file's path. On failure the temporary file is removed.
fn write_temp_file(path: &Path, bytes: &[u8]) -> Result<PathBuf, SpecDirError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let file_name = path
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default();
    let temp = dir.join(format!(
        ".{file_name}.tmp-{}-{}",
        std::process::id(),
        TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(SPEC_FILE_MODE)
        .open(&temp)
        .map_err(io_error("create temporary CDI spec", &temp))?;
    // Exactly this mode whatever the umask: the container runtime reads the spec.
    let filled = file
        .set_permissions(fs::Permissions::from_mode(SPEC_FILE_MODE))
        .map_err(io_error("set the mode of temporary CDI spec", &temp))
        .and_then(|()| {
            file.write_all(bytes)
                .map_err(io_error("write temporary CDI spec", &temp))
        });
    let filled = filled.and_then(|()| {
        file.sync_all()
            .map_err(io_error("fsync temporary CDI spec", &temp))
    });
    drop(file);
    match filled {
        Ok(()) => Ok(temp),
        Err(error) => {
            let _ = fs::remove_file(&temp);
            Err(error)
        }
    }
}

fn remove_all_quietly(paths: &[PathBuf]) {
    for path in paths {
        let _ = fs::remove_file(path);
    }
}
