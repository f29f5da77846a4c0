//! GPU inventory model; DeviceSource with NVML and mock backends; inventory to ResourceSlice rendering (pure).
