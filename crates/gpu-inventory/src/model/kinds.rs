//! The enumerations of the inventory whose values NVML reports as codes: brand, architecture,
//! NVLink state, version and remote type, fabric state. Each knows its NVML code and its
//! topology-file spelling, so the NVML backend and fake-nvml translate the same way.

use std::fmt;

use serde::{Deserialize, Serialize};
/// Product brand (`nvmlBrandType_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Brand {
    Unknown,
    Quadro,
    Tesla,
    #[serde(rename = "NVS")]
    Nvs,
    #[serde(rename = "GRID")]
    Grid,
    GeForce,
    Titan,
    #[serde(rename = "VApps")]
    VApps,
    #[serde(rename = "VPC")]
    Vpc,
    #[serde(rename = "VCS")]
    Vcs,
    #[serde(rename = "VWS")]
    Vws,
    CloudGaming,
    #[serde(rename = "QuadroRTX")]
    QuadroRtx,
    #[serde(rename = "NvidiaRTX")]
    NvidiaRtx,
    Nvidia,
    #[serde(rename = "GeForceRTX")]
    GeForceRtx,
    #[serde(rename = "TitanRTX")]
    TitanRtx,
}

impl Brand {
    const TABLE: &[(Brand, &str, u32)] = &[
        (Brand::Unknown, "Unknown", 0),
        (Brand::Quadro, "Quadro", 1),
        (Brand::Tesla, "Tesla", 2),
        (Brand::Nvs, "NVS", 3),
        (Brand::Grid, "GRID", 4),
        (Brand::GeForce, "GeForce", 5),
        (Brand::Titan, "Titan", 6),
        (Brand::VApps, "VApps", 7),
        (Brand::Vpc, "VPC", 8),
        (Brand::Vcs, "VCS", 9),
        (Brand::Vws, "VWS", 10),
        (Brand::CloudGaming, "CloudGaming", 11),
        (Brand::QuadroRtx, "QuadroRTX", 12),
        (Brand::NvidiaRtx, "NvidiaRTX", 13),
        (Brand::Nvidia, "Nvidia", 14),
        (Brand::GeForceRtx, "GeForceRTX", 15),
        (Brand::TitanRtx, "TitanRTX", 16),
    ];

    /// The spelling published in the `brand` attribute and used in topology files.
    pub fn as_str(self) -> &'static str {
        Self::entry(self).1
    }

    /// The `nvmlBrandType_t` value.
    pub fn nvml_code(self) -> u32 {
        Self::entry(self).2
    }

    /// The brand for an `nvmlBrandType_t` value; unknown values are [`Brand::Unknown`].
    pub fn from_nvml_code(code: u32) -> Brand {
        Self::TABLE
            .iter()
            .find(|e| e.2 == code)
            .map_or(Brand::Unknown, |e| e.0)
    }

    fn entry(self) -> &'static (Brand, &'static str, u32) {
        Self::TABLE
            .iter()
            .find(|e| e.0 == self)
            .unwrap_or(&Self::TABLE[0])
    }
}

impl fmt::Display for Brand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// GPU architecture (`nvmlDeviceArchitecture_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Architecture {
    Kepler,
    Maxwell,
    Pascal,
    Volta,
    Turing,
    Ampere,
    Ada,
    Hopper,
    Blackwell,
    Unknown,
}

impl Architecture {
    const TABLE: &[(Architecture, &str, u32)] = &[
        (Architecture::Kepler, "Kepler", 2),
        (Architecture::Maxwell, "Maxwell", 3),
        (Architecture::Pascal, "Pascal", 4),
        (Architecture::Volta, "Volta", 5),
        (Architecture::Turing, "Turing", 6),
        (Architecture::Ampere, "Ampere", 7),
        (Architecture::Ada, "Ada", 8),
        (Architecture::Hopper, "Hopper", 9),
        (Architecture::Blackwell, "Blackwell", 10),
        (Architecture::Unknown, "Unknown", u32::MAX),
    ];

    /// The spelling published in the `architecture` attribute and used in topology files.
    pub fn as_str(self) -> &'static str {
        Self::entry(self).1
    }

    /// The `nvmlDeviceArchitecture_t` value (`NVML_DEVICE_ARCH_UNKNOWN` is `0xffffffff`).
    pub fn nvml_code(self) -> u32 {
        Self::entry(self).2
    }

    /// The architecture for an `nvmlDeviceArchitecture_t` value; unknown values are
    /// [`Architecture::Unknown`].
    pub fn from_nvml_code(code: u32) -> Architecture {
        Self::TABLE
            .iter()
            .find(|e| e.2 == code)
            .map_or(Architecture::Unknown, |e| e.0)
    }

    fn entry(self) -> &'static (Architecture, &'static str, u32) {
        Self::TABLE
            .iter()
            .find(|e| e.0 == self)
            .unwrap_or(&Self::TABLE[Self::TABLE.len() - 1])
    }
}

impl fmt::Display for Architecture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `nvmlEnableState_t` of a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum NvLinkState {
    Active,
    Inactive,
}

/// What the far end of a link is (`nvmlIntNvLinkDeviceType_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum NvLinkRemoteType {
    /// Another GPU (direct link or NVLink bridge).
    Gpu,
    /// An IBM NPU (POWER systems).
    #[serde(rename = "ibmNpu")]
    IbmNpu,
    /// An NVSwitch.
    #[serde(rename = "nvswitch")]
    NvSwitch,
    Unknown,
}

