//! `matchAttribute` and `distinctAttribute` constraints, checked as devices are added to and
//! removed from a claim's partial allocation (removal is always in reverse order of addition).
//!
//! Attributes are compared as sets so that list attributes (1.36+) work too; a scalar is a set of
//! one. `matchAttribute`: every device must have the attribute and all values must share at least
//! one element (for scalars: be equal). `distinctAttribute`: every device must have the attribute
//! and the values must be pairwise disjoint (for scalars: all different). A device lacking the
//! attribute, or with an attribute of no known type, never satisfies a constraint.

use std::collections::BTreeSet;

use k8s_openapi::api::resource::v1::DeviceAttribute;

use crate::device::DeviceEntry;
use crate::request::{ConstraintKind, ConstraintSpec, Slot};

/// An attribute value as a set of typed elements.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum AttrSet {
    Ints(BTreeSet<i64>),
    Bools(BTreeSet<bool>),
    Strings(BTreeSet<String>),
    Versions(BTreeSet<String>),
}

impl AttrSet {
    pub fn of(a: &DeviceAttribute) -> Option<AttrSet> {
        fn set<T: Ord + Clone>(v: &[T]) -> BTreeSet<T> {
            v.iter().cloned().collect()
        }
        match a {
            DeviceAttribute { ints: Some(v), .. } if !v.is_empty() => Some(AttrSet::Ints(set(v))),
            DeviceAttribute { bools: Some(v), .. } if !v.is_empty() => Some(AttrSet::Bools(set(v))),
            DeviceAttribute {
                strings: Some(v), ..
            } if !v.is_empty() => Some(AttrSet::Strings(set(v))),
            DeviceAttribute {
                versions: Some(v), ..
            } if !v.is_empty() => Some(AttrSet::Versions(set(v))),
            DeviceAttribute { int: Some(v), .. } => Some(AttrSet::Ints([*v].into())),
            DeviceAttribute { bool: Some(v), .. } => Some(AttrSet::Bools([*v].into())),
            DeviceAttribute {
                string: Some(v), ..
            } => Some(AttrSet::Strings([v.clone()].into())),
            DeviceAttribute {
                version: Some(v), ..
            } => Some(AttrSet::Versions([v.clone()].into())),
            _ => None,
        }
    }

    pub fn intersection(&self, other: &AttrSet) -> Option<AttrSet> {
        let r = match (self, other) {
            (AttrSet::Ints(a), AttrSet::Ints(b)) => {
                AttrSet::Ints(a.intersection(b).copied().collect())
            }
            (AttrSet::Bools(a), AttrSet::Bools(b)) => {
                AttrSet::Bools(a.intersection(b).copied().collect())
            }
            (AttrSet::Strings(a), AttrSet::Strings(b)) => {
                AttrSet::Strings(a.intersection(b).cloned().collect())
            }
            (AttrSet::Versions(a), AttrSet::Versions(b)) => {
                AttrSet::Versions(a.intersection(b).cloned().collect())
            }
            _ => return None,
        };
        (!r.is_empty()).then_some(r)
    }

    /// Each element on its own, as a set of one.
    pub fn elements(&self) -> Vec<AttrSet> {
        match self {
            AttrSet::Ints(s) => s.iter().map(|x| AttrSet::Ints([*x].into())).collect(),
            AttrSet::Bools(s) => s.iter().map(|x| AttrSet::Bools([*x].into())).collect(),
            AttrSet::Strings(s) => s
                .iter()
                .map(|x| AttrSet::Strings([x.clone()].into()))
                .collect(),
            AttrSet::Versions(s) => s
                .iter()
                .map(|x| AttrSet::Versions([x.clone()].into()))
                .collect(),
        }
    }

    fn is_empty(&self) -> bool {
        match self {
            AttrSet::Ints(s) => s.is_empty(),
            AttrSet::Bools(s) => s.is_empty(),
            AttrSet::Strings(s) | AttrSet::Versions(s) => s.is_empty(),
        }
    }
}

