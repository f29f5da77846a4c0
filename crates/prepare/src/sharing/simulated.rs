//! A [`GpuControl`] for nodes without GPUs (mock topologies): it changes no hardware but keeps
//! the state a GPU would have — time slices and running MPS daemons — in files under a
//! directory, so that it outlives the plugin process like the real state does. Crash tests read
//! it to find leaked daemons.
//!
//! A daemon runs when its file `mps-daemons/<pipe>.json` exists. Starting one writes a hidden
//! temporary file and renames it into place, so a crash in between leaves a daemon that is not
//! running plus a temporary file; stopping removes both, as a real stop finds a daemon that was
//! still starting through its pipe directory (the next write of the file removes it too).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use tessera_api::config::TimeSliceInterval;

use super::{GpuControl, MpsDaemon, MpsDirectories, SharingError};

/// The file-backed simulation.
#[derive(Debug, Clone)]
pub struct SimulatedGpuControl {
    root: PathBuf,
}

impl SimulatedGpuControl {
    /// A simulation keeping its state in `root` (created on first use).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    fn time_slice_file(&self, gpu_uuid: &str) -> PathBuf {
        self.root.join("time-slices").join(file_key(gpu_uuid))
    }

    fn daemons_dir(&self) -> PathBuf {
        self.root.join("mps-daemons")
    }

    fn daemon_file(&self, directories: &MpsDirectories) -> PathBuf {
        self.daemons_dir().join(format!(
            "{}.json",
            file_key(&directories.pipe.to_string_lossy())
        ))
    }

    /// The time slice GPU `gpu_uuid` is set to.
    pub fn time_slice(&self, gpu_uuid: &str) -> TimeSliceInterval {
        fs::read_to_string(self.time_slice_file(gpu_uuid))
            .ok()
            .and_then(|text| serde_json::from_str(&text).ok())
            .unwrap_or_default()
    }

    /// The MPS daemons "running" now.
    pub fn running_daemons(&self) -> Vec<MpsDaemon> {
        let mut daemons: Vec<MpsDaemon> = fs::read_dir(self.daemons_dir())
            .into_iter()
            .flatten()
            .flatten()
            .filter(|entry| !is_temporary(&entry.path()))
            .filter_map(|entry| fs::read(entry.path()).ok())
            .filter_map(|bytes| serde_json::from_slice(&bytes).ok())
            .collect();
        daemons.sort_by(|a: &MpsDaemon, b| a.directories.cmp(&b.directories));
        daemons
    }

    /// Temporary files of interrupted writes (none once every interrupted start was stopped).
    pub fn leftover_files(&self) -> Vec<PathBuf> {
        let mut leftovers: Vec<PathBuf> = ["mps-daemons", "time-slices"]
            .iter()
            .flat_map(|dir| fs::read_dir(self.root.join(dir)).into_iter().flatten())
            .flatten()
            .map(|entry| entry.path())
            .filter(|path| is_temporary(path))
            .collect();
        leftovers.sort();
        leftovers
    }
}

/// The temporary file a write of `path` goes through: hidden, and named after the process.
fn temporary_file(path: &Path) -> PathBuf {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    path.with_file_name(format!(".{name}.tmp-{}", std::process::id()))
}

fn is_temporary(path: &Path) -> bool {
    path.file_name()
        .is_some_and(|name| name.to_string_lossy().starts_with('.'))
}

/// Removes the temporary files of interrupted writes of `path`, by any process.
fn remove_temporary_files(path: &Path) -> io::Result<()> {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return Ok(());
    };
    let prefix = format!(".{}.tmp-", name.to_string_lossy());
    let entries = match fs::read_dir(dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        other => other?,
    };
    for entry in entries {
        let entry = entry?;
        if entry.file_name().to_string_lossy().starts_with(&prefix) {
            remove_file(&entry.path())?;
        }
    }
    Ok(())
}

/// A file name for an arbitrary string.
fn file_key(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn write_file(path: &Path, bytes: &[u8]) -> io::Result<()> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir)?;
    }
    let temp = temporary_file(path);
    fs::write(&temp, bytes)?;
    crate::crash::point("simulated-gpu:temp-file-written");
    fs::rename(&temp, path)?;
    // Those of writes interrupted by a crash.
    remove_temporary_files(path)
}

