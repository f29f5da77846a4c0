//! Loading and initialising the NVML library without ever panicking.
//!
//! nvml-wrapper resolves symbols leniently (a missing one fails when called), except that its
//! `Drop for Nvml` calls `nvmlShutdown` unconditionally and panics when the library lacks it. So
//! before handing a library to nvml-wrapper we open it once ourselves and check that the two
//! functions every session needs — `nvmlInit_v2` and `nvmlShutdown` — are exported.

use std::path::{Path, PathBuf};

use nvml_wrapper::Nvml;
use nvml_wrapper::error::NvmlError as WrapperError;
use nvml_wrapper_sys::bindings::NvmlLib;

use super::error::NvmlError;

/// The library name the NVIDIA driver installs; the dynamic loader's search path applies.
pub const DEFAULT_LIBRARY: &str = "libnvidia-ml.so.1";

/// Functions without which a session cannot be opened and closed safely.
const REQUIRED_SYMBOLS: [&str; 2] = ["nvmlInit_v2", "nvmlShutdown"];

/// Opens the NVML library at `lib_path` (default [`DEFAULT_LIBRARY`]) and initialises it.
pub(crate) fn open(lib_path: Option<&Path>) -> Result<(Nvml, PathBuf), NvmlError> {
    let path = lib_path.map_or_else(|| PathBuf::from(DEFAULT_LIBRARY), Path::to_path_buf);
    check_required_symbols(&path)?;
    let nvml =
        Nvml::builder()
            .lib_path(path.as_os_str())
            .init()
            .map_err(|source| match source {
                WrapperError::LibloadingError(e) => NvmlError::LibraryNotLoaded {
                    path: path.clone(),
                    reason: e.to_string(),
                },
                WrapperError::FailedToLoadSymbol(_) => NvmlError::LibraryIncomplete {
                    path: path.clone(),
                    symbol: "nvmlInit_v2",
                },
                source => NvmlError::Init {
                    path: path.clone(),
                    source,
                },
            })?;
    Ok((nvml, path))
}

fn check_required_symbols(path: &Path) -> Result<(), NvmlError> {
    // SAFETY: loading a shared library runs its initialisers. The path is the NVML library the
    // operator configured (or the driver's default name); loading it is what using NVML means,
    // and nvml-wrapper loads the same file right after. No function is called here.
    let lib =
        unsafe { NvmlLib::new(path.as_os_str()) }.map_err(|e| NvmlError::LibraryNotLoaded {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
    let present = [lib.nvmlInit_v2.is_ok(), lib.nvmlShutdown.is_ok()];
    for (symbol, present) in REQUIRED_SYMBOLS.into_iter().zip(present) {
        if !present {
            return Err(NvmlError::LibraryIncomplete {
                path: path.to_path_buf(),
                symbol,
            });
        }
    }
    Ok(())
}
