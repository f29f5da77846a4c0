//! The fake's opaque handles. NVML hands out pointers its callers never dereference, so the fake
//! encodes what a handle refers to in the pointer's address: a kind tag, the GPU (NVML index) and
//! the GPU/compute-instance ids or event-set number. Decoding is total: a value that does not
//! decode, or decodes to something that no longer exists, is `NVML_ERROR_INVALID_ARGUMENT` at the
//! call site, as real NVML answers for bad handles.

use std::ptr;

const KIND_SHIFT: u32 = 56;
const GPU_SHIFT: u32 = 40;
const GPU_INSTANCE_SHIFT: u32 = 20;
const FIELD_MASK: usize = (1 << 20) - 1;
const GPU_MASK: usize = (1 << 16) - 1;

/// What a handle points at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Handle {
    /// A whole GPU, by NVML index.
    Gpu { gpu: u32 },
    /// A MIG device: the compute instance `compute_instance` of GPU instance `gpu_instance`.
    MigDevice {
        gpu: u32,
        gpu_instance: u32,
        compute_instance: u32,
    },
    /// A GPU instance.
    GpuInstance { gpu: u32, gpu_instance: u32 },
    /// A compute instance.
    ComputeInstance {
        gpu: u32,
        gpu_instance: u32,
        compute_instance: u32,
    },
    /// An event set, by number.
    EventSet { set: u32 },
}

impl Handle {
    fn kind(self) -> usize {
        match self {
            Handle::Gpu { .. } => 1,
            Handle::MigDevice { .. } => 2,
            Handle::GpuInstance { .. } => 3,
            Handle::ComputeInstance { .. } => 4,
            Handle::EventSet { .. } => 5,
        }
    }

    /// The address encoding this handle (never zero: the kind tag is at least 1).
    pub fn encode(self) -> usize {
        let (gpu, a, b) = match self {
            Handle::Gpu { gpu } => (gpu, 0, 0),
            Handle::MigDevice {
                gpu,
                gpu_instance,
                compute_instance,
            }
            | Handle::ComputeInstance {
                gpu,
                gpu_instance,
                compute_instance,
            } => (gpu, gpu_instance, compute_instance),
            Handle::GpuInstance { gpu, gpu_instance } => (gpu, gpu_instance, 0),
            Handle::EventSet { set } => (0, 0, set),
        };
        (self.kind() << KIND_SHIFT)
            | ((gpu as usize & GPU_MASK) << GPU_SHIFT)
            | ((a as usize & FIELD_MASK) << GPU_INSTANCE_SHIFT)
            | (b as usize & FIELD_MASK)
    }

    /// The handle an address encodes, if it is one of ours.
    pub fn decode(address: usize) -> Option<Handle> {
        let gpu = ((address >> GPU_SHIFT) & GPU_MASK) as u32;
        let a = ((address >> GPU_INSTANCE_SHIFT) & FIELD_MASK) as u32;
        let b = (address & FIELD_MASK) as u32;
        let handle = match address >> KIND_SHIFT {
            1 => Handle::Gpu { gpu },
            2 => Handle::MigDevice {
                gpu,
                gpu_instance: a,
                compute_instance: b,
            },
            3 => Handle::GpuInstance {
                gpu,
                gpu_instance: a,
            },
            4 => Handle::ComputeInstance {
                gpu,
                gpu_instance: a,
                compute_instance: b,
            },
            5 => Handle::EventSet { set: b },
            _ => return None,
        };
        // Reject addresses with stray bits: only exact encodings are handles.
        (handle.encode() == address).then_some(handle)
    }

    /// The handle as an opaque C pointer of any NVML handle type.
    pub fn as_ptr<T>(self) -> *mut T {
        ptr::without_provenance_mut(self.encode())
    }

    /// The handle an opaque C pointer carries.
    pub fn from_ptr<T>(pointer: *mut T) -> Option<Handle> {
        Handle::decode(pointer.addr())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip_and_are_never_null() {
        let handles = [
            Handle::Gpu { gpu: 0 },
            Handle::Gpu { gpu: 7 },
            Handle::MigDevice {
                gpu: 3,
                gpu_instance: 13,
                compute_instance: 0,
            },
            Handle::GpuInstance {
                gpu: 1,
                gpu_instance: 0,
            },
            Handle::ComputeInstance {
                gpu: 1,
                gpu_instance: 2,
                compute_instance: 1,
            },
            Handle::EventSet { set: 42 },
        ];
        for handle in handles {
            assert_ne!(handle.encode(), 0);
            assert_eq!(Handle::decode(handle.encode()), Some(handle));
            assert_eq!(Handle::from_ptr(handle.as_ptr::<u8>()), Some(handle));
        }
    }

    #[test]
    fn foreign_addresses_are_not_handles() {
        assert_eq!(Handle::decode(0), None);
        assert_eq!(Handle::decode(0x7fff_1234_5678), None);
        assert_eq!(Handle::decode(Handle::Gpu { gpu: 1 }.encode() | 1), None);
    }
}
