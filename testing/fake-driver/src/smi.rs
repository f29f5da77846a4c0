//! Stand-in for `nvidia-smi`. It reads the GPUs through `libnvidia-ml.so.1` (found by the dynamic
//! loader, as the real one does; a fake driver root's copy reports the node's GPUs whose device
//! nodes this process sees) and answers:
//!
//! - no arguments: a summary (driver and CUDA version, one line per GPU);
//! - `-L` / `--list-gpus`: `GPU <i>: <name> (UUID: <uuid>)`, MIG devices indented below;
//! - `--query-gpu=<fields> --format=csv[,noheader][,nounits]` with fields `index`, `uuid`,
//!   `name`, `pci.bus_id`, `memory.total`, `driver_version`, `mig.mode.current`;
//! - `compute-policy -i <uuid|index> --set-timeslice=<0-3>` (or `--set-timeslice <n>`): what the
//!   node plugin runs for time-slicing; kept by the fake driver (under the stand-in device root)
//!   and shown by `compute-policy -l`.
//!
//! Anything else exits 2 saying it is not modelled.

use std::process::ExitCode;

use tessera_gpu_inventory::GpuInventory;
use tessera_nvml::NvmlSource;

/// The time-slice calls of the fake NVML, which the real `nvidia-smi` makes through the driver's
/// private interface.
mod private {
    #![allow(unsafe_code)]

    use std::ffi::{c_uint, c_void};

    type Device = *mut c_void;

    /// Runs `body` with the fake NVML's functions in an initialised session.
    fn with_nvml<T>(
        body: impl FnOnce(&libloading::Library, Device) -> Result<T, String>,
        index: u32,
    ) -> Result<T, String> {
        // SAFETY: loading libnvidia-ml runs its initialisers; it is the library this program
        // exists to drive (the same one NvmlSource loaded).
        let lib = unsafe { libloading::Library::new("libnvidia-ml.so.1") }
            .map_err(|e| format!("cannot load libnvidia-ml.so.1: {e}"))?;
        // SAFETY: the signatures are nvml.h's (and the fake's private calls' in
        // tessera-fake-nvml, src/exports/private.rs).
        unsafe {
            let init = lib
                .get::<unsafe extern "C" fn() -> c_uint>(b"nvmlInit_v2\0")
                .map_err(|e| e.to_string())?;
            let by_index = lib
                .get::<unsafe extern "C" fn(c_uint, *mut Device) -> c_uint>(
                    b"nvmlDeviceGetHandleByIndex_v2\0",
                )
                .map_err(|e| e.to_string())?;
            let shutdown = lib
                .get::<unsafe extern "C" fn() -> c_uint>(b"nvmlShutdown\0")
                .map_err(|e| e.to_string())?;
            let status = init();
            if status != 0 {
                return Err(format!("nvmlInit_v2 failed with status {status}"));
            }
            let mut device: Device = std::ptr::null_mut();
            let status = by_index(index, &mut device);
            let result = if status == 0 {
                body(&lib, device)
            } else {
                Err(format!("no GPU with index {index} (status {status})"))
            };
            shutdown();
            result
        }
    }

    pub fn set_time_slice(index: u32, value: u32) -> Result<(), String> {
        with_nvml(
            |lib, device| {
                // SAFETY: the fake's private call: (device handle, value) -> status.
                let status = unsafe {
                    let set = lib
                        .get::<unsafe extern "C" fn(Device, c_uint) -> c_uint>(
                            b"tesseraFakeNvmlDeviceSetTimeslice\0",
                        )
                        .map_err(|e| format!("this libnvidia-ml has no time-slice call: {e}"))?;
                    set(device, value)
                };
                match status {
                    0 => Ok(()),
                    status => Err(format!(
                        "setting the time slice failed with status {status}"
                    )),
                }
            },
            index,
        )
    }

