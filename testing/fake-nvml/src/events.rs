//! Event injection for health tests.
//!
//! The file named by `TESSERA_FAKE_NVML_EVENTS` is an append-only log a test writes to, one event
//! per line:
//!
//! ```text
//! xid <uuid> <xid>        # an XID error, e.g. `xid GPU-2cd0... 79`
//! ecc-single <uuid>       # a corrected (single-bit) ECC error
//! ecc-double <uuid>       # an uncorrectable (double-bit) ECC error
//! ```
//!
//! `<uuid>` is a GPU UUID or a MIG device UUID (then the event is reported on the parent GPU with
//! the MIG device's GPU- and compute-instance ids, as NVML does). Blank lines and lines starting
//! with `#` are ignored; a malformed line is reported on stderr and skipped. An event set sees the
//! lines appended after it was created (`nvmlEventSetCreate`), once, and only for GPUs and event
//! types registered on it. Only complete lines (ending in a newline) are read.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;

use nvml_wrapper_sys::bindings::{
    nvmlEventTypeDoubleBitEccError, nvmlEventTypeSingleBitEccError, nvmlEventTypeXidCriticalError,
};

use crate::driver::Driver;
use crate::handles::Handle;
use crate::status::{INVALID_ARGUMENT, NOT_SUPPORTED, Status};

/// The event types the fake can deliver (and reports as supported for every GPU).
pub const SUPPORTED_EVENT_TYPES: u64 = (nvmlEventTypeXidCriticalError
    | nvmlEventTypeSingleBitEccError
    | nvmlEventTypeDoubleBitEccError) as u64;

/// NVML's "not attributable to a GPU/compute instance" marker.
const NO_INSTANCE: u32 = u32::MAX;

/// One event as `nvmlEventSetWait_v2` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FakeEvent {
    pub gpu: u32,
    pub event_type: u64,
    pub data: u64,
    pub gpu_instance: u32,
    pub compute_instance: u32,
}

/// A parsed line of the injection file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InjectedEvent {
    Xid { uuid: String, xid: u64 },
    SingleBitEcc { uuid: String },
    DoubleBitEcc { uuid: String },
}

impl InjectedEvent {
    /// Parses one line; `Ok(None)` for blank and comment lines.
    pub fn parse(line: &str) -> Result<Option<InjectedEvent>, String> {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            return Ok(None);
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        let event = match words.as_slice() {
            ["xid", uuid, xid] => InjectedEvent::Xid {
                uuid: (*uuid).to_owned(),
                xid: xid
                    .parse()
                    .map_err(|_| format!("`{xid}` is not an XID number"))?,
            },
            ["ecc-single", uuid] => InjectedEvent::SingleBitEcc {
                uuid: (*uuid).to_owned(),
            },
            ["ecc-double", uuid] => InjectedEvent::DoubleBitEcc {
                uuid: (*uuid).to_owned(),
            },
            _ => {
                return Err(format!(
                    "`{line}` is not `xid <uuid> <xid>`, `ecc-single <uuid>` or `ecc-double <uuid>`"
                ));
            }
        };
        Ok(Some(event))
    }

    fn uuid(&self) -> &str {
        match self {
            InjectedEvent::Xid { uuid, .. }
            | InjectedEvent::SingleBitEcc { uuid }
            | InjectedEvent::DoubleBitEcc { uuid } => uuid,
        }
    }

    fn type_and_data(&self) -> (u64, u64) {
        match self {
            InjectedEvent::Xid { xid, .. } => (u64::from(nvmlEventTypeXidCriticalError), *xid),
            InjectedEvent::SingleBitEcc { .. } => (u64::from(nvmlEventTypeSingleBitEccError), 0),
            InjectedEvent::DoubleBitEcc { .. } => (u64::from(nvmlEventTypeDoubleBitEccError), 0),
        }
    }