fn remove_file(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

impl GpuControl for SimulatedGpuControl {
    fn set_time_slice(
        &self,
        gpu_uuid: &str,
        interval: TimeSliceInterval,
    ) -> Result<(), SharingError> {
        let path = self.time_slice_file(gpu_uuid);
        let result = if interval == TimeSliceInterval::Default {
            remove_file(&path).and_then(|()| remove_temporary_files(&path))
        } else {
            write_file(&path, &serde_json::to_vec(&interval).unwrap_or_default())
        };
        result.map_err(|e| SharingError::TimeSlice {
            gpu: gpu_uuid.to_owned(),
            interval,
            reason: format!("{}: {e}", path.display()),
        })
    }

    fn start_mps(&self, daemon: &MpsDaemon) -> Result<(), SharingError> {
        let path = self.daemon_file(&daemon.directories);
        write_file(&path, &serde_json::to_vec(daemon).unwrap_or_default()).map_err(|e| {
            SharingError::StartMps {
                claim_uid: daemon.claim_uid.clone(),
                pipe: daemon.directories.pipe.clone(),
                reason: format!("{}: {e}", path.display()),
            }
        })
    }

    fn stop_mps(&self, directories: &MpsDirectories) -> Result<(), SharingError> {
        let path = self.daemon_file(directories);
        remove_file(&path)
            .and_then(|()| remove_temporary_files(&path))
            .map_err(|e| SharingError::StopMps {
                pipe: directories.pipe.clone(),
                reason: format!("{}: {e}", path.display()),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sharing::MpsDevice;

    #[test]
    fn state_outlives_the_instance() {
        let dir = tempfile::tempdir().unwrap();
        let control = SimulatedGpuControl::new(dir.path());
        control
            .set_time_slice("GPU-1", TimeSliceInterval::Long)
            .unwrap();
        let daemon = MpsDaemon {
            claim_uid: "uid".into(),
            directories: MpsDirectories {
                pipe: "/state/mps/uid/pipe".into(),
                log: "/state/mps/uid/log".into(),
            },
            devices: vec![MpsDevice {
                uuid: "GPU-1".into(),
                pinned_memory_limit_bytes: Some(1 << 30),
            }],
            active_thread_percentage: Some(30),
        };
        control.start_mps(&daemon).unwrap();
        control.start_mps(&daemon).unwrap();

        let again = SimulatedGpuControl::new(dir.path());
        assert_eq!(again.time_slice("GPU-1"), TimeSliceInterval::Long);
        assert_eq!(again.time_slice("GPU-2"), TimeSliceInterval::Default);
        assert_eq!(again.running_daemons(), vec![daemon.clone()]);

        again.stop_mps(&daemon.directories).unwrap();
        again.stop_mps(&daemon.directories).unwrap();
        again
            .set_time_slice("GPU-1", TimeSliceInterval::Default)
            .unwrap();
        assert!(control.running_daemons().is_empty());
        assert_eq!(control.time_slice("GPU-1"), TimeSliceInterval::Default);
    }

    #[test]
    fn an_interrupted_start_is_no_daemon_and_a_stop_clears_it() {
        let dir = tempfile::tempdir().unwrap();
        let control = SimulatedGpuControl::new(dir.path());
        let directories = MpsDirectories {
            pipe: "/state/mps/uid/pipe".into(),
            log: "/state/mps/uid/log".into(),
        };
        let daemon = MpsDaemon {
            claim_uid: "uid".into(),
            directories: directories.clone(),
            devices: vec![],
            active_thread_percentage: None,
        };
        // What a process killed between writing and renaming leaves behind.
        let file = control.daemon_file(&directories);
        fs::create_dir_all(file.parent().unwrap()).unwrap();
        let temp = file.with_file_name(format!(
            ".{}.tmp-4242",
            file.file_name().unwrap().to_string_lossy()
        ));
        fs::write(&temp, serde_json::to_vec(&daemon).unwrap()).unwrap();
        assert!(control.running_daemons().is_empty());
        assert_eq!(control.leftover_files(), vec![temp.clone()]);
        control.stop_mps(&directories).unwrap();
        assert!(control.leftover_files().is_empty());
    }
}
