//! The resource types the fake serves: their API group, version, plural, kind, scope, whether
//! they have a status subresource, and which field selectors the real API server accepts for them.

/// How a write through the API (not a test hook) treats the `status` of a new object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusOnCreate {
    /// Kept as sent (Nodes).
    Keep,
    /// Cleared, as the API server's create strategy does (ResourceClaims).
    Clear,
    /// Replaced by this JSON object (Pods start `Pending`, Namespaces `Active`).
    Initial(&'static str),
}

/// One resource type the fake serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResourceType {
    /// API group; empty for the core group.
    pub group: &'static str,
    /// API version, e.g. `v1`.
    pub version: &'static str,
    /// Lower-case plural used in URLs, e.g. `resourceslices`.
    pub plural: &'static str,
    /// Kind, e.g. `ResourceSlice`.
    pub kind: &'static str,
    /// Whether objects live in namespaces.
    pub namespaced: bool,
    /// Whether the type has a `status` subresource: writes to the main resource then keep the
    /// stored status, and writes to `/status` change only the status.
    pub status_subresource: bool,
    /// What a create through the API does to `status`.
    pub status_on_create: StatusOnCreate,
    /// Field selectors the real API server supports besides `metadata.name` and (namespaced)
    /// `metadata.namespace`; others are refused with 400 as upstream does.
    pub field_selectors: &'static [&'static str],
}

impl ResourceType {
    /// `group/version`, or just `version` for the core group: the objects' `apiVersion`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_owned()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `plural` or `plural.group`, the way the API server names resources in messages.
    pub fn qualified_plural(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_owned()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// Whether `field` may be used in a field selector on this type.
    pub fn supports_field_selector(&self, field: &str) -> bool {
        field == "metadata.name"
            || (self.namespaced && field == "metadata.namespace")
            || self.field_selectors.contains(&field)
    }
}

const CORE_EVENT_FIELDS: &[&str] = &[
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
];

/// The resource types Tessera's components use.
pub const BUILTIN_RESOURCES: &[ResourceType] = &[
    ResourceType {
        group: "",
        version: "v1",
        plural: "nodes",
        kind: "Node",
        namespaced: false,
        status_subresource: true,
        status_on_create: StatusOnCreate::Keep,
        field_selectors: &["spec.unschedulable"],
    },
    ResourceType {
        group: "",
        version: "v1",
        plural: "namespaces",
        kind: "Namespace",
        namespaced: false,
        status_subresource: true,
        status_on_create: StatusOnCreate::Initial(r#"{"phase":"Active"}"#),
        field_selectors: &["status.phase"],
    },
    ResourceType {
        group: "",
        version: "v1",
        plural: "pods",
        kind: "Pod",
        namespaced: true,
        status_subresource: true,
        status_on_create: StatusOnCreate::Initial(r#"{"phase":"Pending"}"#),
        field_selectors: &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ],
    },
    ResourceType {
        group: "",
        version: "v1",
        plural: "events",
        kind: "Event",
        namespaced: true,
        status_subresource: false,
        status_on_create: StatusOnCreate::Keep,
        field_selectors: CORE_EVENT_FIELDS,
    },
    ResourceType {
        group: "events.k8s.io",
        version: "v1",
        plural: "events",
        kind: "Event",
        namespaced: true,
        status_subresource: false,
        status_on_create: StatusOnCreate::Keep,
        field_selectors: &[
            "regarding.kind",
            "regarding.namespace",
            "regarding.name",
            "regarding.uid",
            "reason",
            "reportingController",
            "type",
        ],
    },
    ResourceType {
        group: "",
        version: "v1",
        plural: "secrets",
        kind: "Secret",
        namespaced: true,
        status_subresource: false,
        status_on_create: StatusOnCreate::Keep,
        field_selectors: &["type"],
    },
    ResourceType {
        group: "admissionregistration.k8s.io",
        version: "v1",
        plural: "mutatingwebhookconfigurations",
        kind: "MutatingWebhookConfiguration",
        namespaced: false,
        status_subresource: false,
        status_on_create: StatusOnCreate::Keep,
        field_selectors: &[],
    },
    ResourceType {
        group: "admissionregistration.k8s.io",
        version: "v1",
        plural: "validatingwebhookconfigurations",
        kind: "ValidatingWebhookConfiguration",
        namespaced: false,
        status_subresource: false,
        status_on_create: StatusOnCreate::Keep,
        field_selectors: &[],
    },
    ResourceType {
        group: "coordination.k8s.io",
        version: "v1",
        plural: "leases",
        kind: "Lease",
        namespaced: true,
        status_subresource: false,
        status_on_create: StatusOnCreate::Keep,
        field_selectors: &[],
    },
    ResourceType {
        group: "resource.k8s.io",
        version: "v1",
        plural: "resourceslices",
        kind: "ResourceSlice",
        namespaced: false,
        status_subresource: false,
        status_on_create: StatusOnCreate::Keep,
        field_selectors: &["spec.nodeName", "spec.driver"],
    },
    ResourceType {
        group: "resource.k8s.io",
        version: "v1",
        plural: "resourceclaims",
        kind: "ResourceClaim",
        namespaced: true,
        status_subresource: true,
        status_on_create: StatusOnCreate::Clear,
        field_selectors: &[],
    },
    ResourceType {
        group: "resource.k8s.io",
        version: "v1",
        plural: "resourceclaimtemplates",
        kind: "ResourceClaimTemplate",
        namespaced: true,
        status_subresource: false,
        status_on_create: StatusOnCreate::Keep,
        field_selectors: &[],
    },
    ResourceType {
        group: "resource.k8s.io",
        version: "v1",
        plural: "deviceclasses",
        kind: "DeviceClass",
        namespaced: false,
        status_subresource: false,
        status_on_create: StatusOnCreate::Keep,
        field_selectors: &[],
    },
    ResourceType {
        group: "policy",
        version: "v1",
        plural: "poddisruptionbudgets",
        kind: "PodDisruptionBudget",
        namespaced: true,
        status_subresource: true,
        status_on_create: StatusOnCreate::Keep,
        field_selectors: &[],
    },
];

/// Finds a served resource type by group, version and plural.
pub fn by_plural(group: &str, version: &str, plural: &str) -> Option<&'static ResourceType> {
    BUILTIN_RESOURCES
        .iter()
        .find(|r| r.group == group && r.version == version && r.plural == plural)
}

/// Finds a served resource type by `apiVersion` and `kind`.
pub fn by_kind(api_version: &str, kind: &str) -> Option<&'static ResourceType> {
    BUILTIN_RESOURCES
        .iter()
        .find(|r| r.api_version() == api_version && r.kind == kind)
}

