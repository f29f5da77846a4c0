//! The CEL values this crate adds to the interpreter: quantities, semantic versions, and the
//! attribute/capacity maps of a device, where an unknown domain is an empty map.

use std::any::Any;
use std::cmp::Ordering;
use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

use cel::ExecutionError;
use cel::common::traits::{self, Container, Indexer, Iterable, Sizer};
use cel::common::types::{CelInt, CelMap, MAP_TYPE, Type};
use cel::common::value::{CowVal, StaticVal, Val};

use crate::quantity::Quantity;
use crate::version::Version;

/// CEL type of quantities, named as upstream names it.
pub(crate) static QUANTITY_TYPE: Type = Type::new_unspecified_type("kubernetes.Quantity");
/// CEL type of semantic versions, named as upstream names it.
pub(crate) static SEMVER_TYPE: Type = Type::new_unspecified_type("kubernetes.Semver");

impl Val for Quantity {
    fn get_type(&self) -> &Type {
        &QUANTITY_TYPE
    }

    fn cel_type() -> &'static Type {
        &QUANTITY_TYPE
    }

    fn equals(&self, other: &dyn Val) -> bool {
        other.downcast_ref::<Quantity>() == Some(self)
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

impl StaticVal for Quantity {}

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

static EMPTY_MAP: LazyLock<CelMap<'static>> = LazyLock::new(|| CelMap::from(HashMap::new()));

/// `device.attributes` and `device.capacity`: domain → (identifier → value). Looking up a domain
/// the device does not have yields an empty map, as upstream's `mapper` does, so
/// `device.attributes["other.vendor"].x` fails with `no such key: x` rather than on the domain.
#[derive(Debug, Clone)]
pub(crate) struct DomainMap {
    domains: Arc<CelMap<'static>>,
}

impl DomainMap {
    pub(crate) fn new(domains: CelMap<'static>) -> DomainMap {
        DomainMap {
            domains: Arc::new(domains),
        }
    }
}

impl Val for DomainMap {
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

    fn equals(&self, other: &dyn Val) -> bool {
        match other.as_any().and_then(|o| o.downcast_ref::<DomainMap>()) {
            Some(other) => self.domains.equals(other.domains.as_ref()),
            None => self.domains.equals(other),
        }
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

impl Container for DomainMap {
    fn contains(&self, key: &dyn Val) -> Result<bool, ExecutionError> {
        self.domains.contains(key)
    }
}

impl Indexer for DomainMap {
    fn get<'b, 'v>(&'b self, key: &dyn Val) -> Result<CowVal<'b, 'v>, ExecutionError>
    where
        Self: 'v,
    {
        match self.domains.get(key) {
            Err(ExecutionError::NoSuchKey(_)) => Ok(CowVal::Borrowed(&*EMPTY_MAP)),
            found => found,
        }
    }

    fn steal<'v>(self: Box<Self>, key: &dyn Val) -> Result<Box<dyn Val + 'v>, ExecutionError>
    where
        Self: 'v,
    {
        self.get(key).map(CowVal::into_owned)
    }
}

impl Iterable for DomainMap {
    fn iter<'b, 'v>(&'b self) -> Box<dyn traits::Iterator<'b, 'v> + 'b>
    where
        Self: 'v,
    {
        self.domains.iter()
    }
}

impl Sizer for DomainMap {
    fn size(&self) -> CelInt {
        self.domains.size()
    }
}
