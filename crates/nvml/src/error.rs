//! Errors of the NVML backend: one variant per failed operation, each naming the library, GPU or
//! MIG device and the NVML query involved, so a log line says what to look at.

use std::fmt;
use std::path::PathBuf;

/// A status code returned by an NVML C function (`nvmlReturn_t`), shown with its NVML name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NvmlCode(pub u32);

impl NvmlCode {
    pub const SUCCESS: Self = Self(0);
    pub const UNINITIALIZED: Self = Self(1);
    pub const INVALID_ARGUMENT: Self = Self(2);
    pub const NOT_SUPPORTED: Self = Self(3);
    pub const NO_PERMISSION: Self = Self(4);
    pub const NOT_FOUND: Self = Self(6);
    pub const INSUFFICIENT_SIZE: Self = Self(7);
    pub const TIMEOUT: Self = Self(10);
    pub const GPU_IS_LOST: Self = Self(15);
    pub const IN_USE: Self = Self(19);
    pub const INSUFFICIENT_RESOURCES: Self = Self(23);
    pub const ARGUMENT_VERSION_MISMATCH: Self = Self(25);
    pub const UNKNOWN: Self = Self(999);

    /// The `NVML_...` name of the code, as in `nvml.h`.
    pub fn name(self) -> &'static str {
        match self.0 {
            0 => "NVML_SUCCESS",
            1 => "NVML_ERROR_UNINITIALIZED",
            2 => "NVML_ERROR_INVALID_ARGUMENT",
            3 => "NVML_ERROR_NOT_SUPPORTED",
            4 => "NVML_ERROR_NO_PERMISSION",
            5 => "NVML_ERROR_ALREADY_INITIALIZED",
            6 => "NVML_ERROR_NOT_FOUND",
            7 => "NVML_ERROR_INSUFFICIENT_SIZE",
            8 => "NVML_ERROR_INSUFFICIENT_POWER",
            9 => "NVML_ERROR_DRIVER_NOT_LOADED",
            10 => "NVML_ERROR_TIMEOUT",
            11 => "NVML_ERROR_IRQ_ISSUE",
            12 => "NVML_ERROR_LIBRARY_NOT_FOUND",
            13 => "NVML_ERROR_FUNCTION_NOT_FOUND",
            14 => "NVML_ERROR_CORRUPTED_INFOROM",
            15 => "NVML_ERROR_GPU_IS_LOST",
            16 => "NVML_ERROR_RESET_REQUIRED",
            17 => "NVML_ERROR_OPERATING_SYSTEM",
            18 => "NVML_ERROR_LIB_RM_VERSION_MISMATCH",
            19 => "NVML_ERROR_IN_USE",
            20 => "NVML_ERROR_MEMORY",
            21 => "NVML_ERROR_NO_DATA",
            22 => "NVML_ERROR_VGPU_ECC_NOT_SUPPORTED",
            23 => "NVML_ERROR_INSUFFICIENT_RESOURCES",
            24 => "NVML_ERROR_FREQ_NOT_SUPPORTED",
            25 => "NVML_ERROR_ARGUMENT_VERSION_MISMATCH",
            26 => "NVML_ERROR_DEPRECATED",
            27 => "NVML_ERROR_NOT_READY",
            28 => "NVML_ERROR_GPU_NOT_FOUND",
            29 => "NVML_ERROR_INVALID_STATE",
            999 => "NVML_ERROR_UNKNOWN",
            _ => "an NVML status unknown to Tessera",
        }
    }
}

impl fmt::Display for NvmlCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.0)
    }
}