impl std::fmt::Display for AttrSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let items: Vec<String> = match self {
            AttrSet::Ints(s) => s.iter().map(ToString::to_string).collect(),
            AttrSet::Bools(s) => s.iter().map(ToString::to_string).collect(),
            AttrSet::Strings(s) | AttrSet::Versions(s) => s.iter().cloned().collect(),
        };
        if items.len() == 1 {
            write!(f, "{}", items[0])
        } else {
            write!(f, "[{}]", items.join(", "))
        }
    }
}

/// The state of one claim's constraints during the search.
#[derive(Debug)]
pub(crate) struct ConstraintState {
    spec: ConstraintSpec,
    /// Match: the running intersections, one per device added. Distinct: each device's set.
    stack: Vec<AttrSet>,
}

impl ConstraintState {
    pub fn new(spec: ConstraintSpec) -> ConstraintState {
        ConstraintState {
            spec,
            stack: Vec::new(),
        }
    }

    /// Tries to add a device allocated for `slot`; on success the device is recorded.
    pub fn add(&mut self, slot: &Slot, device: &DeviceEntry) -> bool {
        if !self.spec.applies_to(slot) {
            return true;
        }
        match self.next(device) {
            Some(next) => {
                self.stack.push(next);
                true
            }
            None => false,
        }
    }

    /// Whether [`Self::add`] would accept the device for `slot` now (without adding it).
    pub fn accepts(&self, slot: &Slot, device: &DeviceEntry) -> bool {
        !self.spec.applies_to(slot) || self.next(device).is_some()
    }

    /// What the stack gets if the device is added, or `None` when it breaks the constraint.
    fn next(&self, device: &DeviceEntry) -> Option<AttrSet> {
        let set = device
            .attribute(&self.spec.attribute)
            .and_then(AttrSet::of)?;
        match (self.spec.kind, self.stack.last()) {
            (_, None) => Some(set),
            (ConstraintKind::Match, Some(current)) => current.intersection(&set),
            (ConstraintKind::Distinct, Some(_)) => {
                (!self.stack.iter().any(|s| s.intersection(&set).is_some())).then_some(set)
            }
        }
    }

    /// The constraint.
    pub fn spec(&self) -> &ConstraintSpec {
        &self.spec
    }

    /// Whether some device was added already.
    pub fn started(&self) -> bool {
        !self.stack.is_empty()
    }

    /// Feeds the state (the devices' values so far) into a hasher.
    pub fn hash_state(&self, h: &mut impl std::hash::Hasher) {
        use std::hash::Hash;
        self.stack.len().hash(h);
        for set in &self.stack {
            set.hash(h);
        }
    }

    /// Removes the device most recently added for `slot`.
    pub fn remove(&mut self, slot: &Slot) {
        if self.spec.applies_to(slot) {
            self.stack.pop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> DeviceAttribute {
        DeviceAttribute {
            strings: Some(v.iter().map(|s| (*s).to_owned()).collect()),
            ..Default::default()
        }
    }

    #[test]
    fn sets_from_scalars_and_lists() {
        let int = DeviceAttribute {
            int: Some(3),
            ..Default::default()
        };
        assert_eq!(AttrSet::of(&int), Some(AttrSet::Ints([3].into())));
        assert_eq!(AttrSet::of(&DeviceAttribute::default()), None);
        let a = AttrSet::of(&strings(&["a", "b"])).unwrap();
        let b = AttrSet::of(&strings(&["b", "c"])).unwrap();
        assert_eq!(
            a.intersection(&b),
            Some(AttrSet::Strings(["b".to_owned()].into()))
        );
        assert_eq!(a.intersection(&AttrSet::Ints([1].into())), None);
        assert_eq!(a.to_string(), "[a, b]");
    }
}
