//! `tessera migrate FILE...`: NVIDIA DRA manifests and NVIDIA device-plugin configs rewritten
//! into Tessera objects and chart values.
//!
//! Every input document is one of: a Kubernetes object (DRA objects are rewritten by
//! [`manifests`], other objects such as Pods and Deployments pass through unchanged); a
//! device-plugin config (`version: v1` at the top level, or as a value in a ConfigMap's `data`,
//! as the GPU operator stores it), turned into a values fragment by [`device_plugin`].
//!
//! Output: objects as multi-document YAML on stdout, or with `-o DIR` one file per input under
//! DIR (same file name); the values fragment in `--values FILE`, else `DIR/values.yaml`, else on
//! stdout when there are no objects, else on stderr. Each change and each thing that could not
//! be carried over is printed on stderr, naming the file, the object and the field. Exit status:
//! 0 when everything was carried over, 1 when something was not, 2 when an input cannot be read.

mod notes;

mod compute_domains;
mod device_plugin;
mod manifests;
mod pods;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use serde::Deserialize;
use serde_yaml::{Mapping, Value};

use notes::Notes;

#[derive(Debug, clap::Args)]
pub struct MigrateArgs {
    /// YAML files: NVIDIA DRA manifests (DeviceClasses, ResourceClaims, ResourceClaimTemplates,
    /// with the Pods and Deployments around them) and NVIDIA device-plugin configs (plain or in
    /// a ConfigMap).
    #[arg(required = true, value_name = "FILE")]
    files: Vec<PathBuf>,
    /// Write the objects of each FILE to DIR/<file name> (and the values to DIR/values.yaml)
    /// instead of stdout.
    #[arg(short = 'o', long = "output-dir", value_name = "DIR")]
    output_dir: Option<PathBuf>,
    /// Write the chart values fragment (from device-plugin configs) to this file.
    #[arg(long = "values", value_name = "FILE")]
    values: Option<PathBuf>,
    /// Also convert pods written for NVIDIA's device plugin (Pods and the pod templates of
    /// workloads asking for `nvidia.com/gpu` or a MIG profile's extended resource) as Tessera's
    /// admission webhook does in opted-in namespaces: a claim from a ResourceClaimTemplate per
    /// container and resource, and the topology-aware gate; the templates are printed with them.
    #[arg(long = "convert-device-plugin-pods")]
    convert_device_plugin_pods: bool,
}

/// The migration of a set of inputs, before anything is written.
#[derive(Debug, Default)]
pub struct Migration {
    /// Per input file: its migrated objects.
    pub files: Vec<(PathBuf, Vec<Value>)>,
    /// The chart values from device-plugin configs.
    pub values: Mapping,
    /// Report lines: (is a thing not carried over, text).
    pub report: Vec<(bool, String)>,
    /// Inputs that could not be read or parsed (already in the report).
    pub unreadable: usize,
    /// `--convert-device-plugin-pods`: the conversion's table (the chart's classes).
    pub pod_conversion: Option<tessera_admission::ConversionTable>,
    /// The channel templates of the inputs' ComputeDomains: pods naming one share the domain's
    /// claim instead ([`compute_domains`]).
    pub channel_templates: std::collections::BTreeSet<compute_domains::ChannelTemplate>,
}

/// `Kind/namespace/name` of an object, for the report.
fn describe(object: &Value) -> String {
    let kind = object
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or("(no kind)");
    let metadata = object.get("metadata");
    let name = metadata
        .and_then(|m| m.get("name"))
        .and_then(Value::as_str)
        .unwrap_or("(no name)");
    match metadata
        .and_then(|m| m.get("namespace"))
        .and_then(Value::as_str)
    {
        Some(namespace) => format!("{kind}/{namespace}/{name}"),
        None => format!("{kind}/{name}"),
    }
}

fn report(migration: &mut Migration, file: &str, what: &str, notes: Notes) {
    let at = |path: &str| {
        if path.is_empty() {
            String::new()
        } else {
            format!("{path}: ")
        }
    };
    for (path, text) in notes.changes {
        migration
            .report
            .push((false, format!("{file}: {what}: {}{text}", at(&path))));
    }
    for (path, text) in notes.not_carried {
        migration.report.push((
            true,
            format!("{file}: {what}: not carried over: {}{text}", at(&path)),
        ));
    }
}

