//! Scripted telemetry: what the fake answers to the queries a GPU monitor makes —
//! `nvmlDeviceGetUtilizationRates`, the `used` part of `nvmlDeviceGetMemoryInfo(_v2)`,
//! `nvmlDeviceGetPowerUsage`, `nvmlDeviceGetTemperature` and `nvmlDeviceGetTotalEccErrors`.
//!
//! The values come from a samples file (`TESSERA_FAKE_NVML_SAMPLES`, else `samples` in the state
//! directory: `TESSERA_FAKE_NVML_STATE_DIR`, or a fake driver root's
//! `<dev root>/tessera-fake-gpu-state/`). One line per GPU, fields as `name=value`:
//!
//! ```text
//! # every GPU first, then one GPU; a later field overrides an earlier one
//! * utilization=0
//! GPU-2cd02ecc-1915-5073-bc46-a6f474f36436 utilization=80 memory-utilization=35 memory-used-mib=20480 power-watts=350 temperature=61
//! ```
//!
//! Fields: `utilization`, `memory-utilization` (percent, 0–100), `memory-used-mib` (capped at the
//! GPU's memory), `power-watts`, `temperature` (°C), `ecc-corrected`, `ecc-uncorrected` (error
//! counts). A field no line sets reads 0. The file is read again whenever it changes (its
//! modification time, size or inode), so a test scripts 0% and then 80% by rewriting it; a
//! missing file means all zeros. Malformed lines and fields are reported on stderr and skipped.
//!
//! Hand-written: a property of this fake (the format is its own), not a general mechanism.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::time::SystemTime;

const MIB: u64 = 1 << 20;

/// What one GPU answers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sample {
    /// Percent of time a kernel ran.
    pub utilization: u32,
    /// Percent of time device memory was read or written.
    pub memory_utilization: u32,
    /// Device memory in use, in MiB (capped at the GPU's memory when answered).
    pub memory_used_mib: u64,
    pub power_watts: u32,
    pub temperature: u32,
    pub ecc_corrected: u64,
    pub ecc_uncorrected: u64,
}

impl Sample {
    /// Memory in use, in bytes, of a GPU with `total` bytes.
    pub fn memory_used(&self, total: u64) -> u64 {
        self.memory_used_mib.saturating_mul(MIB).min(total)
    }
}

/// The fields one line sets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Fields {
    utilization: Option<u32>,
    memory_utilization: Option<u32>,
    memory_used_mib: Option<u64>,
    power_watts: Option<u32>,
    temperature: Option<u32>,
    ecc_corrected: Option<u64>,
    ecc_uncorrected: Option<u64>,
}

impl Fields {
    /// `self` with what `later` sets on top.
    fn merge(&mut self, later: &Fields) {
        macro_rules! take {
            ($($field:ident),+) => { $( if later.$field.is_some() { self.$field = later.$field; } )+ };
        }
        take!(
            utilization,
            memory_utilization,
            memory_used_mib,
            power_watts,
            temperature,
            ecc_corrected,
            ecc_uncorrected
        );
    }

    fn apply(&self, sample: &mut Sample) {
        macro_rules! set {
            ($($field:ident),+) => { $( if let Some(value) = self.$field { sample.$field = value; } )+ };
        }
        set!(
            utilization,
            memory_utilization,
            memory_used_mib,
            power_watts,
            temperature,
            ecc_corrected,
            ecc_uncorrected
        );
    }

    /// Sets the field `name` from `value`.
    fn set(&mut self, name: &str, value: &str) -> Result<(), String> {
        fn number<T: std::str::FromStr>(name: &str, value: &str) -> Result<T, String> {
            value
                .parse()
                .map_err(|_| format!("`{name}={value}`: not a whole number"))
        }
        fn percent(name: &str, value: &str) -> Result<u32, String> {
            let percent: u32 = number(name, value)?;
            if percent > 100 {
                return Err(format!("`{name}={value}`: a percentage is 0 to 100"));
            }
            Ok(percent)
        }
        match name {
            "utilization" => self.utilization = Some(percent(name, value)?),
            "memory-utilization" => self.memory_utilization = Some(percent(name, value)?),
            "memory-used-mib" => self.memory_used_mib = Some(number(name, value)?),
            "power-watts" => self.power_watts = Some(number(name, value)?),
            "temperature" => self.temperature = Some(number(name, value)?),
            "ecc-corrected" => self.ecc_corrected = Some(number(name, value)?),
            "ecc-uncorrected" => self.ecc_uncorrected = Some(number(name, value)?),
            _ => {
                return Err(format!(
                    "unknown field `{name}` (utilization, memory-utilization, memory-used-mib, \
                     power-watts, temperature, ecc-corrected, ecc-uncorrected)"
                ));
            }
        }
        Ok(())
    }
}

/// A parsed samples file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Script {
    all: Fields,
    by_gpu: HashMap<String, Fields>,
}

