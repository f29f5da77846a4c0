//! Static types of the checker and the declared signatures of every function the environment has.

use std::fmt;

/// A static CEL type. `Dyn` is "not known before evaluation" and matches everything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ty {
    Dyn,
    Bool,
    Int,
    Uint,
    Double,
    String,
    Bytes,
    Null,
    Timestamp,
    Duration,
    Type,
    Quantity,
    Semver,
    List(Box<Ty>),
    Map(Box<Ty>, Box<Ty>),
    Optional(Box<Ty>),
    /// The `device` variable's object type.
    Device,
}

impl Ty {
    pub(crate) fn list(element: Ty) -> Ty {
        Ty::List(Box::new(element))
    }

    pub(crate) fn map(key: Ty, value: Ty) -> Ty {
        Ty::Map(Box::new(key), Box::new(value))
    }

    pub(crate) fn optional(inner: Ty) -> Ty {
        Ty::Optional(Box::new(inner))
    }

    /// `a` and `b` as one type: equal types stay, anything else is `Dyn`.
    pub(crate) fn join(a: &Ty, b: &Ty) -> Ty {
        if a == b { a.clone() } else { Ty::Dyn }
    }

    pub(crate) fn is_dyn(&self) -> bool {
        matches!(self, Ty::Dyn)
    }

    pub(crate) fn is_numeric(&self) -> bool {
        matches!(self, Ty::Int | Ty::Uint | Ty::Double)
    }
}

impl fmt::Display for Ty {
    /// The names cel-go prints.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ty::Dyn => f.write_str("dyn"),
            Ty::Bool => f.write_str("bool"),
            Ty::Int => f.write_str("int"),
            Ty::Uint => f.write_str("uint"),
            Ty::Double => f.write_str("double"),
            Ty::String => f.write_str("string"),
            Ty::Bytes => f.write_str("bytes"),
            Ty::Null => f.write_str("null_type"),
            Ty::Timestamp => f.write_str("google.protobuf.Timestamp"),
            Ty::Duration => f.write_str("google.protobuf.Duration"),
            Ty::Type => f.write_str("type"),
            Ty::Quantity => f.write_str("kubernetes.Quantity"),
            Ty::Semver => f.write_str("kubernetes.Semver"),
            Ty::List(e) => write!(f, "list({e})"),
            Ty::Map(k, v) => write!(f, "map({k}, {v})"),
            Ty::Optional(t) => write!(f, "optional_type({t})"),
            Ty::Device => f.write_str("kubernetes.DRADevice"),
        }
    }
}

/// A parameter type of a declared overload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum P {
    Any,
    Bool,
    Int,
    Uint,
    Double,
    String,
    Bytes,
    Timestamp,
    Duration,
    Quantity,
    Semver,
    List,
    Map,
    Optional,
}

impl P {
    pub(crate) fn accepts(self, ty: &Ty) -> bool {
        matches!(
            (self, ty),
            (P::Any, _)
                | (_, Ty::Dyn)
                | (P::Bool, Ty::Bool)
                | (P::Int, Ty::Int)
                | (P::Uint, Ty::Uint)
                | (P::Double, Ty::Double)
                | (P::String, Ty::String)
                | (P::Bytes, Ty::Bytes)
                | (P::Timestamp, Ty::Timestamp)
                | (P::Duration, Ty::Duration)
                | (P::Quantity, Ty::Quantity)
                | (P::Semver, Ty::Semver)
                | (P::List, Ty::List(_))
                | (P::Map, Ty::Map(..))
                | (P::Optional, Ty::Optional(_))
        )
    }
}

/// The result type of a declared overload, possibly computed from the argument types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum R {
    Bool,
    Int,
    Uint,
    Double,
    String,
    Bytes,
    Timestamp,
    Duration,
    Type,
    Quantity,
    Semver,
    Dyn,
    ListOfString,
    /// The element type of the list receiver (`min`, `max`, `sum`).
    ElementOfReceiver,
    /// `optional_type(T)` of the first argument's type `T`.
    OptionalOfFirst,
    OptionalDyn,
    /// `T` of an `optional_type(T)` receiver.
    InnerOfReceiver,
    Receiver,
    /// The iteration domain of the first argument: indexes of a list, keys of a map.
    KeysOfFirst,
}

