//! NVIDIA ComputeDomains (`resource.nvidia.com/v1beta1`, kind `ComputeDomain`) rewritten as
//! Tessera IMEX domains (docs/user-guide.md, "Jobs across NVLink racks (IMEX)").
//!
//! NVIDIA's controller makes, for a ComputeDomain, the ResourceClaimTemplate named by
//! `spec.channel.resourceClaimTemplate.name`, and each pod of the job gets a claim from it; the
//! daemons follow the ComputeDomain. In Tessera the domain is one ResourceClaim of class
//! `imex.gpu.tessera.dev` that every pod of the job shares, so:
//! - the ComputeDomain becomes a ResourceClaim named like the template, in its namespace;
//! - pods (and workloads' pod templates) naming that template by `resourceClaimTemplateName`
//!   name the claim by `resourceClaimName` instead.
//!
//! Pure: objects in, objects and notes out; [`channel_templates`] is a first pass over every
//! input, since the pods may sit in other files than their ComputeDomain.

use std::collections::BTreeSet;

use serde_yaml::{Mapping, Value};
use tessera_api::imex::IMEX_DEVICE_CLASS;

use super::Notes;
use super::pods::template_path;

/// A ComputeDomain's channel template: (namespace, name).
pub type ChannelTemplate = (String, String);

fn str_at<'a>(value: &'a Value, path: &[&str]) -> Option<&'a str> {
    path.iter()
        .try_fold(value, |v, key| v.get(*key))
        .and_then(Value::as_str)
}

/// Whether `object` is an NVIDIA ComputeDomain.
pub fn is_compute_domain(object: &Value) -> bool {
    let group = str_at(object, &["apiVersion"])
        .and_then(|v| v.rsplit_once('/'))
        .map(|(g, _)| g);
    group == Some("resource.nvidia.com") && str_at(object, &["kind"]) == Some("ComputeDomain")
}

fn namespace_of(object: &Value) -> String {
    str_at(object, &["metadata", "namespace"])
        .unwrap_or("default")
        .to_owned()
}

/// The channel templates the ComputeDomains among `objects` name.
pub fn channel_templates<'a>(
    objects: impl IntoIterator<Item = &'a Value>,
) -> BTreeSet<ChannelTemplate> {
    objects
        .into_iter()
        .filter(|o| is_compute_domain(o))
        .filter_map(|o| {
            let name = str_at(o, &["spec", "channel", "resourceClaimTemplate", "name"])?;
            Some((namespace_of(o), name.to_owned()))
        })
        .collect()
}

/// The ResourceClaim that is a ComputeDomain's IMEX domain, or `None` (with a note) when it
/// names no channel template.
pub fn migrate_compute_domain(object: &Value, notes: &mut Notes) -> Option<Value> {
    let Some(template) = str_at(
        object,
        &["spec", "channel", "resourceClaimTemplate", "name"],
    ) else {
        notes.not_carried(
            "spec.channel.resourceClaimTemplate.name",
            "the ComputeDomain names no channel template, so no pod can join it; dropped"
                .to_owned(),
        );
        return None;
    };
    let namespace = namespace_of(object);
    let claim: Value = serde_yaml::from_str(&format!(
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {{namespace: {namespace}, name: {template}}}\n\
         spec:\n  devices:\n    requests:\n    - name: channel\n      exactly: {{deviceClassName: {IMEX_DEVICE_CLASS}}}\n"
    ))
    .ok()?;
    notes.change(
        "",
        format!(
            "ComputeDomain → ResourceClaim {namespace}/{template} of class {IMEX_DEVICE_CLASS}, shared by the job's pods (the claim is the IMEX domain)"
        ),
    );
    if let Some(nodes) = object.get("spec").and_then(|s| s.get("numNodes")) {
        notes.not_carried(
            "spec.numNodes",
            format!(
                "{} node(s): a Tessera domain spans the nodes its pods run on, however many; to keep them together, give the pods a gang (docs/user-guide.md)",
                serde_yaml::to_string(nodes).unwrap_or_default().trim()
            ),
        );
    }
    if str_at(object, &["spec", "channel", "allocationMode"]) == Some("All") {
        notes.not_carried(
            "spec.channel.allocationMode",
            "`All` (every channel to every pod) is not offered: each domain gets one channel"
                .to_owned(),
        );
    }
    Some(claim)
}

