//! The stand-in for NVIDIA driver libraries that only need to exist in a fake driver root
//! (OpenCL, video, graphics, ...): an empty shared library. The fake driver root tool
//! (tessera-fake-driver) copies it once per library and writes the library's soname over the
//! placeholder this one is linked with. Kept free of dependencies so each copy stays small.

/// Something to export: a marker naming what this is.
#[allow(unsafe_code)] // a `no_mangle` export; the name is ours alone
#[unsafe(no_mangle)]
pub static TESSERA_FAKE_DRIVER_STUB: [u8; 8] = *b"stand-in";