impl Script {
    /// Parses a samples file; what cannot be read is returned as problems (one per line or
    /// field) and left out.
    pub fn parse(text: &str) -> (Script, Vec<String>) {
        let mut script = Script::default();
        let mut problems = Vec::new();
        for (number, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or_default().trim();
            let mut words = line.split_whitespace();
            let Some(target) = words.next() else {
                continue;
            };
            let mut fields = Fields::default();
            for word in words {
                let result = match word.split_once('=') {
                    Some((name, value)) => fields.set(name, value),
                    None => Err(format!("`{word}` is not `field=value`")),
                };
                if let Err(problem) = result {
                    problems.push(format!("line {}: {problem}", number + 1));
                }
            }
            if target == "*" {
                script.all.merge(&fields);
            } else {
                script
                    .by_gpu
                    .entry(target.to_owned())
                    .or_default()
                    .merge(&fields);
            }
        }
        (script, problems)
    }

    /// What the GPU `uuid` answers: zeros, then the `*` fields, then its own.
    pub fn sample(&self, uuid: &str) -> Sample {
        let mut sample = Sample::default();
        self.all.apply(&mut sample);
        if let Some(fields) = self.by_gpu.get(uuid) {
            fields.apply(&mut sample);
        }
        sample
    }
}

/// The samples file and what it said when last read.
#[derive(Debug, Default)]
pub struct Samples {
    path: Option<PathBuf>,
    /// Modification time, size and inode of the file as last read (`None`: not read, or absent).
    seen: Option<(SystemTime, u64, u64)>,
    script: Script,
}

impl Samples {
    /// Samples from the file at `path`; `None`: every value is 0.
    pub fn new(path: Option<PathBuf>) -> Samples {
        Samples {
            path,
            ..Samples::default()
        }
    }

    /// What the GPU `uuid` answers now (the file is read again if it changed).
    pub fn sample(&mut self, uuid: &str) -> Sample {
        self.refresh();
        self.script.sample(uuid)
    }

    fn refresh(&mut self) {
        let Some(path) = &self.path else {
            return;
        };
        let Ok(metadata) = std::fs::metadata(path) else {
            self.seen = None;
            self.script = Script::default();
            return;
        };
        let key = (
            metadata.modified().unwrap_or(SystemTime::UNIX_EPOCH),
            metadata.len(),
            metadata.ino(),
        );
        if self.seen == Some(key) {
            return;
        }
        match std::fs::read_to_string(path) {
            Ok(text) => {
                let (script, problems) = Script::parse(&text);
                for problem in problems {
                    eprintln!("fake-nvml: {}: {problem}", path.display());
                }
                self.script = script;
                self.seen = Some(key);
            }
            Err(e) => eprintln!("fake-nvml: cannot read {}: {e}", path.display()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn star_then_gpu_lines_with_later_fields_winning() {
        let (script, problems) = Script::parse(
            "# comment\n\
             * utilization=5 temperature=40\n\
             GPU-a utilization=80 memory-used-mib=1024 power-watts=300 # trailing\n\
             GPU-a ecc-corrected=2 ecc-uncorrected=1 memory-utilization=30\n\
             \n\
             * temperature=45\n",
        );
        assert_eq!(problems, Vec::<String>::new());
        assert_eq!(
            script.sample("GPU-a"),
            Sample {
                utilization: 80,
                memory_utilization: 30,
                memory_used_mib: 1024,
                power_watts: 300,
                temperature: 45,
                ecc_corrected: 2,
                ecc_uncorrected: 1,
            }
        );
        assert_eq!(
            script.sample("GPU-b"),
            Sample {
                utilization: 5,
                temperature: 45,
                ..Sample::default()
            }
        );
        assert_eq!(script.sample("GPU-a").memory_used(512 * MIB), 512 * MIB);
    }

    #[test]
    fn malformed_fields_are_reported_and_skipped() {
        let (script, problems) =
            Script::parse("GPU-a utilization=101 speed=3 temperature=x power-watts=7 oops\n");
        assert_eq!(problems.len(), 4, "{problems:?}");
        assert!(
            problems[0].starts_with("line 1: `utilization=101`"),
            "{problems:?}"
        );
        assert_eq!(script.sample("GPU-a").power_watts, 7);
        assert_eq!(script.sample("GPU-a").utilization, 0);
    }

    #[test]
    fn the_file_is_read_again_when_it_changes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("samples");
        let mut samples = Samples::new(Some(path.clone()));
        assert_eq!(samples.sample("GPU-a").utilization, 0, "no file: zeros");
        std::fs::write(&path, "GPU-a utilization=0\n").unwrap();
        assert_eq!(samples.sample("GPU-a").utilization, 0);
        // A rewrite through a new file (another inode) is seen even within one clock tick.
        let next = dir.path().join("samples.new");
        std::fs::write(&next, "GPU-a utilization=80\n").unwrap();
        std::fs::rename(&next, &path).unwrap();
        assert_eq!(samples.sample("GPU-a").utilization, 80);
        std::fs::remove_file(&path).unwrap();
        assert_eq!(samples.sample("GPU-a").utilization, 0);
    }
}