/// Rewrites the pod (template) of `object`: a claim from a ComputeDomain's channel template
/// becomes the domain's shared claim.
pub fn rewrite_pod_references(
    object: &mut Value,
    templates: &BTreeSet<ChannelTemplate>,
    notes: &mut Notes,
) {
    let Some(path) = template_path(str_at(object, &["kind"]).unwrap_or_default()) else {
        return;
    };
    let namespace = namespace_of(object);
    let mut pod = &mut *object;
    for key in path {
        match pod.get_mut(*key) {
            Some(next) => pod = next,
            None => return,
        }
    }
    let where_ = path
        .iter()
        .chain(&["spec", "resourceClaims"])
        .copied()
        .collect::<Vec<_>>()
        .join(".");
    let Some(claims) = pod
        .get_mut("spec")
        .and_then(|s| s.get_mut("resourceClaims"))
        .and_then(Value::as_sequence_mut)
    else {
        return;
    };
    for (index, entry) in claims.iter_mut().enumerate() {
        let Some(mapping) = entry.as_mapping_mut() else {
            continue;
        };
        rewrite_entry(
            mapping,
            &namespace,
            templates,
            &format!("{where_}[{index}]"),
            notes,
        );
    }
}

fn rewrite_entry(
    entry: &mut Mapping,
    namespace: &str,
    templates: &BTreeSet<ChannelTemplate>,
    at: &str,
    notes: &mut Notes,
) {
    let key = Value::from("resourceClaimTemplateName");
    let Some(template) = entry.get(&key).and_then(Value::as_str).map(str::to_owned) else {
        return;
    };
    if !templates.contains(&(namespace.to_owned(), template.clone())) {
        return;
    }
    entry.remove(&key);
    entry.insert(
        Value::from("resourceClaimName"),
        Value::from(template.clone()),
    );
    notes.change(
        at,
        format!("resourceClaimTemplateName {template} → resourceClaimName {template} (the ComputeDomain's shared claim)"),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOMAIN: &str = r#"
apiVersion: resource.nvidia.com/v1beta1
kind: ComputeDomain
metadata: {name: imex-job, namespace: ml}
spec:
  numNodes: 4
  channel:
    resourceClaimTemplate: {name: imex-job-channel}
"#;

    #[test]
    fn a_compute_domain_becomes_one_shared_claim_and_says_what_it_drops() {
        let domain: Value = serde_yaml::from_str(DOMAIN).unwrap();
        assert!(is_compute_domain(&domain));
        let templates = channel_templates([&domain]);
        assert_eq!(
            templates,
            BTreeSet::from([("ml".to_owned(), "imex-job-channel".to_owned())])
        );
        let mut notes = Notes::default();
        let claim = migrate_compute_domain(&domain, &mut notes).unwrap();
        assert_eq!(str_at(&claim, &["kind"]), Some("ResourceClaim"));
        assert_eq!(
            str_at(&claim, &["metadata", "name"]),
            Some("imex-job-channel")
        );
        assert_eq!(str_at(&claim, &["metadata", "namespace"]), Some("ml"));
        let request = &claim["spec"]["devices"]["requests"][0];
        assert_eq!(
            str_at(request, &["exactly", "deviceClassName"]),
            Some(IMEX_DEVICE_CLASS)
        );
        assert_eq!(notes.not_carried.len(), 1);
        assert_eq!(notes.not_carried[0].0, "spec.numNodes");

        let mut empty = domain.clone();
        empty["spec"]["channel"] = Value::Null;
        let mut notes = Notes::default();
        assert_eq!(migrate_compute_domain(&empty, &mut notes), None);
        assert_eq!(notes.not_carried.len(), 1);
    }

    fn job(namespace: &str) -> Value {
        serde_yaml::from_str(&format!(
            r#"
apiVersion: batch/v1
kind: Job
metadata: {{name: job, namespace: {namespace}}}
spec:
  template:
    spec:
      resourceClaims:
      - {{name: imex, resourceClaimTemplateName: imex-job-channel}}
      - {{name: gpus, resourceClaimTemplateName: four-gpus}}
      containers: [{{name: c, image: x}}]
"#
        ))
        .unwrap()
    }

    #[test]
    fn pods_naming_the_channel_template_share_the_claim() {
        let domain: Value = serde_yaml::from_str(DOMAIN).unwrap();
        let templates = channel_templates([&domain]);
        let mut same = job("ml");
        let mut notes = Notes::default();
        rewrite_pod_references(&mut same, &templates, &mut notes);
        let claims = &same["spec"]["template"]["spec"]["resourceClaims"];
        assert_eq!(
            str_at(&claims[0], &["resourceClaimName"]),
            Some("imex-job-channel")
        );
        assert_eq!(claims[0].get("resourceClaimTemplateName"), None);
        assert_eq!(
            str_at(&claims[1], &["resourceClaimTemplateName"]),
            Some("four-gpus")
        );
        assert_eq!(notes.changes.len(), 1);
        assert_eq!(notes.changes[0].0, "spec.template.spec.resourceClaims[0]");

        // Another namespace's template of the same name is not the domain's.
        let mut other = job("other");
        let mut notes = Notes::default();
        rewrite_pod_references(&mut other, &templates, &mut notes);
        assert_eq!(other, job("other"));
        assert!(notes.changes.is_empty());
    }
}
