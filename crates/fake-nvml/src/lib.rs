//! Test-only NVML: a cdylib exporting the subset of the NVML C ABI Tessera calls, answering from a topology file.
