//! The nvidia-caps device minors of MIG GPU and compute instances.
//!
//! A container uses a MIG device through `/dev/nvidia<gpu minor>` plus two capability device
//! nodes, `/dev/nvidia-caps/nvidia-cap<N>`: the GPU instance's `access` capability and the
//! compute instance's. The driver lists the minors in `/proc/driver/nvidia-caps/mig-minors`:
//!
//! ```text
//! config 1
//! monitor 2
//! gpu0/gi0/access 3
//! gpu0/gi0/ci0/access 4
//! ```
//!
//! where `gpu<N>` is the GPU's device minor. The driver lays them out in a fixed order (per GPU
//! minor, per GPU instance id 0..15: the instance's capability then compute instances 0..8);
//! [`MigCapMinors::standard`] computes that layout for nodes without the file (mock topologies).

use std::collections::BTreeMap;
use std::path::Path;

/// Where the driver lists the MIG capability minors.
pub const DEFAULT_MIG_MINORS_PATH: &str = "/proc/driver/nvidia-caps/mig-minors";

const GPU_INSTANCES_PER_GPU: u32 = 15;
const COMPUTE_INSTANCES_PER_GPU_INSTANCE: u32 = 8;
const FIRST_INSTANCE_MINOR: u32 = 3;

/// Capability minors by (GPU minor, GPU instance id, compute instance id if any).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MigCapMinors {
    /// As listed by the driver.
    Listed(BTreeMap<(u32, u32, Option<u32>), u32>),
    /// The driver's fixed layout, computed.
    Standard,
}

impl MigCapMinors {
    /// The driver's fixed layout.
    pub fn standard() -> Self {
        MigCapMinors::Standard
    }

    /// Parses the `mig-minors` file's text. Lines that are not instance capabilities
    /// (`config`, `monitor`) or do not parse are skipped.
    pub fn parse(text: &str) -> Self {
        let mut minors = BTreeMap::new();
        for line in text.lines() {
            let Some((name, minor)) = line.trim().split_once(' ') else {
                continue;
            };
            let Ok(minor) = minor.trim().parse::<u32>() else {
                continue;
            };
            if let Some(key) = parse_capability(name) {
                minors.insert(key, minor);
            }
        }
        MigCapMinors::Listed(minors)
    }

    /// Reads the file at `path`, or falls back to the standard layout when it does not exist
    /// (no NVIDIA driver: mock topologies).
    pub fn load(path: &Path) -> Self {
        match std::fs::read_to_string(path) {
            Ok(text) => Self::parse(&text),
            Err(_) => Self::standard(),
        }
    }

    /// The minor of GPU instance `gi` on the GPU with device minor `gpu_minor`.
    pub fn gpu_instance(&self, gpu_minor: u32, gi: u32) -> Option<u32> {
        self.lookup(gpu_minor, gi, None)
    }

    /// The minor of compute instance `ci` of GPU instance `gi`.
    pub fn compute_instance(&self, gpu_minor: u32, gi: u32, ci: u32) -> Option<u32> {
        self.lookup(gpu_minor, gi, Some(ci))
    }

    fn lookup(&self, gpu_minor: u32, gi: u32, ci: Option<u32>) -> Option<u32> {
        match self {
            MigCapMinors::Listed(minors) => minors.get(&(gpu_minor, gi, ci)).copied(),
            MigCapMinors::Standard => {
                if gi >= GPU_INSTANCES_PER_GPU
                    || ci.is_some_and(|ci| ci >= COMPUTE_INSTANCES_PER_GPU_INSTANCE)
                {
                    return None;
                }
                let per_gi = 1 + COMPUTE_INSTANCES_PER_GPU_INSTANCE;
                let base = FIRST_INSTANCE_MINOR + (gpu_minor * GPU_INSTANCES_PER_GPU + gi) * per_gi;
                Some(base + ci.map_or(0, |ci| ci + 1))
            }
        }
    }

    /// The standard layout as the driver would list it, for GPU minors `0..gpus` (tests).
    pub fn standard_file_text(gpus: u32) -> String {
        let mut text = String::from("config 1\nmonitor 2\n");
        let standard = Self::Standard;
        for gpu in 0..gpus {
            for gi in 0..GPU_INSTANCES_PER_GPU {
                let gi_minor = standard.gpu_instance(gpu, gi).unwrap_or_default();
                text.push_str(&format!("gpu{gpu}/gi{gi}/access {gi_minor}\n"));
                for ci in 0..COMPUTE_INSTANCES_PER_GPU_INSTANCE {
                    let ci_minor = standard.compute_instance(gpu, gi, ci).unwrap_or_default();
                    text.push_str(&format!("gpu{gpu}/gi{gi}/ci{ci}/access {ci_minor}\n"));
                }
            }
        }
        text
    }
}

/// `gpu3/gi2/access` → (3, 2, None); `gpu3/gi2/ci0/access` → (3, 2, Some(0)).
fn parse_capability(name: &str) -> Option<(u32, u32, Option<u32>)> {
    let mut parts = name.split('/');
    let gpu = parts.next()?.strip_prefix("gpu")?.parse().ok()?;
    let gi = parts.next()?.strip_prefix("gi")?.parse().ok()?;
    match (parts.next()?, parts.next(), parts.next()) {
        ("access", None, None) => Some((gpu, gi, None)),
        (ci, Some("access"), None) => Some((gpu, gi, Some(ci.strip_prefix("ci")?.parse().ok()?))),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_standard_layout_matches_the_drivers_first_lines() {
        let standard = MigCapMinors::standard();
        assert_eq!(standard.gpu_instance(0, 0), Some(3));
        assert_eq!(standard.compute_instance(0, 0, 0), Some(4));
        assert_eq!(standard.compute_instance(0, 0, 7), Some(11));
        assert_eq!(standard.gpu_instance(0, 1), Some(12));
        assert_eq!(standard.compute_instance(0, 1, 0), Some(13));
        assert_eq!(standard.gpu_instance(1, 0), Some(3 + 15 * 9));
        assert_eq!(standard.gpu_instance(0, 15), None);
        assert_eq!(standard.compute_instance(0, 0, 8), None);
    }

    #[test]
    fn listed_minors_are_parsed_and_win() {
        let text = "config 1\nmonitor 2\ngpu2/gi9/access 200\ngpu2/gi9/ci0/access 201\n\
                    garbage line\ngpu2/gi9/ci0/other 5\ngpuX/gi1/access 7\n";
        let listed = MigCapMinors::parse(text);
        assert_eq!(listed.gpu_instance(2, 9), Some(200));
        assert_eq!(listed.compute_instance(2, 9, 0), Some(201));
        assert_eq!(listed.gpu_instance(0, 0), None, "not listed");
        let MigCapMinors::Listed(map) = &listed else {
            panic!("parsed text is a listing");
        };
        assert_eq!(map.len(), 2);
        assert_eq!(
            MigCapMinors::parse(&MigCapMinors::standard_file_text(2)).compute_instance(1, 14, 7),
            MigCapMinors::standard().compute_instance(1, 14, 7)
        );
    }

    #[test]
    fn a_missing_file_falls_back_to_the_standard_layout() {
        assert_eq!(
            MigCapMinors::load(Path::new("/nonexistent/mig-minors")),
            MigCapMinors::Standard
        );
    }
}