/// The YAML documents of `text`, `List`s flattened, empty documents skipped.
fn documents(text: &str) -> Result<Vec<Value>, serde_yaml::Error> {
    let mut out = Vec::new();
    for document in serde_yaml::Deserializer::from_str(text) {
        let value = Value::deserialize(document)?;
        flatten(value, &mut out);
    }
    Ok(out)
}

fn flatten(value: Value, out: &mut Vec<Value>) {
    if value.is_null() {
        return;
    }
    let is_list = value
        .get("kind")
        .and_then(Value::as_str)
        .is_some_and(|k| k.ends_with("List"));
    match value.get("items").and_then(Value::as_sequence) {
        Some(items) if is_list => items.iter().cloned().for_each(|i| flatten(i, out)),
        _ => out.push(value),
    }
}

/// Migrates the documents of one input `file` (its text already read).
pub fn migrate_text(migration: &mut Migration, file: &Path, text: &str) {
    let name = file.display().to_string();
    let docs = match documents(text) {
        Ok(docs) => docs,
        Err(e) => {
            migration
                .report
                .push((true, format!("{name}: not valid YAML: {e}")));
            migration.unreadable += 1;
            return;
        }
    };
    migration
        .channel_templates
        .extend(compute_domains::channel_templates(&docs));
    let mut objects = Vec::new();
    for doc in docs {
        if compute_domains::is_compute_domain(&doc) {
            let mut notes = Notes::default();
            objects.extend(compute_domains::migrate_compute_domain(&doc, &mut notes));
            report(migration, &name, &describe(&doc), notes);
            continue;
        }
        if device_plugin::is_device_plugin_config(&doc) {
            let mut notes = Notes::default();
            device_plugin::migrate_config(&doc, &mut migration.values, &mut notes);
            report(migration, &name, "device-plugin config", notes);
            continue;
        }
        if doc.get("kind").and_then(Value::as_str) == Some("ConfigMap")
            && let Some(configs) = embedded_configs(&doc)
        {
            let what = describe(&doc);
            for (index, (key, config)) in configs.iter().enumerate() {
                let mut notes = Notes::default();
                if index == 0 {
                    device_plugin::migrate_config(config, &mut migration.values, &mut notes);
                } else {
                    notes.not_carried(
                        format!("data.{key}"),
                        format!(
                            "a second device-plugin config (the GPU operator picks one per node by the label nvidia.com/device-plugin.config={key}); make those nodes a `kubeletPlugin.nodeGroups[]` entry and migrate this config on its own"
                        ),
                    );
                }
                report(migration, &name, &format!("{what} data.{key}"), notes);
            }
            continue;
        }
        let what = describe(&doc);
        let mut notes = Notes::default();
        let mut migrated = manifests::migrate_object(doc, &mut notes);
        let mut templates = Vec::new();
        if let (Some(table), Some(object)) = (&migration.pod_conversion, &mut migrated.object) {
            templates = pods::convert_object(object, table, &mut notes);
        }
        if let Some(object) = &mut migrated.object {
            compute_domains::rewrite_pod_references(
                object,
                &migration.channel_templates,
                &mut notes,
            );
        }
        report(migration, &name, &what, notes);
        objects.extend(migrated.object);
        for template in templates {
            if !objects.contains(&template) {
                objects.push(template);
            }
        }
    }
    migration.files.push((file.to_owned(), objects));
}

/// Device-plugin configs stored as the values of a ConfigMap's `data`.
fn embedded_configs(config_map: &Value) -> Option<Vec<(String, Value)>> {
    let data = config_map.get("data")?.as_mapping()?;
    let configs: Vec<(String, Value)> = data
        .iter()
        .filter_map(|(key, value)| {
            let parsed: Value = serde_yaml::from_str(value.as_str()?).ok()?;
            device_plugin::is_device_plugin_config(&parsed)
                .then(|| (key.as_str().unwrap_or_default().to_owned(), parsed))
        })
        .collect();
    (!configs.is_empty()).then_some(configs)
}