/// Why one NVML call failed.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// A call made through nvml-wrapper failed.
    #[error(transparent)]
    Wrapper(#[from] nvml_wrapper::error::NvmlError),
    /// A call made through nvml-wrapper-sys returned a status other than `NVML_SUCCESS`.
    #[error("NVML returned {0}")]
    Status(NvmlCode),
    /// The loaded library does not export the function (an NVML older than the call).
    #[error("the NVML library does not export `{0}` (driver too old for this query)")]
    MissingSymbol(&'static str),
    /// NVML answered, but with something Tessera cannot interpret.
    #[error("NVML returned an unusable value: {0}")]
    Malformed(String),
}

impl CallError {
    /// The NVML status behind this error, when there is one.
    pub fn code(&self) -> Option<NvmlCode> {
        use nvml_wrapper::error::NvmlError as W;
        match self {
            Self::Status(code) => Some(*code),
            Self::Wrapper(W::NotSupported) => Some(NvmlCode::NOT_SUPPORTED),
            Self::Wrapper(W::NotFound) => Some(NvmlCode::NOT_FOUND),
            Self::Wrapper(W::InvalidArg) => Some(NvmlCode::INVALID_ARGUMENT),
            Self::Wrapper(W::Timeout) => Some(NvmlCode::TIMEOUT),
            Self::Wrapper(W::GpuLost) => Some(NvmlCode::GPU_IS_LOST),
            Self::Wrapper(W::InUse) => Some(NvmlCode::IN_USE),
            Self::Wrapper(W::NoPermission) => Some(NvmlCode::NO_PERMISSION),
            Self::Wrapper(W::Unknown) => Some(NvmlCode::UNKNOWN),
            Self::Wrapper(W::UnexpectedVariant(code)) => Some(NvmlCode(*code)),
            _ => None,
        }
    }

    /// The device or the driver does not offer the queried feature.
    pub fn is_not_supported(&self) -> bool {
        self.code() == Some(NvmlCode::NOT_SUPPORTED) || matches!(self, Self::MissingSymbol(_))
    }
}

/// Everything that can go wrong in the NVML backend.
#[derive(Debug, thiserror::Error)]
pub enum NvmlError {
    #[error(
        "could not load the NVML library `{path}`: {reason}. Install the NVIDIA driver (it ships \
         libnvidia-ml.so.1), make it visible to this process (e.g. mount it into the container), \
         or pass the library's path with --nvml-lib"
    )]
    LibraryNotLoaded { path: PathBuf, reason: String },

    #[error(
        "`{path}` is not a usable NVML library: it does not export `{symbol}`. Point --nvml-lib at \
         the driver's libnvidia-ml.so.1"
    )]
    LibraryIncomplete { path: PathBuf, symbol: &'static str },

    #[error(
        "NVML in `{path}` failed to initialise (nvmlInit_v2): {source}. Check that the NVIDIA \
         kernel driver is loaded and that this process may open /dev/nvidiactl"
    )]
    Init {
        path: PathBuf,
        source: nvml_wrapper::error::NvmlError,
    },

    #[error("NVML system query {query} failed: {source}")]
    SystemQuery {
        query: &'static str,
        source: CallError,
    },

    #[error("could not get the NVML handle of the GPU with index {index}: {source}")]
    DeviceHandle { index: u32, source: CallError },

    #[error("NVML query {query} failed on GPU {gpu}: {source}")]
    DeviceQuery {
        gpu: String,
        query: &'static str,
        source: CallError,
    },

    #[error("NVML query {query} failed on MIG device {mig_device} of GPU {gpu}: {source}")]
    MigDeviceQuery {
        gpu: String,
        mig_device: String,
        query: &'static str,
        source: CallError,
    },

    #[error(
        "could not resolve the PCIe root of GPU {gpu} (PCI {bus_id}) from {path}: {reason}. The \
         backend reads the host's sysfs; mount it or set the sysfs root"
    )]
    PcieRoot {
        gpu: String,
        bus_id: String,
        path: PathBuf,
        reason: String,
    },

    #[error("could not read the NUMA node of GPU {gpu} from {path}: {reason}")]
    NumaNode {
        gpu: String,
        path: PathBuf,
        reason: String,
    },

    #[error("no GPU with UUID {uuid} is visible to NVML")]
    UnknownGpu { uuid: String },

    #[error("GPU {gpu} has no MIG profile named `{profile}`; creatable profiles: {available}")]
    UnknownMigProfile {
        gpu: String,
        profile: String,
        available: String,
    },

    #[error(
        "MIG profile {profile} cannot be placed at memory slice {start} on GPU {gpu}; its \
         placements start at: {valid}"
    )]
    InvalidMigPlacement {
        gpu: String,
        profile: String,
        start: u32,
        valid: String,
    },

    #[error(
        "cannot create MIG profile {profile} at memory slice {start} on GPU {gpu}: the slices \
         are taken by another GPU instance (NVML_ERROR_INSUFFICIENT_RESOURCES); destroy it or \
         choose another placement"
    )]
    MigPlacementUnavailable {
        gpu: String,
        profile: String,
        start: u32,
    },

    #[error(
        "creating MIG {what} for profile {profile} at placement start {start} on GPU {gpu} failed: {source}"
    )]
    MigCreate {
        gpu: String,
        profile: String,
        start: u32,
        what: &'static str,
        source: CallError,
    },

    #[error(
        "no MIG device with GPU instance {gpu_instance_id} / compute instance \
         {compute_instance_id} exists on GPU {gpu}"
    )]
    UnknownMigDevice {
        gpu: String,
        gpu_instance_id: u32,
        compute_instance_id: u32,
    },

    #[error(
        "destroying MIG {what} {id} on GPU {gpu} failed: {source}. If it is in use (a process \
         still runs on it), stop that process and retry"
    )]
    MigDestroy {
        gpu: String,
        what: &'static str,
        id: u32,
        source: CallError,
    },

    #[error("NVML event set operation {operation} failed: {source}")]
    Events {
        operation: &'static str,
        source: CallError,
    },

    #[error("registering for health events on GPU {gpu} failed: {source}")]
    EventRegistration { gpu: String, source: CallError },
}

impl NvmlError {
    /// What was being done (query and object) and why it failed, for
    /// [`SourceError::Backend`](tessera_gpu_inventory::source::SourceError::Backend).
    pub fn into_operation_and_cause(self) -> (String, Box<dyn std::error::Error + Send + Sync>) {
        match self {
            NvmlError::SystemQuery { query, source } => (query.to_owned(), Box::new(source)),
            NvmlError::DeviceHandle { index, source } => (
                format!("nvmlDeviceGetHandleByIndex_v2 for GPU index {index}"),
                Box::new(source),
            ),
            NvmlError::DeviceQuery { gpu, query, source } => {
                (format!("{query} on GPU {gpu}"), Box::new(source))
            }
            NvmlError::MigDeviceQuery {
                gpu,
                mig_device,
                query,
                source,
            } => (
                format!("{query} on MIG device {mig_device} of GPU {gpu}"),
                Box::new(source),
            ),
            other => ("reading the inventory".to_owned(), Box::new(other)),
        }
    }
}