/// Finds a served resource type by plural alone (`resourceclaims`) or `plural.group`
/// (`events.events.k8s.io`); a bare plural served by two groups resolves to the core group.
pub fn by_name(name: &str) -> Option<&'static ResourceType> {
    BUILTIN_RESOURCES
        .iter()
        .find(|r| r.qualified_plural() == name)
        .or_else(|| BUILTIN_RESOURCES.iter().find(|r| r.plural == name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups_agree() {
        for resource in BUILTIN_RESOURCES {
            assert_eq!(
                by_plural(resource.group, resource.version, resource.plural),
                Some(resource)
            );
            assert_eq!(
                by_kind(&resource.api_version(), resource.kind),
                Some(resource)
            );
            assert_eq!(by_name(&resource.qualified_plural()), Some(resource));
        }
        assert_eq!(by_name("events").map(|r| r.group), Some(""));
        assert_eq!(
            by_name("events.events.k8s.io").map(|r| r.group),
            Some("events.k8s.io")
        );
        assert!(by_name("configmaps").is_none());
    }

    #[test]
    fn field_selector_support_follows_upstream() {
        let slices = by_name("resourceslices").unwrap();
        assert!(slices.supports_field_selector("spec.nodeName"));
        assert!(slices.supports_field_selector("metadata.name"));
        assert!(!slices.supports_field_selector("metadata.namespace"));
        assert!(!slices.supports_field_selector("spec.pool.name"));
    }
}
