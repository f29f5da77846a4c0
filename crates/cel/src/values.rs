//! The CEL values this crate adds to the interpreter: quantities, semantic versions, and the
//! maps of a device (sorted, with an empty map for an unknown domain).

use std::any::Any;
use std::cmp::Ordering;
use std::sync::{Arc, LazyLock};

use cel::ExecutionError;
use cel::common::traits::{self, Container, Indexer, Iterable, Sizer, Zeroer};
use cel::common::types::{CelInt, CelString, Kind, MAP_TYPE, Type};
use cel::common::value::{CowVal, StaticVal, Val};

use crate::quantity::QuantityValue;
use crate::version::Version;

/// CEL type of quantities, named as upstream names it.
pub(crate) static QUANTITY_TYPE: Type = Type::new_unspecified_type("kubernetes.Quantity");
/// CEL type of semantic versions, named as upstream names it.
pub(crate) static SEMVER_TYPE: Type = Type::new_unspecified_type("kubernetes.Semver");

impl Val for QuantityValue {
    fn get_type(&self) -> &Type {
        &QUANTITY_TYPE
    }

    fn cel_type() -> &'static Type {
        &QUANTITY_TYPE
    }

    fn equals(&self, other: &dyn Val) -> bool {
        other.downcast_ref::<QuantityValue>() == Some(self)
    }

    fn clone_as_boxed<'v>(&self) -> Box<dyn Val + 'v>
    where
        Self: 'v,
    {
        Box::new(*self)
    }

    fn as_any(&self) -> Option<&dyn Any> {
        Some(self)
    }
}

impl StaticVal for QuantityValue {}

impl Val for Version {
    fn get_type(&self) -> &Type {
        &SEMVER_TYPE
    }

    fn cel_type() -> &'static Type {
        &SEMVER_TYPE
    }

    fn equals(&self, other: &dyn Val) -> bool {
        other
            .downcast_ref::<Version>()
            .is_some_and(|other| other.cmp(self) == Ordering::Equal)
    }

    fn clone_as_boxed<'v>(&self) -> Box<dyn Val + 'v>
    where
        Self: 'v,
    {
        Box::new(self.clone())
    }

    fn as_any(&self) -> Option<&dyn Any> {
        Some(self)
    }
}

impl StaticVal for Version {}

/// How a [`SortedMap`] hands out a value as a CEL value.
pub(crate) trait MapValue: std::fmt::Debug + Send + Sync + 'static {
    fn as_val(&self) -> &(dyn Val + 'static);
}

impl MapValue for Box<dyn Val> {
    fn as_val(&self) -> &(dyn Val + 'static) {
        self.as_ref()
    }
}

/// A map with a few string keys, as a device's maps are (at most 32 entries): sorted, looked up by
/// binary search, which is several times faster than hashing the key. `missing` is what a lookup
/// of an absent key yields: an error, or (for the domain maps) a default value.
#[derive(Debug)]
pub(crate) struct SortedMap<V: MapValue> {
    entries: Arc<[(CelString<'static>, V)]>,
    missing: Option<&'static V>,
}

impl<V: MapValue> Clone for SortedMap<V> {
    fn clone(&self) -> Self {
        SortedMap {
            entries: Arc::clone(&self.entries),
            missing: self.missing,
        }
    }
}

/// Identifier → value: the attributes or capacities of one domain, or the `device` object.
pub(crate) type IdMap = SortedMap<Box<dyn Val>>;
/// Domain → identifiers: `device.attributes` and `device.capacity`. An unknown domain is an empty
/// map, as upstream's `mapper` makes it, so `device.attributes["other.vendor"].x` fails with
/// `no such key: x` rather than on the domain.
pub(crate) type DomainMap = SortedMap<IdMap>;

impl MapValue for IdMap {
    fn as_val(&self) -> &(dyn Val + 'static) {
        self
    }
}

static EMPTY_ID_MAP: LazyLock<IdMap> = LazyLock::new(|| IdMap::new(Vec::new()));

impl IdMap {
    pub(crate) fn new(entries: Vec<(String, Box<dyn Val>)>) -> IdMap {
        SortedMap::sorted(entries, None)
    }
}

impl DomainMap {
    pub(crate) fn new(entries: Vec<(String, IdMap)>) -> DomainMap {
        SortedMap::sorted(entries, Some(&*EMPTY_ID_MAP))
    }

    /// The identifiers of the domain `matches` accepts (empty if the device has none there).
    pub(crate) fn domain_by(&self, matches: impl Fn(&str) -> bool) -> &IdMap {
        self.entries
            .iter()
            .find(|(domain, _)| matches(domain.inner()))
            .map_or(&EMPTY_ID_MAP, |(_, ids)| ids)
    }
}

impl<V: MapValue> SortedMap<V> {
    fn sorted(mut entries: Vec<(String, V)>, missing: Option<&'static V>) -> Self {
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        entries.dedup_by(|later, earlier| later.0 == earlier.0);
        SortedMap {
            entries: entries
                .into_iter()
                .map(|(k, v)| (CelString::from(k), v))
                .collect(),
            missing,
        }
    }

    pub(crate) fn find(&self, key: &str) -> Option<&V> {
        self.entries
            .binary_search_by(|(k, _)| k.inner().cmp(key))
            .ok()
            .map(|i| &self.entries[i].1)
    }

    fn lookup(&self, key: &dyn Val) -> Result<&V, ExecutionError> {
        let found = key
            .downcast_ref::<CelString<'_>>()
            .and_then(|k| self.find(k.inner()))
            .or(self.missing);
        found.ok_or_else(|| match key.downcast_ref::<CelString<'_>>() {
            Some(k) => ExecutionError::no_such_key(k.inner()),
            None => ExecutionError::no_such_key(&format!("{key:?}")),
        })
    }
}

impl<V: MapValue> Val for SortedMap<V> {
    fn get_type(&self) -> &Type {
        &MAP_TYPE
    }

