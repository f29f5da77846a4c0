//! Reading the `/metrics` of Tessera's processes: through the API server's pod proxy (the chart's
//! pods) or from a process's loopback address (tests/e2e/local-up --install processes), and the
//! little of the Prometheus text format the scenarios need.

use std::collections::BTreeMap;

use anyhow::Context;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};

/// `/metrics` of `pod`, through the API server's pod proxy on the pod's first container port.
pub async fn pod_metrics(client: &kube::Client, pod: &Pod) -> anyhow::Result<String> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let port = pod
        .spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .and_then(|c| c.ports.as_ref())
        .and_then(|p| p.first())
        .map(|p| p.container_port)
        .with_context(|| format!("pod {namespace}/{name} declares no port"))?;
    let path = format!("/api/v1/namespaces/{namespace}/pods/{name}:{port}/proxy/metrics");
    let request = http::Request::get(&path).body(Vec::new())?;
    client
        .request_text(request)
        .await
        .with_context(|| format!("GET {path}"))
}

/// `/metrics` from `address` (`127.0.0.1:PORT`), plain HTTP/1.0 (on a blocking thread).
pub async fn address_metrics(address: &str) -> anyhow::Result<String> {
    let address = address.to_owned();
    tokio::task::spawn_blocking(move || blocking_get(&address)).await?
}

fn blocking_get(address: &str) -> anyhow::Result<String> {
    use std::io::{Read, Write};
    let mut stream =
        std::net::TcpStream::connect(address).with_context(|| format!("connect to {address}"))?;
    stream.set_read_timeout(Some(std::time::Duration::from_secs(10)))?;
    stream.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .with_context(|| format!("{address}/metrics: not an HTTP response"))?;
    anyhow::ensure!(
        head.starts_with("HTTP/1.1 200") || head.starts_with("HTTP/1.0 200"),
        "{address}/metrics: {}",
        head.lines().next().unwrap_or_default()
    );
    Ok(body.to_owned())
}

/// `/metrics` of every pod in `namespace` matching `selector`.
pub async fn pods_metrics(
    client: &kube::Client,
    namespace: &str,
    selector: &str,
) -> anyhow::Result<Vec<String>> {
    let pods = Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().labels(selector))
        .await
        .with_context(|| format!("list pods {selector} in {namespace}"))?;
    let mut texts = Vec::new();
    for pod in pods
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
    {
        texts.push(pod_metrics(client, pod).await?);
    }
    Ok(texts)
}

/// The metric families a text declares (`# TYPE name kind`), name to kind.
pub fn declared(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| {
            let mut words = rest.split_whitespace();
            Some((words.next()?.to_owned(), words.next()?.to_owned()))
        })
        .collect()
}

/// Whether a name a query uses is a series of a declared family: the family itself, a
/// counter's `_total` (and `_created`), a histogram's `_bucket`, `_sum` and `_count`.
pub fn exists(name: &str, families: &BTreeMap<String, String>) -> bool {
    if families.contains_key(name) {
        return true;
    }
    let suffixes: &[(&str, &str)] = &[
        ("_total", "counter"),
        ("_created", "counter"),
        ("_bucket", "histogram"),
        ("_sum", "histogram"),
        ("_count", "histogram"),
    ];
    suffixes.iter().any(|(suffix, kind)| {
        name.strip_suffix(suffix)
            .and_then(|stem| families.get(stem))
            .is_some_and(|k| k == kind)
    })
}

/// Every `tessera_…` metric name in a query.
pub fn names_in_query(query: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = query;
    while let Some(start) = rest.find("tessera_") {
        let preceded = rest[..start]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        let tail = &rest[start..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        if !preceded {
            names.push(tail[..end].to_owned());
        }
        rest = &tail[end..];
    }
    names
}

/// The labels and value of each sample of `name` in `text`.
pub fn samples(text: &str, name: &str) -> Vec<(BTreeMap<String, String>, f64)> {
    text.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix(name)?;
            let (labels, value) = match rest.strip_prefix('{') {
                Some(inner) => {
                    let (labels, value) = inner.split_once("} ")?;
                    (parse_labels(labels)?, value)
                }
                None => (BTreeMap::new(), rest.strip_prefix(' ')?),
            };
            let value = value.split_whitespace().next()?.parse().ok()?;
            Some((labels, value))
        })
        .collect()
}

/// `a="x",b="y"` (values without escapes, as the scenarios' label values are).
fn parse_labels(text: &str) -> Option<BTreeMap<String, String>> {
    let mut labels = BTreeMap::new();
    let mut rest = text;
    while !rest.is_empty() {
        let (key, after) = rest.split_once("=\"")?;
        let (value, after) = after.split_once('"')?;
        labels.insert(key.to_owned(), value.to_owned());
        rest = after.strip_prefix(',').unwrap_or(after);
    }
    Some(labels)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# HELP tessera_node_claims Claims.\n\
        # TYPE tessera_node_claims counter\n\
        tessera_node_claims_total{operation=\"prepare\",result=\"success\"} 2\n\
        # TYPE tessera_node_call_duration_seconds histogram\n\
        # TYPE tessera_node_gpu_utilization_percent gauge\n\
        tessera_node_gpu_utilization_percent{namespace=\"ml\",pod=\"p\",claim=\"\",device=\"gpu-0\"} 80\n\
        tessera_node_idle_claims 0\n";

    #[test]
    fn families_names_and_samples() {
        let families = declared(TEXT);
        for name in [
            "tessera_node_claims_total",
            "tessera_node_call_duration_seconds_bucket",
            "tessera_node_gpu_utilization_percent",
        ] {
            assert!(exists(name, &families), "{name}");
        }
        assert!(!exists("tessera_node_claims_bucket", &families));
        assert!(
            !exists("tessera_node_idle_claims", &families),
            "no TYPE line"
        );
        assert_eq!(
            names_in_query(
                "histogram_quantile(0.99, sum by (le) (rate(tessera_node_call_duration_seconds_bucket[5m]))) / my_tessera_x"
            ),
            ["tessera_node_call_duration_seconds_bucket"]
        );
        let found = samples(TEXT, "tessera_node_gpu_utilization_percent");
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].0["pod"], "p");
        assert_eq!(found[0].0["claim"], "");
        assert_eq!(found[0].1, 80.0);
        assert_eq!(samples(TEXT, "tessera_node_idle_claims")[0].1, 0.0);
    }
}