    pub fn time_slice(index: u32) -> Result<u32, String> {
        with_nvml(
            |lib, device| {
                let mut value: c_uint = 0;
                // SAFETY: the fake's private call: (device handle, out value) -> status.
                let status = unsafe {
                    let get = lib
                        .get::<unsafe extern "C" fn(Device, *mut c_uint) -> c_uint>(
                            b"tesseraFakeNvmlDeviceGetTimeslice\0",
                        )
                        .map_err(|e| format!("this libnvidia-ml has no time-slice call: {e}"))?;
                    get(device, &mut value)
                };
                match status {
                    0 => Ok(value),
                    status => Err(format!(
                        "reading the time slice failed with status {status}"
                    )),
                }
            },
            index,
        )
    }
}

fn inventory() -> Result<GpuInventory, String> {
    let source = NvmlSource::open(None).map_err(|e| {
        format!("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver: {e}")
    })?;
    source
        .read_inventory()
        .map_err(|e| format!("reading the GPUs failed: {e}"))
}

/// `-L`.
pub fn list(inventory: &GpuInventory) -> String {
    let mut out = String::new();
    for gpu in &inventory.gpus {
        out.push_str(&format!(
            "GPU {}: {} (UUID: {})\n",
            gpu.index, gpu.product_name, gpu.uuid
        ));
        for (i, instance) in gpu
            .mig
            .iter()
            .filter(|m| m.enabled)
            .flat_map(|m| &m.instances)
            .enumerate()
        {
            out.push_str(&format!(
                "  MIG {:<13} Device {i:>2}: (UUID: {})\n",
                instance.profile, instance.uuid
            ));
        }
    }
    out
}

/// No arguments.
pub fn summary(inventory: &GpuInventory) -> String {
    let mut out = format!(
        "NVIDIA-SMI (stand-in)   Driver Version: {}   CUDA Version: {}\n",
        inventory.driver_version, inventory.cuda_driver_version
    );
    for gpu in &inventory.gpus {
        let mig = gpu
            .mig
            .as_ref()
            .map_or("N/A", |m| if m.enabled { "Enabled" } else { "Disabled" });
        out.push_str(&format!(
            "GPU {:>2}  {:<28} {}  {:>7}MiB  MIG {}\n",
            gpu.index,
            gpu.product_name,
            gpu.pci_bus_id,
            gpu.memory_bytes >> 20,
            mig
        ));
    }
    out
}

/// `--query-gpu=<fields> --format=<format>`.
pub fn query(inventory: &GpuInventory, fields: &str, format: &str) -> Result<String, String> {
    let options: Vec<&str> = format.split(',').map(str::trim).collect();
    if options.first() != Some(&"csv") {
        return Err(format!("--format={format}: only csv is modelled"));
    }
    let header = !options.contains(&"noheader");
    let units = !options.contains(&"nounits");
    let fields: Vec<&str> = fields.split(',').map(str::trim).collect();
    let mut out = String::new();
    if header {
        out.push_str(&fields.join(", "));
        out.push('\n');
    }
    for gpu in &inventory.gpus {
        let mut values = Vec::new();
        for field in &fields {
            values.push(match *field {
                "index" => gpu.index.to_string(),
                "uuid" => gpu.uuid.clone(),
                "name" => gpu.product_name.clone(),
                "pci.bus_id" => format!("0000{}", gpu.pci_bus_id.to_uppercase()),
                "memory.total" if units => format!("{} MiB", gpu.memory_bytes >> 20),
                "memory.total" => (gpu.memory_bytes >> 20).to_string(),
                "driver_version" => inventory.driver_version.clone(),
                "mig.mode.current" => match &gpu.mig {
                    Some(m) if m.enabled => "Enabled".into(),
                    Some(_) => "Disabled".into(),
                    None => "[N/A]".into(),
                },
                other => return Err(format!("Field \"{other}\" is not a valid field to query.")),
            });
        }
        out.push_str(&values.join(", "));
        out.push('\n');
    }
    Ok(out)
}

/// The GPU `-i` names: an index or a (GPU) UUID.
fn gpu_index(inventory: &GpuInventory, id: &str) -> Result<u32, String> {
    inventory
        .gpus
        .iter()
        .find(|g| g.uuid == id || g.index.to_string() == id)
        .map(|g| g.index)
        .ok_or_else(|| format!("No GPU matches -i {id}"))
}

