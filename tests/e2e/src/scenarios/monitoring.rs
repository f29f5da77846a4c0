//! The chart's monitoring (deploy/helm/tessera/templates/monitoring.yaml): rendered with every
//! part on (`ci/monitoring-values.yaml` over the values local-up installed with), every metric
//! its PrometheusRule and Grafana dashboard query must exist on the running plugins or controller
//! (a `# TYPE` line in their `/metrics`; a counter's `_total` and a histogram's `_bucket`, `_sum`
//! and `_count` count as their family's).

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use anyhow::{Context, bail, ensure};
use serde::Deserialize;

use super::outcome::ScenarioOutcome;
use crate::context::Ctx;
use crate::observer::RuntimeObserver;
use crate::scrape::{declared, exists, names_in_query};

/// The alerts the rules must carry (docs/operations.md, "Dashboards and alerts").
const ALERTS: [&str; 7] = [
    "TesseraGPUClaimIdle",
    "TesseraGPUUnhealthy",
    "TesseraPrepareErrors",
    "TesseraPrepareSlow",
    "TesseraControllerPodsWaiting",
    "TesseraPodsWaitingForCapacity",
    "TesseraGPUMetricsFailing",
];

/// Families whose series exist only while a claim is idle: prometheus-client writes no `# TYPE`
/// line for a family without series, so a quiet cluster does not declare them. The single-gpu
/// scenario checks this series on the running plugin (scripted idle, `tessera_node_idle_claim`
/// 1 for its claim).
const WHILE_IDLE: &[&str] = &["tessera_node_idle_claim"];

pub async fn monitoring(ctx: &Ctx) -> anyhow::Result<ScenarioOutcome> {
    let RuntimeObserver::Local { local, .. } = &ctx.observer else {
        return Ok(ScenarioOutcome::Skipped(
            "renders the chart with helm: the local cluster only".to_owned(),
        ));
    };
    let Some(release) = &local.helm else {
        return Ok(ScenarioOutcome::Skipped(
            "Tessera was not installed by helm (local-up --install processes)".to_owned(),
        ));
    };
    // The chart requires a Kubernetes version: the cluster's.
    let version = ctx.client.apiserver_version().await?.git_version;
    let out = Command::new(&release.helm)
        .arg("template")
        .arg("tessera")
        .arg(&release.chart)
        .args(["--kube-version", version.trim_start_matches('v')])
        .args(["--namespace", &release.namespace, "--values"])
        .arg(&release.values)
        .arg("--values")
        .arg(release.ci_values("monitoring-values.yaml"))
        .output()
        .with_context(|| format!("run {}", release.helm.display()))?;
    ensure!(
        out.status.success(),
        "helm template with the monitoring values failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (alerts, queries) = queries_of(&String::from_utf8(out.stdout)?)?;
    let missing_alerts: Vec<&str> = ALERTS
        .iter()
        .copied()
        .filter(|a| !alerts.contains(*a))
        .collect();
    ensure!(
        missing_alerts.is_empty(),
        "the PrometheusRule lacks {missing_alerts:?}"
    );
    let names: BTreeSet<String> = queries.iter().flat_map(|q| names_in_query(q)).collect();
    ensure!(
        names.len() >= 10,
        "the rules and dashboard query only {names:?}"
    );

    let mut families = BTreeMap::new();
    let mut scraped = 0;
    for node in local.nodes.keys() {
        families.extend(declared(&ctx.plugins.metrics(node).await?));
        scraped += 1;
    }
    let controllers = ctx.plugins.controller_metrics().await?;
    ensure!(!controllers.is_empty(), "no controller replica to scrape");
    for text in &controllers {
        families.extend(declared(text));
    }
    let missing: Vec<&String> = names
        .iter()
        .filter(|n| !exists(n, &families) && !WHILE_IDLE.contains(&n.as_str()))
        .collect();
    if !missing.is_empty() {
        bail!(
            "the chart's rules and dashboard query {missing:?}, which no running plugin or controller exports \
             (they export {} families)",
            families.len()
        );
    }
    ctx.say(format!(
        "{} alerts and {} queries name {} metrics; each exists on the {scraped} plugins or {} controller replicas \
         ({WHILE_IDLE:?}: series only while a claim is idle, checked by single-gpu)",
        alerts.len(),
        queries.len(),
        names.len(),
        controllers.len()
    ));
    Ok(ScenarioOutcome::Passed)
}

#[derive(Deserialize)]
struct Dashboard {
    panels: Vec<Panel>,
}

#[derive(Deserialize)]
struct Panel {
    #[serde(default)]
    targets: Vec<Target>,
}

#[derive(Deserialize)]
struct Target {
    expr: String,
}

/// The alert names and every query of a render: the PrometheusRule's `expr`s and the dashboard
/// ConfigMap's targets.
fn queries_of(render: &str) -> anyhow::Result<(BTreeSet<String>, Vec<String>)> {
    let mut alerts = BTreeSet::new();
    let mut queries = Vec::new();
    let mut dashboards = 0;
    for document in serde_yaml::Deserializer::from_str(render) {
        let value = serde_yaml::Value::deserialize(document)?;
        match value["kind"].as_str() {
            Some("PrometheusRule") => {
                for group in value["spec"]["groups"].as_sequence().into_iter().flatten() {
                    for rule in group["rules"].as_sequence().into_iter().flatten() {
                        if let Some(alert) = rule["alert"].as_str() {
                            alerts.insert(alert.to_owned());
                        }
                        queries.push(
                            rule["expr"]
                                .as_str()
                                .context("a rule without expr")?
                                .to_owned(),
                        );
                    }
                }
            }
            Some("ConfigMap") => {
                let Some(json) = value["data"]["tessera-gpus.json"].as_str() else {
                    continue;
                };
                let dashboard: Dashboard = serde_json::from_str(json)?;
                dashboards += 1;
                queries.extend(
                    dashboard
                        .panels
                        .into_iter()
                        .flat_map(|p| p.targets)
                        .map(|t| t.expr),
                );
            }
            _ => {}
        }
    }
    ensure!(
        dashboards == 1,
        "the render has {dashboards} dashboards, expected 1"
    );
    Ok((alerts, queries))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chart_files_name_the_alerts_and_queries() {
        let files = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../deploy/helm/tessera/files/monitoring");
        let rules = std::fs::read_to_string(files.join("rules.yaml")).unwrap();
        let dashboard = std::fs::read_to_string(files.join("dashboard.json")).unwrap();
        // The shape of a render: the rules under a PrometheusRule's spec, the dashboard in a
        // ConfigMap.
        let rules: serde_yaml::Value = serde_yaml::from_str(&rules).unwrap();
        let render = serde_yaml::to_string(&serde_yaml::Value::Mapping(
            [
                ("kind".into(), "PrometheusRule".into()),
                ("spec".into(), rules),
            ]
            .into_iter()
            .collect(),
        ))
        .unwrap()
            + "---\n"
            + &serde_yaml::to_string(&serde_json::json!({
                "kind": "ConfigMap",
                "data": {"tessera-gpus.json": dashboard},
            }))
            .unwrap();
        let (alerts, queries) = queries_of(&render).unwrap();
        assert_eq!(alerts, ALERTS.iter().map(|a| a.to_string()).collect());
        let names: BTreeSet<String> = queries.iter().flat_map(|q| names_in_query(q)).collect();
        assert!(
            names.contains("tessera_node_gpu_utilization_percent"),
            "{names:?}"
        );
        assert!(
            names.contains("tessera_controller_queue_waiting"),
            "{names:?}"
        );
    }
}