impl R {
    pub(crate) fn resolve(self, receiver: Option<&Ty>, args: &[Ty]) -> Ty {
        match self {
            R::Bool => Ty::Bool,
            R::Int => Ty::Int,
            R::Uint => Ty::Uint,
            R::Double => Ty::Double,
            R::String => Ty::String,
            R::Bytes => Ty::Bytes,
            R::Timestamp => Ty::Timestamp,
            R::Duration => Ty::Duration,
            R::Type => Ty::Type,
            R::Quantity => Ty::Quantity,
            R::Semver => Ty::Semver,
            R::Dyn => Ty::Dyn,
            R::ListOfString => Ty::list(Ty::String),
            R::ElementOfReceiver => match receiver {
                Some(Ty::List(e)) => (**e).clone(),
                _ => Ty::Dyn,
            },
            R::OptionalOfFirst => Ty::optional(args.first().cloned().unwrap_or(Ty::Dyn)),
            R::OptionalDyn => Ty::optional(Ty::Dyn),
            R::InnerOfReceiver => match receiver {
                Some(Ty::Optional(t)) => (**t).clone(),
                _ => Ty::Dyn,
            },
            R::Receiver => receiver.cloned().unwrap_or(Ty::Dyn),
            R::KeysOfFirst => match args.first() {
                Some(Ty::List(_)) => Ty::list(Ty::Int),
                Some(Ty::Map(k, _)) => Ty::List(k.clone()),
                _ => Ty::list(Ty::Dyn),
            },
        }
    }
}

/// One overload: a receiver type for member functions, the parameter types, the result.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sig {
    pub receiver: Option<P>,
    pub params: &'static [P],
    pub result: R,
}

const fn g(params: &'static [P], result: R) -> Sig {
    Sig {
        receiver: None,
        params,
        result,
    }
}

const fn m(receiver: P, params: &'static [P], result: R) -> Sig {
    Sig {
        receiver: Some(receiver),
        params,
        result,
    }
}

/// A `'static` table of signatures (const fn calls are not promoted to statics by themselves).
macro_rules! table {
    ($sigs:expr) => {{
        const SIGS: &[Sig] = $sigs;
        SIGS
    }};
}

/// The overloads of `name`, global and member, or `None` if the environment has no such
/// function. Operators are checked separately.
pub(crate) fn signatures(name: &str) -> Option<&'static [Sig]> {
    standard_signatures(name)
        .or_else(|| time_and_optional_signatures(name))
        .or_else(|| quantity_and_semver_signatures(name))
        .or_else(|| string_list_and_internal_signatures(name))
}

/// CEL's standard functions: sizes, conversions, `dyn` and `type`.
fn standard_signatures(name: &str) -> Option<&'static [Sig]> {
    use P::{Any, Bool, Bytes, Double, Duration, Int, List, Map, String, Timestamp, Uint};
    Some(match name {
        "size" => table!(&[
            g(&[String], R::Int),
            g(&[Bytes], R::Int),
            g(&[List], R::Int),
            g(&[Map], R::Int),
            m(String, &[], R::Int),
            m(Bytes, &[], R::Int),
            m(List, &[], R::Int),
            m(Map, &[], R::Int),
        ]),
        "contains" | "startsWith" | "endsWith" => table!(&[m(String, &[String], R::Bool)]),
        "matches" => table!(&[g(&[String, String], R::Bool), m(String, &[String], R::Bool)]),
        "int" => table!(&[
            g(&[Int], R::Int),
            g(&[Uint], R::Int),
            g(&[Double], R::Int),
            g(&[String], R::Int),
            g(&[Timestamp], R::Int),
        ]),
        "uint" => table!(&[
            g(&[Int], R::Uint),
            g(&[Uint], R::Uint),
            g(&[Double], R::Uint),
            g(&[String], R::Uint)
        ]),
        "double" => table!(&[
            g(&[Int], R::Double),
            g(&[Uint], R::Double),
            g(&[Double], R::Double),
            g(&[String], R::Double),
        ]),
        "string" => table!(&[
            g(&[Int], R::String),
            g(&[Uint], R::String),
            g(&[Double], R::String),
            g(&[Bool], R::String),
            g(&[String], R::String),
            g(&[Bytes], R::String),
            g(&[Timestamp], R::String),
            g(&[Duration], R::String),
        ]),
        "bytes" => table!(&[g(&[String], R::Bytes), g(&[Bytes], R::Bytes)]),
        "bool" => table!(&[g(&[Bool], R::Bool), g(&[String], R::Bool)]),
        "dyn" => table!(&[g(&[Any], R::Dyn)]),
        "type" => table!(&[g(&[Any], R::Type)]),
        "duration" => table!(&[g(&[String], R::Duration), g(&[Duration], R::Duration)]),
        "timestamp" => table!(&[
            g(&[String], R::Timestamp),
            g(&[Int], R::Timestamp),
            g(&[Timestamp], R::Timestamp)
        ]),
        _ => return None,
    })
}