    /// The event as NVML reports it, resolved against the driver's GPUs and MIG devices.
    fn resolve(&self, driver: &Driver) -> Result<FakeEvent, String> {
        let (event_type, data) = self.type_and_data();
        let (gpu, gpu_instance, compute_instance) = match driver.handle_by_uuid(self.uuid()) {
            Ok(Handle::Gpu { gpu }) => (gpu, NO_INSTANCE, NO_INSTANCE),
            Ok(Handle::MigDevice {
                gpu,
                gpu_instance,
                compute_instance,
            }) => (gpu, gpu_instance, compute_instance),
            _ => return Err(format!("no GPU or MIG device has UUID `{}`", self.uuid())),
        };
        Ok(FakeEvent {
            gpu,
            event_type,
            data,
            gpu_instance,
            compute_instance,
        })
    }
}

#[derive(Debug)]
struct EventSet {
    /// Registered event types per GPU.
    registrations: HashMap<u32, u64>,
    /// Bytes of the injection file already consumed.
    offset: u64,
    /// Lines already consumed (for messages).
    line: usize,
    pending: VecDeque<FakeEvent>,
}

/// The event sets of the process and the injection file they read.
#[derive(Debug, Default)]
pub struct EventSets {
    file: Option<PathBuf>,
    next: u32,
    sets: HashMap<u32, EventSet>,
}

impl EventSets {
    pub fn new(file: Option<PathBuf>) -> EventSets {
        EventSets {
            file,
            next: 1,
            sets: HashMap::new(),
        }
    }

    /// A new event set that sees lines appended from now on.
    pub fn create(&mut self) -> u32 {
        let (offset, line) = self.file_end();
        let id = self.next;
        self.next += 1;
        self.sets.insert(
            id,
            EventSet {
                registrations: HashMap::new(),
                offset,
                line,
                pending: VecDeque::new(),
            },
        );
        id
    }

    pub fn free(&mut self, set: u32) -> Result<(), Status> {
        self.sets.remove(&set).map(|_| ()).ok_or(INVALID_ARGUMENT)
    }

    pub fn register(&mut self, set: u32, gpu: u32, types: u64) -> Result<(), Status> {
        if types & !SUPPORTED_EVENT_TYPES != 0 {
            return Err(NOT_SUPPORTED);
        }
        let set = self.sets.get_mut(&set).ok_or(INVALID_ARGUMENT)?;
        *set.registrations.entry(gpu).or_default() |= types;
        Ok(())
    }

    /// The next event for `set`, reading what was appended to the injection file since the last
    /// poll. `Err` for an unknown set.
    pub fn poll(&mut self, set: u32, driver: &Driver) -> Result<Option<FakeEvent>, Status> {
        let file = self.file.clone();
        let state = self.sets.get_mut(&set).ok_or(INVALID_ARGUMENT)?;
        if state.pending.is_empty()
            && let Some(path) = &file
        {
            read_new_lines(path, state, driver);
        }
        Ok(state.pending.pop_front())
    }

    /// Length and line count of the injection file now (zero when it does not exist yet).
    fn file_end(&self) -> (u64, usize) {
        let Some(path) = &self.file else {
            return (0, 0);
        };
        match std::fs::read(path) {
            Ok(bytes) => (
                bytes.len() as u64,
                bytes.iter().filter(|&&b| b == b'\n').count(),
            ),
            Err(_) => (0, 0),
        }
    }
}