    fn cel_type() -> &'static Type {
        &MAP_TYPE
    }

    fn as_container(&self) -> Option<&dyn Container> {
        Some(self)
    }

    fn as_indexer<'b, 'v>(&'b self) -> Option<&'b (dyn Indexer + 'v)>
    where
        Self: 'v,
    {
        Some(self)
    }

    fn as_iterable<'b, 'v>(&'b self) -> Option<&'b (dyn Iterable + 'v)>
    where
        Self: 'v,
    {
        Some(self)
    }

    fn as_sizer(&self) -> Option<&dyn Sizer> {
        Some(self)
    }

    fn as_zeroer(&self) -> Option<&dyn Zeroer> {
        Some(self)
    }

    /// Equal to a map with the same keys and equal values.
    fn equals(&self, other: &dyn Val) -> bool {
        let (Some(size), Some(indexer)) = (other.as_sizer(), other.as_indexer()) else {
            return false;
        };
        other.get_type().kind() == Kind::Map
            && *size.size().inner() == self.entries.len() as i64
            && self.entries.iter().all(|(k, v)| {
                indexer
                    .get(k)
                    .is_ok_and(|theirs| v.as_val().equals(theirs.as_ref()))
            })
    }

    fn clone_as_boxed<'v>(&self) -> Box<dyn Val + 'v>
    where
        Self: 'v,
    {
        Box::new(self.clone())
    }

    fn as_any(&self) -> Option<&dyn Any> {
        Some(self)
    }
}

impl<V: MapValue> StaticVal for SortedMap<V> {}

impl<V: MapValue> Container for SortedMap<V> {
    fn contains(&self, key: &dyn Val) -> Result<bool, ExecutionError> {
        Ok(key
            .downcast_ref::<CelString<'_>>()
            .is_some_and(|k| self.find(k.inner()).is_some()))
    }
}

impl<V: MapValue> Indexer for SortedMap<V> {
    fn get<'b, 'v>(&'b self, key: &dyn Val) -> Result<CowVal<'b, 'v>, ExecutionError>
    where
        Self: 'v,
    {
        self.lookup(key).map(|v| CowVal::Borrowed(v.as_val()))
    }

    fn steal<'v>(self: Box<Self>, key: &dyn Val) -> Result<Box<dyn Val + 'v>, ExecutionError>
    where
        Self: 'v,
    {
        self.lookup(key).map(|v| v.as_val().clone_as_boxed())
    }
}

/// The keys of a [`SortedMap`], as iterating a map yields them.
struct Keys<'b, V>(std::slice::Iter<'b, (CelString<'static>, V)>);

impl<'b, 'v, V> traits::Iterator<'b, 'v> for Keys<'b, V> {
    fn next(&mut self) -> Option<&'b (dyn Val + 'v)> {
        self.0.next().map(|(k, _)| k as &dyn Val)
    }
}

impl<V: MapValue> Iterable for SortedMap<V> {
    fn iter<'b, 'v>(&'b self) -> Box<dyn traits::Iterator<'b, 'v> + 'b>
    where
        Self: 'v,
    {
        Box::new(Keys(self.entries.iter()))
    }
}

impl<V: MapValue> Sizer for SortedMap<V> {
    fn size(&self) -> CelInt {
        (self.entries.len() as i64).into()
    }
}

impl<V: MapValue> Zeroer for SortedMap<V> {
    fn is_zero_value(&self) -> bool {
        self.entries.is_empty()
    }
}