fn to_yaml_stream(objects: &[Value]) -> anyhow::Result<String> {
    let mut text = String::new();
    for object in objects {
        text.push_str("---\n");
        text.push_str(&serde_yaml::to_string(object)?);
    }
    Ok(text)
}

/// Writes each input file's migrated objects to a file of the same name in `dir` (`2-name`,
/// `3-name`, … where two inputs share a name); files left with no objects are not written.
fn write_objects_to_dir(files: &[(PathBuf, Vec<Value>)], dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut used = std::collections::BTreeSet::new();
    for (file, objects) in files {
        if objects.is_empty() {
            continue;
        }
        let base = file
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "objects.yaml".to_owned());
        let mut target = base.clone();
        let mut n = 1;
        while !used.insert(target.clone()) {
            n += 1;
            target = format!("{n}-{base}");
        }
        let path = dir.join(&target);
        std::fs::write(&path, to_yaml_stream(objects)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

/// Writes the chart values migrated from device-plugin configs: to `--values`, else into the
/// output directory, else to stdout when no objects went there, else to stderr.
fn write_values(
    args: &MigrateArgs,
    values: &Mapping,
    any_objects: bool,
    out: &mut impl Write,
    err: &mut impl Write,
) -> anyhow::Result<()> {
    let text = format!(
        "# Tessera chart values migrated from NVIDIA device-plugin configs (helm install -f)\n{}",
        serde_yaml::to_string(&Value::Mapping(values.clone()))?
    );
    let target = args
        .values
        .clone()
        .or_else(|| args.output_dir.as_ref().map(|d| d.join("values.yaml")));
    match target {
        Some(path) => std::fs::write(&path, text)
            .with_context(|| format!("cannot write {}", path.display()))?,
        None if !any_objects => out.write_all(text.as_bytes())?,
        None => err.write_all(text.as_bytes())?,
    }
    Ok(())
}

/// Runs the command.
pub fn run(
    args: &MigrateArgs,
    out: &mut impl Write,
    err: &mut impl Write,
) -> anyhow::Result<ExitCode> {
    let mut migration = Migration {
        pod_conversion: args.convert_device_plugin_pods.then(pods::chart_table),
        ..Migration::default()
    };
    let texts: Vec<(&PathBuf, std::io::Result<String>)> = args
        .files
        .iter()
        .map(|file| (file, std::fs::read_to_string(file)))
        .collect();
    // ComputeDomains first: their pods may be in other files.
    for text in texts.iter().filter_map(|(_, t)| t.as_ref().ok()) {
        let docs = documents(text).unwrap_or_default();
        migration
            .channel_templates
            .extend(compute_domains::channel_templates(&docs));
    }
    for (file, text) in texts {
        match text {
            Ok(text) => migrate_text(&mut migration, file, &text),
            Err(e) => {
                migration
                    .report
                    .push((true, format!("{}: cannot read: {e}", file.display())));
                migration.unreadable += 1;
            }
        }
    }
    for (_, line) in &migration.report {
        writeln!(err, "{line}")?;
    }
    let any_objects = migration.files.iter().any(|(_, o)| !o.is_empty());
    match &args.output_dir {
        Some(dir) => write_objects_to_dir(&migration.files, dir)?,
        None => {
            let all: Vec<Value> = migration
                .files
                .iter()
                .flat_map(|(_, o)| o.iter().cloned())
                .collect();
            out.write_all(to_yaml_stream(&all)?.as_bytes())?;
        }
    }
    if !migration.values.is_empty() {
        write_values(args, &migration.values, any_objects, out, err)?;
    }
    let not_carried = migration.report.iter().filter(|(bad, _)| *bad).count();
    writeln!(
        err,
        "{} change(s), {not_carried} thing(s) not carried over",
        migration.report.len() - not_carried
    )?;
    Ok(match (migration.unreadable, not_carried) {
        (1.., _) => ExitCode::from(2),
        (0, 0) => ExitCode::SUCCESS,
        _ => ExitCode::from(1),
    })
}

#[cfg(test)]
mod tests;