/// Timestamp and duration accessors, and the optional library.
fn time_and_optional_signatures(name: &str) -> Option<&'static [Sig]> {
    use P::{Any, Duration, Optional, String, Timestamp};
    Some(match name {
        "getFullYear" | "getMonth" | "getDate" | "getDayOfMonth" | "getDayOfWeek"
        | "getDayOfYear" => {
            table!(&[m(Timestamp, &[], R::Int), m(Timestamp, &[String], R::Int)])
        }
        "getHours" | "getMinutes" | "getSeconds" | "getMilliseconds" => table!(&[
            m(Timestamp, &[], R::Int),
            m(Timestamp, &[String], R::Int),
            m(Duration, &[], R::Int),
        ]),
        "optional.of" | "optional.ofNonZeroValue" => table!(&[g(&[Any], R::OptionalOfFirst)]),
        "optional.none" => table!(&[g(&[], R::OptionalDyn)]),
        "hasValue" => table!(&[m(Optional, &[], R::Bool)]),
        "value" => table!(&[m(Optional, &[], R::InnerOfReceiver)]),
        "or" => table!(&[m(Optional, &[Optional], R::Receiver)]),
        "orValue" => table!(&[m(Optional, &[Any], R::InnerOfReceiver)]),
        _ => return None,
    })
}

/// Kubernetes' quantity and semver libraries.
fn quantity_and_semver_signatures(name: &str) -> Option<&'static [Sig]> {
    use P::{Bool, Int, Quantity, Semver, String};
    Some(match name {
        "quantity" => table!(&[g(&[String], R::Quantity)]),
        "isQuantity" => table!(&[g(&[String], R::Bool)]),
        "sign" | "asInteger" => table!(&[m(Quantity, &[], R::Int)]),
        "isInteger" => table!(&[m(Quantity, &[], R::Bool)]),
        "asApproximateFloat" => table!(&[m(Quantity, &[], R::Double)]),
        "add" | "sub" => table!(&[
            m(Quantity, &[Quantity], R::Quantity),
            m(Quantity, &[Int], R::Quantity)
        ]),
        "isGreaterThan" | "isLessThan" => table!(&[
            m(Quantity, &[Quantity], R::Bool),
            m(Semver, &[Semver], R::Bool)
        ]),
        "compareTo" => table!(&[
            m(Quantity, &[Quantity], R::Int),
            m(Semver, &[Semver], R::Int)
        ]),
        "semver" => table!(&[g(&[String], R::Semver), g(&[String, Bool], R::Semver)]),
        "isSemver" => table!(&[g(&[String], R::Bool), g(&[String, Bool], R::Bool)]),
        "major" | "minor" | "patch" => table!(&[m(Semver, &[], R::Int)]),
        _ => return None,
    })
}

/// The strings, lists and sets extension libraries, and the macros' internal functions.
fn string_list_and_internal_signatures(name: &str) -> Option<&'static [Sig]> {
    use P::{Any, Int, List, Map, String};
    Some(match name {
        "charAt" => table!(&[m(String, &[Int], R::String)]),
        "indexOf" | "lastIndexOf" => table!(&[
            m(String, &[String], R::Int),
            m(String, &[String, Int], R::Int),
            m(List, &[Any], R::Int),
        ]),
        "lowerAscii" | "upperAscii" | "trim" => table!(&[m(String, &[], R::String)]),
        "replace" => table!(&[
            m(String, &[String, String], R::String),
            m(String, &[String, String, Int], R::String)
        ]),
        "split" => table!(&[
            m(String, &[String], R::ListOfString),
            m(String, &[String, Int], R::ListOfString)
        ]),
        "substring" => table!(&[
            m(String, &[Int], R::String),
            m(String, &[Int, Int], R::String)
        ]),
        "join" => table!(&[m(List, &[], R::String), m(List, &[String], R::String)]),
        "strings.quote" => table!(&[g(&[String], R::String)]),
        "format" => table!(&[m(String, &[List], R::String)]),
        "find" => table!(&[m(String, &[String], R::String)]),
        "findAll" => table!(&[
            m(String, &[String], R::ListOfString),
            m(String, &[String, Int], R::ListOfString)
        ]),
        "isSorted" => table!(&[m(List, &[], R::Bool)]),
        "sum" | "min" | "max" => table!(&[m(List, &[], R::ElementOfReceiver)]),
        "sets.contains" | "sets.equivalent" | "sets.intersects" => {
            table!(&[g(&[List, List], R::Bool)])
        }
        "includes" => table!(&[m(Any, &[Any], R::Bool)]),
        "@iterkeys" => table!(&[g(&[Any], R::KeysOfFirst)]),
        "@mapInsert" => table!(&[g(&[Map, Any, Any], R::Dyn), g(&[Map, Any], R::Dyn)]),
        "@not_strictly_false" => table!(&[g(&[Any], R::Bool)]),
        _ => return None,
    })
}

/// Which argument of a call to `name` is a regular expression (counting the receiver of a member
/// call as argument 0), checked at compile time when it is a literal (upstream's
/// `ValidateRegexLiterals`).
pub(crate) fn regex_argument(name: &str) -> Option<usize> {
    matches!(name, "matches" | "find" | "findAll").then_some(1)
}
