//! Who belongs to a group and how many must start together: a pod names its group with the
//! upstream field `spec.schedulingGroup.podGroupName` (a `scheduling.k8s.io/v1beta1` PodGroup with a
//! `gang` policy gives `minCount`), or, where the cluster does not serve that API, with the label
//! [`GROUP_LABEL`] and the annotation [`GROUP_MIN_COUNT_ANNOTATION`].

use std::fmt;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::scheduling::v1beta1::PodGroup;
use k8s_openapi::jiff::Timestamp;
use tessera_api::names::{GROUP_LABEL, GROUP_MIN_COUNT_ANNOTATION};

use crate::group::error::GroupError;
use crate::protocol::object_key;

/// How a group is named.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GroupSource {
    /// `spec.schedulingGroup.podGroupName`: a `scheduling.k8s.io/v1beta1` PodGroup.
    PodGroup,
    /// The label [`GROUP_LABEL`] with the annotation [`GROUP_MIN_COUNT_ANNOTATION`].
    Label,
}

/// A group: namespace, name and how it is named.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GroupKey {
    pub namespace: String,
    pub name: String,
    pub source: GroupSource,
}

impl fmt::Display for GroupKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.source {
            GroupSource::PodGroup => write!(f, "PodGroup {}/{}", self.namespace, self.name),
            GroupSource::Label => write!(f, "group {}/{}", self.namespace, self.name),
        }
    }
}

/// The group `pod` names, if any: the PodGroup of `spec.schedulingGroup.podGroupName` first, else
/// the label [`GROUP_LABEL`]. An empty name is no group.
pub fn group_key(pod: &Pod) -> Option<GroupKey> {
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    if let Some(name) = pod
        .spec
        .as_ref()
        .and_then(|s| s.scheduling_group.as_ref())
        .and_then(|g| g.pod_group_name.as_deref())
        .filter(|n| !n.is_empty())
    {
        return Some(GroupKey {
            namespace,
            name: name.to_owned(),
            source: GroupSource::PodGroup,
        });
    }
    let name = pod
        .metadata
        .labels
        .as_ref()?
        .get(GROUP_LABEL)
        .filter(|n| !n.is_empty())?;
    Some(GroupKey {
        namespace,
        name: name.clone(),
        source: GroupSource::Label,
    })
}

/// A label-named group's `minCount`, from the pods' annotations (all that carry it must agree).
pub fn label_min_count<'p>(
    key: &GroupKey,
    pods: impl IntoIterator<Item = &'p Pod>,
) -> Result<u32, GroupError> {
    let mut found: Option<u32> = None;
    let mut first_pod = None;
    for pod in pods {
        let name = object_key(&pod.metadata);
        first_pod.get_or_insert_with(|| name.clone());
        let Some(value) = pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(GROUP_MIN_COUNT_ANNOTATION))
        else {
            continue;
        };
        let count = value
            .trim()
            .parse::<u32>()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| GroupError::BadMinCount {
                pod: name.clone(),
                value: value.clone(),
            })?;
        match found {
            Some(first) if first != count => {
                return Err(GroupError::ConflictingMinCount {
                    group: key.to_string(),
                    pod: name,
                    value: count,
                    first,
                });
            }
            _ => found = Some(count),
        }
    }
    found.ok_or_else(|| GroupError::MissingMinCount {
        pod: first_pod.unwrap_or_default(),
        group: key.name.clone(),
    })
}

/// A PodGroup's `minCount`: `Some` for a gang policy, `None` for the basic policy (its pods are
/// placed one by one).
pub fn pod_group_min_count(group: &PodGroup) -> Result<Option<u32>, GroupError> {
    let Some(gang) = group.spec.scheduling_policy.gang.as_ref() else {
        return Ok(None);
    };
    u32::try_from(gang.min_count)
        .ok()
        .filter(|n| *n > 0)
        .map(Some)
        .ok_or_else(|| GroupError::BadPodGroupMinCount {
            group: object_key(&group.metadata),
            value: gang.min_count,
        })
}

/// When a pod was created: its place in the group's order (the epoch when unknown).
pub fn member_arrival(pod: &Pod) -> Timestamp {
    pod.metadata
        .creation_timestamp
        .as_ref()
        .map(|t| t.0)
        .unwrap_or(Timestamp::UNIX_EPOCH)
}
