//! The check of opaque configurations at creation (chart value controller.configValidation,
//! docs/operations.md "Admission checks"): deploy/examples/invalid-config's template without its
//! opt-out label, and a claim with the same config, are refused by the API server on a server-side
//! apply, with the message `tessera validate` prints for the file; with the label, and with a
//! valid interval, the same objects are created. (`invalid-config` covers what prepare does with
//! an opted-out template.)

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate};
use kube::api::{Api, DeleteParams};
use tessera_api::names::CONFIG_VALIDATION_LABEL;

use super::outcome::ScenarioOutcome;
use crate::context::Ctx;
use crate::manifest::{Manifest, Object, apply_object};
use crate::wait::{Progress, until};

const EXAMPLE: &str = "invalid-config";
const NAMESPACE: &str = "tessera-e2e-config-check";
/// The chart's ValidatingWebhookConfiguration (release `tessera`).
const WEBHOOK_CONFIGURATION: &str = "tessera-webhook";
/// How long the webhook may take to answer after the chart is installed (the controller writes
/// its CA into the configuration once it serves).
const ANSWERING: Duration = Duration::from_secs(60);

pub async fn config_refused(ctx: &Ctx) -> anyhow::Result<ScenarioOutcome> {
    let configurations = Api::<ValidatingWebhookConfiguration>::all(ctx.client.clone());
    if configurations
        .get_opt(WEBHOOK_CONFIGURATION)
        .await?
        .is_none()
    {
        return Ok(ScenarioOutcome::Skipped(format!(
            "no ValidatingWebhookConfiguration {WEBHOOK_CONFIGURATION}: the chart was installed without controller.configValidation.enabled (or not with helm)"
        )));
    }
    let dir = ctx.examples_dir.join(EXAMPLE);
    let problem = validate_problem(&dir)?;
    ctx.say(format!("tessera validate: {problem}"));
    super::queues::labelled_namespace(ctx, NAMESPACE, &[]).await?;

    let mut template = example_template(&dir)?;
    template.metadata.namespace = Some(NAMESPACE.to_owned());
    let opted_out = template.clone();
    template
        .metadata
        .labels
        .get_or_insert_default()
        .remove(CONFIG_VALIDATION_LABEL);
    let expected = format!("spec.spec.devices.config[0].opaque.parameters: {problem}");
    let refusal = refused(
        ctx,
        Object::ResourceClaimTemplate(template.clone()),
        &expected,
    )
    .await?;
    ctx.say(format!("template refused: {refusal}"));

    let claim = claim_of(&template)?;
    let expected = format!("spec.devices.config[0].opaque.parameters: {problem}");
    let refusal = refused(ctx, Object::ResourceClaim(claim.clone()), &expected).await?;
    ctx.say(format!("claim refused: {refusal}"));

    apply_object(&ctx.client, &Object::ResourceClaimTemplate(opted_out))
        .await
        .context("the template labelled for prepare-time checks only was refused")?;
    let mut valid = claim;
    valid.metadata.name = Some("valid".to_owned());
    let spec = serde_json::to_string(&valid.spec)?.replace("Forever", "Short");
    valid.spec = serde_json::from_str(&spec)?;
    apply_object(&ctx.client, &Object::ResourceClaim(valid))
        .await
        .context("a claim with a valid config was refused")?;
    ctx.say("the opted-out template and a claim with interval Short were created");
    ctx.delete_namespace(NAMESPACE).await?;
    Ok(ScenarioOutcome::Passed)
}

/// What `tessera validate` says about the example's template: the text after its field path.
fn validate_problem(dir: &Path) -> anyhow::Result<String> {
    let cli = std::env::current_exe()?.with_file_name("tessera");
    ensure!(
        cli.is_file(),
        "{} is missing: build the CLI too (cargo build --bin tessera; tests/e2e/run does)",
        cli.display()
    );
    let output = Command::new(&cli)
        .arg("validate")
        .arg(dir.join(format!("{EXAMPLE}.yaml")))
        .output()?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let marker = "spec.spec.devices.config[0].opaque.parameters: ";
    let Some(line) = stdout.lines().find(|l| l.contains(marker)) else {
        bail!(
            "tessera validate reported nothing for {marker}: {stdout}{}",
            String::from_utf8_lossy(&output.stderr)
        );
    };
    let (_, problem) = line.split_once(marker).context("checked above")?;
    Ok(problem.to_owned())
}

fn example_template(dir: &Path) -> anyhow::Result<ResourceClaimTemplate> {
    Manifest::read_dir(dir)?
        .objects
        .into_iter()
        .find_map(|object| match object {
            Object::ResourceClaimTemplate(t) => Some(t),
            _ => None,
        })
        .context("deploy/examples/invalid-config has no ResourceClaimTemplate")
}

/// A claim named `direct` with the template's spec.
fn claim_of(template: &ResourceClaimTemplate) -> anyhow::Result<ResourceClaim> {
    Ok(serde_json::from_value(serde_json::json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "direct", "namespace": NAMESPACE},
        "spec": template.spec.as_ref().map(|s| &s.spec),
    }))?)
}

/// Applies `object` until the API server refuses it with a message containing `expected` (an
/// object created meanwhile, before the webhook answered, is deleted and tried again). Returns the
/// refusal.
async fn refused(ctx: &Ctx, object: Object, expected: &str) -> anyhow::Result<String> {
    until(
        &format!("{} to be refused with `{expected}`", object.describe()),
        ANSWERING,
        || async {
            match apply_object(&ctx.client, &object).await {
                Ok(()) => {
                    delete(ctx, &object).await?;
                    Ok(Progress::Waiting(
                        "created: the webhook did not answer yet".to_owned(),
                    ))
                }
                Err(e) => {
                    let message = format!("{e:#}");
                    Ok(if message.contains(expected) {
                        Progress::Done(message)
                    } else {
                        Progress::Waiting(format!("refused otherwise: {message}"))
                    })
                }
            }
        },
    )
    .await
}

async fn delete(ctx: &Ctx, object: &Object) -> anyhow::Result<()> {
    let params = DeleteParams::default();
    match object {
        Object::ResourceClaimTemplate(t) => {
            Api::<ResourceClaimTemplate>::namespaced(ctx.client.clone(), NAMESPACE)
                .delete(t.metadata.name.as_deref().unwrap_or_default(), &params)
                .await?;
        }
        Object::ResourceClaim(c) => {
            Api::<ResourceClaim>::namespaced(ctx.client.clone(), NAMESPACE)
                .delete(c.metadata.name.as_deref().unwrap_or_default(), &params)
                .await?;
        }
        other => bail!("{} is not a claim or template", other.describe()),
    }
    Ok(())
}