impl NvLinkRemoteType {
    /// The `nvmlIntNvLinkDeviceType_t` value.
    pub fn nvml_code(self) -> u32 {
        match self {
            NvLinkRemoteType::Gpu => 0,
            NvLinkRemoteType::IbmNpu => 1,
            NvLinkRemoteType::NvSwitch => 2,
            NvLinkRemoteType::Unknown => 255,
        }
    }

    /// The remote type for an `nvmlIntNvLinkDeviceType_t` value.
    pub fn from_nvml_code(code: u32) -> NvLinkRemoteType {
        match code {
            0 => NvLinkRemoteType::Gpu,
            1 => NvLinkRemoteType::IbmNpu,
            2 => NvLinkRemoteType::NvSwitch,
            _ => NvLinkRemoteType::Unknown,
        }
    }
}

/// NVLink generation (`nvmlNvlinkVersion_t`), spelled `"3.0"`, `"4.0"`, … in topology files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum NvLinkVersion {
    #[serde(rename = "1.0")]
    V1_0,
    #[serde(rename = "2.0")]
    V2_0,
    #[serde(rename = "2.2")]
    V2_2,
    #[serde(rename = "3.0")]
    V3_0,
    #[serde(rename = "3.1")]
    V3_1,
    #[serde(rename = "4.0")]
    V4_0,
    #[serde(rename = "5.0")]
    V5_0,
}

impl NvLinkVersion {
    const TABLE: &[(NvLinkVersion, u32, u32)] = &[
        // (version, nvmlNvlinkVersion_t, GB/s per link, both directions)
        (NvLinkVersion::V1_0, 1, 40),
        (NvLinkVersion::V2_0, 2, 50),
        (NvLinkVersion::V2_2, 3, 50),
        (NvLinkVersion::V3_0, 4, 50),
        (NvLinkVersion::V3_1, 5, 50),
        (NvLinkVersion::V4_0, 6, 50),
        (NvLinkVersion::V5_0, 7, 100),
    ];

    /// The `nvmlNvlinkVersion_t` value (`NVML_NVLINK_VERSION_4_0` is 6).
    pub fn nvml_code(self) -> u32 {
        Self::entry(self).1
    }

    /// The version for an `nvmlNvlinkVersion_t` value; `None` for `INVALID` and unknown values.
    pub fn from_nvml_code(code: u32) -> Option<NvLinkVersion> {
        Self::TABLE.iter().find(|e| e.1 == code).map(|e| e.0)
    }

    /// Bandwidth of one link in GB/s, both directions together: 40 (NVLink 1), 50 (NVLink 2–4:
    /// V100 6×50 = 300, A100 12×50 = 600, H100 18×50 = 900), 100 (NVLink 5: B200 18×100 = 1800).
    pub fn bandwidth_gbps_per_link(self) -> u32 {
        Self::entry(self).2
    }

    fn entry(self) -> &'static (NvLinkVersion, u32, u32) {
        Self::TABLE
            .iter()
            .find(|e| e.0 == self)
            .unwrap_or(&Self::TABLE[0])
    }
}

/// The fabric's health summary of a GPU (`nvmlGpuFabricInfo_v3_t.healthSummary`,
/// `NVML_GPU_FABRIC_HEALTH_SUMMARY_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum FabricHealth {
    /// Not reported (drivers before the v3 struct, or no fabric).
    #[default]
    NotSupported,
    Healthy,
    /// The GPU's fabric links or routes are broken.
    Unhealthy,
    /// Usable with less bandwidth (degraded links, route recovery).
    LimitedCapacity,
}

impl FabricHealth {
    /// The `NVML_GPU_FABRIC_HEALTH_SUMMARY_*` value.
    pub fn nvml_code(self) -> u8 {
        match self {
            FabricHealth::NotSupported => 0,
            FabricHealth::Healthy => 1,
            FabricHealth::Unhealthy => 2,
            FabricHealth::LimitedCapacity => 3,
        }
    }

    /// The summary for an `NVML_GPU_FABRIC_HEALTH_SUMMARY_*` value; unknown values read as not
    /// supported.
    pub fn from_nvml_code(code: u8) -> FabricHealth {
        match code {
            1 => FabricHealth::Healthy,
            2 => FabricHealth::Unhealthy,
            3 => FabricHealth::LimitedCapacity,
            _ => FabricHealth::NotSupported,
        }
    }

    /// Whether NVML did not report it (left out of the JSON form).
    pub fn is_not_supported(&self) -> bool {
        *self == FabricHealth::NotSupported
    }
}

/// `nvmlGpuFabricState_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum FabricState {
    NotSupported,
    NotStarted,
    InProgress,
    Completed,
}

impl FabricState {
    /// The `NVML_GPU_FABRIC_STATE_*` value.
    pub fn nvml_code(self) -> u8 {
        match self {
            FabricState::NotSupported => 0,
            FabricState::NotStarted => 1,
            FabricState::InProgress => 2,
            FabricState::Completed => 3,
        }
    }

    /// The state for an `NVML_GPU_FABRIC_STATE_*` value; unknown values read as not supported.
    pub fn from_nvml_code(code: u8) -> FabricState {
        match code {
            1 => FabricState::NotStarted,
            2 => FabricState::InProgress,
            3 => FabricState::Completed,
            _ => FabricState::NotSupported,
        }
    }
}
