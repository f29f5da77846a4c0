//! Errors that stop an allocation outright — invalid input, a selector that cannot be evaluated,
//! an exhausted search budget — as opposed to claims that simply do not fit (see
//! [`crate::Unsatisfiable`]).

/// Allocation could not be decided.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocateError {
    /// A request names neither `exactly` nor `firstAvailable`.
    #[error(
        "claim {claim}, request {request}: has neither exactly nor firstAvailable (unsupported request type?)"
    )]
    UnsupportedRequest { claim: String, request: String },

    /// A request or subrequest has no device class.
    #[error(
        "claim {claim}, request {request}: missing device class name (unsupported request type?)"
    )]
    MissingClassName { claim: String, request: String },

    /// The DeviceClass a request names does not exist.
    #[error(
        "claim {claim}, request {request}: could not retrieve device class {class}: not found; create it or fix deviceClassName"
    )]
    UnknownClass {
        claim: String,
        request: String,
        class: String,
    },

    /// A request uses derived attributes (alpha in 1.37, off by default in the scheduler).
    #[error(
        "claim {claim}, request {request}: cannot handle a request with derived attributes (the DRADerivedAttributes feature is off in kube-scheduler); remove derivedAttributes"
    )]
    DerivedAttributes { claim: String, request: String },

    /// A selector has no `cel` field.
    #[error("{owner}, selector #{index}: CEL expression empty (unsupported selector type?)")]
    EmptySelector { owner: String, index: usize },

    /// A class or request selector does not compile.
    #[error("{owner}: selector #{index}: CEL compile error: {message}")]
    CelCompile {
        owner: String,
        index: usize,
        message: String,
    },

    /// A selector failed while evaluated on a device (not the same as "does not match").
    #[error(
        "{owner}: selector #{index} on device {device}: CEL runtime error: {message}; guard lookups with `in`, has() or optional syntax"
    )]
    CelRuntime {
        owner: String,
        index: usize,
        device: String,
        message: String,
    },

    /// An allocation mode this version does not know.
    #[error("claim {claim}, request {request}: unsupported count mode {mode}")]
    UnsupportedAllocationMode {
        claim: String,
        request: String,
        mode: String,
    },

    /// A count that is not positive.
    #[error("claim {claim}, request {request}: count {count} must be at least 1")]
    InvalidCount {
        claim: String,
        request: String,
        count: i64,
    },

    /// A constraint names neither `matchAttribute` nor `distinctAttribute`.
    #[error("claim {claim}, constraint #{index}: empty constraint (unsupported constraint type?)")]
    EmptyConstraint { claim: String, index: usize },

    /// A capacity request that is not a quantity.
    #[error("claim {claim}, request {request}: capacity request {capacity}: {message}")]
    InvalidCapacityRequest {
        claim: String,
        request: String,
        capacity: String,
        message: String,
    },

    /// A claim asks for more devices than an allocation result can hold.
    #[error(
        "claim {claim}: number of requested devices {count} exceeds the claim limit of {limit}"
    )]
    TooManyDevices {
        claim: String,
        count: usize,
        limit: usize,
    },

    /// `allocationMode: All` while a pool is being updated or invalid: "all" is not knowable.
    #[error(
        "claim {claim}, request {request}: asks for all devices, but resource pool {pool} is currently {why}"
    )]
    AllOnUnusablePool {
        claim: String,
        request: String,
        pool: String,
        why: &'static str,
    },

    /// `allocationMode: All` where a claim constraint rejects one of the devices.
    #[error(
        "claim {claim}, request {request}: cannot add device {device} because a claim constraint would not be satisfied"
    )]
    ConstraintRejectsAll {
        claim: String,
        request: String,
        device: String,
    },

    /// The search gave up before deciding; the claims are likely unsatisfiable on that node.
    #[error(
        "allocation of {claims} on node {node}: search stopped after {steps} steps (budget {budget}) without finding \
         a solution or proving there is none; the claims are likely unsatisfiable there — loosen constraints, \
         ask for fewer devices, or raise the step budget"
    )]
    SearchBudgetExhausted {
        claims: String,
        node: String,
        steps: u64,
        budget: u64,
    },

    /// A slice's node selector has several terms, which an allocation result cannot express.
    #[error("ResourceSlice {slice}: nodeSelector has {terms} terms; exactly one is supported")]
    UnsupportedNodeSelector { slice: String, terms: usize },

    /// The node asked for is not in the inventory.
    #[error(
        "node {node} is not known: it has no ResourceSlices and no Node object was given (known nodes: {known})"
    )]
    UnknownNode { node: String, known: String },
}

impl AllocateError {
    /// The error of selector `index` of `owner` on `device`: a compile error (found when the
    /// selector is first evaluated, as upstream compiles on first use) or a runtime error.
    pub(crate) fn selector(
        owner: String,
        index: usize,
        device: &crate::DeviceId,
        message: String,
        compile: bool,
    ) -> AllocateError {
        if compile {
            AllocateError::CelCompile {
                owner,
                index,
                message,
            }
        } else {
            AllocateError::CelRuntime {
                owner,
                index,
                device: device.to_string(),
                message,
            }
        }
    }
}