fn compute_policy(inventory: &GpuInventory, args: &[String]) -> Result<String, String> {
    let mut id = None;
    let mut slice = None;
    let mut list = false;
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "-i" | "--id" => id = rest.next().cloned(),
            "-l" | "--list" => list = true,
            "--set-timeslice" => slice = rest.next().cloned(),
            other => match other.strip_prefix("--set-timeslice=") {
                Some(value) => slice = Some(value.to_owned()),
                None => return Err(format!("compute-policy: `{other}` is not modelled")),
            },
        }
    }
    let targets: Vec<u32> = match &id {
        Some(id) => vec![gpu_index(inventory, id)?],
        None => inventory.gpus.iter().map(|g| g.index).collect(),
    };
    if let Some(value) = slice {
        let value: u32 =
            value.parse().ok().filter(|v| *v <= 3).ok_or_else(|| {
                format!("--set-timeslice={value}: the time slice is 0, 1, 2 or 3")
            })?;
        let mut out = String::new();
        for index in targets {
            private::set_time_slice(index, value)?;
            out.push_str(&format!(
                "Successfully set the timeslice of GPU {} to {value}\n",
                inventory.gpus[index as usize].uuid
            ));
        }
        return Ok(out);
    }
    if list {
        let mut out = String::new();
        for index in targets {
            let value = private::time_slice(index)?;
            out.push_str(&format!(
                "GPU {index} {}: timeslice {value}\n",
                inventory.gpus[index as usize].uuid
            ));
        }
        return Ok(out);
    }
    Err("compute-policy: give --set-timeslice or -l".into())
}

/// `nvidia-smi`.
pub fn main(args: &[String]) -> ExitCode {
    let inventory = match inventory() {
        Ok(inventory) => inventory,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(9);
        }
    };
    let query_gpu = args.iter().find_map(|a| a.strip_prefix("--query-gpu="));
    let format = args.iter().find_map(|a| a.strip_prefix("--format="));
    let result = match (args.first().map(String::as_str), query_gpu) {
        (None, _) => Ok(summary(&inventory)),
        (_, Some(fields)) => query(&inventory, fields, format.unwrap_or("csv")),
        (Some("-L" | "--list-gpus"), _) => Ok(list(&inventory)),
        (Some("compute-policy"), _) => compute_policy(&inventory, &args[1..]),
        _ => {
            eprintln!(
                "nvidia-smi (stand-in of a fake driver root): `{}` is not modelled",
                args.join(" ")
            );
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::from(6)
        }
    }
}

#[cfg(test)]
mod tests {
    use tessera_gpu_inventory::{DeviceSource, MockSource};

    use super::*;

    #[test]
    fn listings_name_every_gpu_and_mig_device() {
        let inventory = MockSource::new("hgx-a100-mig")
            .unwrap()
            .inventory()
            .unwrap();
        let text = list(&inventory);
        let gpu0 = &inventory.gpus[0];
        assert!(text.starts_with(&format!(
            "GPU 0: {} (UUID: {})\n",
            gpu0.product_name, gpu0.uuid
        )));
        let mig = &gpu0.mig.as_ref().unwrap().instances[0];
        assert!(text.contains(&format!("(UUID: {})", mig.uuid)), "{text}");
        let csv = query(&inventory, "index,uuid,mig.mode.current", "csv,noheader").unwrap();
        assert_eq!(csv.lines().count(), 8);
        assert_eq!(
            csv.lines().next().unwrap(),
            format!("0, {}, Enabled", gpu0.uuid)
        );
        assert!(query(&inventory, "power.draw", "csv").is_err());
        assert!(summary(&inventory).contains(&inventory.driver_version));
        assert_eq!(gpu_index(&inventory, &inventory.gpus[3].uuid), Ok(3));
        assert!(gpu_index(&inventory, "GPU-nope").is_err());
    }
}
