//! Device taints and request tolerations: a taint with effect `NoSchedule` or `NoExecute` must be
//! tolerated; `None` and effects this version does not know are ignored.

use k8s_openapi::api::resource::v1::{DeviceTaint, DeviceToleration};

/// `ToleratesTaint` upstream: an empty effect or key in the toleration matches any; operator
/// `Exists` matches any value, `Equal` (or empty) the taint's value.
pub(crate) fn tolerates(toleration: &DeviceToleration, taint: &DeviceTaint) -> bool {
    if toleration
        .effect
        .as_deref()
        .is_some_and(|e| !e.is_empty() && e != taint.effect)
    {
        return false;
    }
    if toleration
        .key
        .as_deref()
        .is_some_and(|k| !k.is_empty() && k != taint.key)
    {
        return false;
    }
    match toleration.operator.as_deref().unwrap_or("") {
        "" | "Equal" => {
            toleration.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or("")
        }
        "Exists" => true,
        _ => false,
    }
}

/// The first taint that prevents allocation under these tolerations.
pub(crate) fn untolerated_taint<'t>(
    taints: &'t [DeviceTaint],
    tolerations: &[DeviceToleration],
) -> Option<&'t DeviceTaint> {
    taints.iter().find(|taint| {
        matches!(taint.effect.as_str(), "NoSchedule" | "NoExecute")
            && !tolerations.iter().any(|t| tolerates(t, taint))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taint(key: &str, value: &str, effect: &str) -> DeviceTaint {
        DeviceTaint {
            key: key.into(),
            value: Some(value.into()),
            effect: effect.into(),
            time_added: None,
        }
    }

    fn toleration(key: &str, op: &str, value: &str, effect: &str) -> DeviceToleration {
        let opt = |s: &str| (!s.is_empty()).then(|| s.to_owned());
        DeviceToleration {
            key: opt(key),
            operator: opt(op),
            value: opt(value),
            effect: opt(effect),
            toleration_seconds: None,
        }
    }

    #[test]
    fn toleration_rules() {
        let t = taint("k", "v", "NoSchedule");
        assert!(tolerates(&toleration("k", "Exists", "", "NoSchedule"), &t));
        assert!(tolerates(&toleration("k", "Equal", "v", ""), &t));
        assert!(tolerates(&toleration("k", "", "v", ""), &t));
        assert!(!tolerates(&toleration("k", "Equal", "w", ""), &t));
        assert!(!tolerates(&toleration("k", "Exists", "", "NoExecute"), &t));
        assert!(!tolerates(&toleration("other", "Exists", "", ""), &t));
        assert!(tolerates(&toleration("", "Exists", "", ""), &t));
        assert!(!tolerates(&toleration("k", "Bogus", "v", ""), &t));
    }

    #[test]
    fn only_scheduling_effects_block() {
        let none = taint("k", "v", "None");
        let future = taint("k", "v", "SomeFutureEffect");
        assert!(untolerated_taint(&[none, future], &[]).is_none());
        let exec = taint("k", "v", "NoExecute");
        assert_eq!(
            untolerated_taint(std::slice::from_ref(&exec), &[]),
            Some(&exec)
        );
    }
}
