//! Test-only stand-in for `libcuda.so.1`, the CUDA driver library. A fake driver root
//! (`tessera-fake-driver-root`) installs the cdylib as `libcuda.so.<driver version>` with the
//! soname links of a real install, so a program that `dlopen`s `libcuda.so.1` and calls the driver
//! API — a CUDA program, or Tessera's in-container checker — runs against it unchanged.
//!
//! What it answers ([`exports`]): `cuInit`, `cuDriverGetVersion`, `cuDeviceGetCount`,
//! `cuDeviceGet`, `cuDeviceGetName`, `cuDeviceGetUuid(_v2)`, `cuDeviceTotalMem_v2`,
//! `cuDeviceComputeCapability`, `cuDeviceGetAttribute` (multiprocessors, compute capability, PCI
//! ids, MPS enabled), `cuDeviceGetPCIBusId`, `cuGetErrorName`, `cuGetErrorString`. Nothing runs
//! kernels or allocates memory.
//!
//! Where the answers come from, as a real libcuda gets them from the kernel driver:
//! `libnvidia-ml.so.1` (found through the dynamic loader, like the real one; a fake driver root's
//! copy knows the node's GPUs and reports those whose device nodes the process sees), then the
//! rules of [`devices`] (MIG GPUs expose their MIG devices, those whose capability nodes the
//! process sees as the fake NVML reports them; `CUDA_VISIBLE_DEVICES` selects and orders), and
//! MPS ([`mps`]): when a control daemon listens in the pipe directory, `cuInit` attaches to it
//! and `CU_DEVICE_ATTRIBUTE_MPS_ENABLED` reads 1.

pub mod devices;
pub mod exports;
pub mod mps;

/// File name of the built library (in the target directory next to `deps/`).
pub const LIBRARY_FILE_NAME: &str = "libtessera_fake_cuda.so";
