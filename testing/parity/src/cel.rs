//! CEL selectors on devices through upstream's DRA CEL environment (the oracle's `cel` op) and
//! through `tessera-cel`: the same verdict (true, false, compile error, runtime error) for every
//! (expression, device) pair.

use k8s_openapi::api::resource::v1::Device;
use serde::{Deserialize, Serialize};
use tessera_cel::{DeviceContext, SelectorCompiler};

use crate::oracle::Oracle;

/// A device as a selector sees it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CelDevice {
    pub driver: String,
    pub device: Device,
}

/// One verdict.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CelVerdict {
    /// true | false | error
    pub result: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_class: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl CelVerdict {
    fn kind(&self) -> (&str, Option<&str>) {
        (self.result.as_str(), self.error_class.as_deref())
    }
}

/// Upstream's verdicts, `[expression][device]`.
pub fn upstream(
    oracle: &mut Oracle,
    expressions: &[String],
    devices: &[CelDevice],
) -> anyhow::Result<Vec<Vec<CelVerdict>>> {
    #[derive(Serialize)]
    struct Request<'a> {
        op: &'static str,
        expressions: &'a [String],
        devices: &'a [CelDevice],
    }
    #[derive(Deserialize)]
    struct Answer {
        verdicts: Vec<Vec<CelVerdict>>,
    }
    let a: Answer = oracle.ask(&Request {
        op: "cel",
        expressions,
        devices,
    })?;
    Ok(a.verdicts)
}

/// Our verdicts, `[expression][device]`.
pub fn ours(expressions: &[String], devices: &[CelDevice]) -> Vec<Vec<CelVerdict>> {
    let compiler = SelectorCompiler::new();
    let contexts: Vec<DeviceContext> = devices
        .iter()
        .map(|d| DeviceContext::new(&d.driver, &d.device))
        .collect();
    expressions
        .iter()
        .map(|e| {
            let compiled = compiler.compile(e);
            contexts
                .iter()
                .map(|ctx| match &compiled {
                    Err(err) => CelVerdict {
                        result: "error".into(),
                        error_class: Some("cel-compile".into()),
                        message: Some(err.to_string()),
                    },
                    Ok(s) => match s.evaluate(ctx) {
                        Ok(b) => CelVerdict {
                            result: b.to_string(),
                            error_class: None,
                            message: None,
                        },
                        Err(err) => CelVerdict {
                            result: "error".into(),
                            error_class: Some("cel-runtime".into()),
                            message: Some(err.to_string()),
                        },
                    },
                })
                .collect()
        })
        .collect()
}

/// `(expression, device index, ours, upstream)` for every pair that differs.
pub fn differences(
    expressions: &[String],
    ours: &[Vec<CelVerdict>],
    upstream: &[Vec<CelVerdict>],
) -> Vec<(String, usize, CelVerdict, CelVerdict)> {
    let mut out = Vec::new();
    for (i, e) in expressions.iter().enumerate() {
        for (j, (o, u)) in ours[i].iter().zip(&upstream[i]).enumerate() {
            if o.kind() != u.kind() {
                out.push((e.clone(), j, o.clone(), u.clone()));
            }
        }
    }
    out
}