fn read_new_lines(path: &PathBuf, state: &mut EventSet, driver: &Driver) {
    let mut bytes = Vec::new();
    let read = File::open(path).and_then(|mut file| {
        file.seek(SeekFrom::Start(state.offset))?;
        file.read_to_end(&mut bytes)
    });
    if read.is_err() {
        // Not written yet: nothing to deliver.
        return;
    }
    let Some(complete) = bytes.iter().rposition(|&b| b == b'\n').map(|end| end + 1) else {
        return;
    };
    state.offset += complete as u64;
    for line in String::from_utf8_lossy(&bytes[..complete]).lines() {
        state.line += 1;
        match InjectedEvent::parse(line)
            .and_then(|event| event.map(|e| e.resolve(driver)).transpose())
        {
            Ok(Some(event)) => {
                let registered = state.registrations.get(&event.gpu).copied().unwrap_or(0);
                if registered & event.event_type != 0 {
                    state.pending.push_back(event);
                }
            }
            Ok(None) => {}
            Err(problem) => {
                eprintln!(
                    "fake-nvml: {}:{}: {problem}; line skipped",
                    path.display(),
                    state.line
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use tessera_gpu_inventory::mock::{parse_topology, shipped_topology};

    #[test]
    fn lines_parse() {
        assert_eq!(
            InjectedEvent::parse("xid GPU-1 79"),
            Ok(Some(InjectedEvent::Xid {
                uuid: "GPU-1".into(),
                xid: 79
            }))
        );
        assert_eq!(
            InjectedEvent::parse("  ecc-double MIG-2 "),
            Ok(Some(InjectedEvent::DoubleBitEcc {
                uuid: "MIG-2".into()
            }))
        );
        assert_eq!(InjectedEvent::parse("# comment"), Ok(None));
        assert_eq!(InjectedEvent::parse(""), Ok(None));
        assert!(InjectedEvent::parse("xid GPU-1 lots").is_err());
        assert!(InjectedEvent::parse("reboot GPU-1").is_err());
    }

    #[test]
    fn sets_see_registered_events_appended_after_creation_once() {
        let yaml = shipped_topology("hgx-a100-mig").unwrap();
        let driver = Driver::new(parse_topology("hgx-a100-mig", yaml).unwrap()).unwrap();
        let gpu0 = driver.inventory().gpus[0].uuid.clone();
        let gpu1 = driver.inventory().gpus[1].uuid.clone();
        let mig = driver.inventory().gpus[0].mig.as_ref().unwrap().instances[0].clone();

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events");
        std::fs::write(&path, format!("xid {gpu0} 13\n")).unwrap();
        let mut sets = EventSets::new(Some(path.clone()));
        let set = sets.create();
        sets.register(set, 0, SUPPORTED_EVENT_TYPES).unwrap();
        assert_eq!(sets.poll(set, &driver), Ok(None), "written before creation");

        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        write!(
            file,
            "xid {gpu1} 48\nbogus line\nxid {} 79\necc-double {gpu0}\nxid {gpu0} 31",
            mig.uuid
        )
        .unwrap();
        let first = sets.poll(set, &driver).unwrap().unwrap();
        assert_eq!(first.gpu, 0, "GPU 1 is not registered");
        assert_eq!(first.data, 79);
        assert_eq!(
            (first.gpu_instance, first.compute_instance),
            (mig.gpu_instance_id, mig.compute_instance_id)
        );
        let second = sets.poll(set, &driver).unwrap().unwrap();
        assert_eq!(second.event_type, u64::from(nvmlEventTypeDoubleBitEccError));
        assert_eq!(second.gpu_instance, NO_INSTANCE);
        assert_eq!(
            sets.poll(set, &driver),
            Ok(None),
            "the last line is incomplete"
        );
        writeln!(file).unwrap();
        assert_eq!(sets.poll(set, &driver).unwrap().unwrap().data, 31);
        assert_eq!(sets.poll(set, &driver), Ok(None));
        sets.free(set).unwrap();
        assert_eq!(sets.poll(set, &driver), Err(INVALID_ARGUMENT));
    }

    #[test]
    fn unsupported_event_types_are_refused() {
        let mut sets = EventSets::new(None);
        let set = sets.create();
        assert_eq!(sets.register(set, 0, 4), Err(NOT_SUPPORTED));
        assert_eq!(sets.register(99, 0, 8), Err(INVALID_ARGUMENT));
    }
}
