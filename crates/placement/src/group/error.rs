//! Bad group input: a group's definition, or the controller's topology levels.

use tessera_api::names::{BLOCK_LABEL, GROUP_LABEL, GROUP_MIN_COUNT_ANNOTATION, RACK_LABEL};

/// Bad group input: each names the object, the field and the fix.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GroupError {
    #[error(
        "pod {pod}: annotation {GROUP_MIN_COUNT_ANNOTATION}={value:?} is not a positive integer; set it to how many of the group's pods must start together"
    )]
    BadMinCount { pod: String, value: String },
    #[error(
        "pod {pod}: label {GROUP_LABEL}={group} needs the annotation {GROUP_MIN_COUNT_ANNOTATION} (how many of the group's pods must start together)"
    )]
    MissingMinCount { pod: String, group: String },
    #[error(
        "pods of {group} disagree on annotation {GROUP_MIN_COUNT_ANNOTATION}: pod {pod} says {value}, an earlier pod {first}; give every pod of the group the same value"
    )]
    ConflictingMinCount {
        group: String,
        pod: String,
        value: u32,
        first: u32,
    },
    #[error(
        "PodGroup {group}: spec.schedulingPolicy.gang.minCount is {value}; it must be a positive integer"
    )]
    BadPodGroupMinCount { group: String, value: i32 },
    #[error(
        "topology levels {value:?}: entry {index} is empty; give node label keys separated by commas, finest first (e.g. {RACK_LABEL},{BLOCK_LABEL})"
    )]
    EmptyLevel { value: String, index: usize },
}
