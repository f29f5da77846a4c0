//! `tessera validate FILE...`: lints DeviceClasses, ResourceClaims, ResourceClaimTemplates and
//! ResourceQuotas (multi-document YAML, `List` objects included) before they reach a cluster.
//!
//! Findings: a CEL selector that does not compile, that cannot return a bool, or whose estimated
//! cost the API server would refuse; an attribute or capacity name under `gpu.tessera.dev` (or a
//! standard `resource.kubernetes.io` name) that Tessera does not publish, with the closest name
//! it does; a constraint's `matchAttribute`/`distinctAttribute` naming such an attribute; an
//! opaque `gpu.tessera.dev` configuration that does not decode (Tessera's own, or NVIDIA's
//! `resource.nvidia.com/v1beta1`, which the node plugin reads as Tessera's, also under NVIDIA's
//! driver name `gpu.nvidia.com`, through the decoder prepare uses); a DeviceClass's
//! `extendedResourceName` the API server refuses, or one another class (in any file) carries
//! already; a ResourceQuota key for an extended resource without the `requests.` prefix, which the
//! API server stores and never enforces (`quota`). Each finding names the file, the object, the
//! field path and the problem. Exit status: 0 clean, 1 with findings, 2 when an input
//! cannot be read or parsed.

mod objects;
mod quota;
mod schema_check;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde_json::Value;
use tessera_cel::SelectorCompiler;

use objects::{ObjectRef, documents, selector_fields};

#[derive(Debug, clap::Args)]
pub struct ValidateArgs {
    /// YAML files holding DeviceClasses, ResourceClaims, ResourceClaimTemplates and
    /// ResourceQuotas (several documents per file and `kind: List` are fine; other kinds are
    /// skipped with a note).
    #[arg(required = true, value_name = "FILE")]
    files: Vec<PathBuf>,

    #[command(flatten)]
    output: crate::output::Output,
}

/// What `-o json` prints.
#[derive(Debug, Default, serde::Serialize)]
struct JsonReport {
    findings: Vec<Finding>,
    checked: usize,
    files: usize,
    unreadable: Vec<Unreadable>,
}

#[derive(Debug, serde::Serialize)]
struct Unreadable {
    file: String,
    error: String,
}

/// One problem found in one object.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Finding {
    pub file: String,
    pub object: String,
    pub path: String,
    pub problem: String,
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {}: {}: {}",
            self.file, self.object, self.path, self.problem
        )
    }
}

/// Runs the linter; findings go to `out`, notes and read errors to `err`.
pub fn run(
    args: &ValidateArgs,
    out: &mut impl Write,
    err: &mut impl Write,
) -> anyhow::Result<ExitCode> {
    let linter = Linter::new();
    let mut names = ExtendedResourceNames::default();
    let mut findings = 0usize;
    let json = args.output.json();
    let mut report = JsonReport::default();
    for path in &args.files {
        let file = path.display().to_string();
        let Some(objects) = read_objects(path, &file, &mut report, err)? else {
            continue;
        };
        for object in objects {
            let object_ref = ObjectRef::of(&object);
            if !object_ref.is_checked_kind() {
                writeln!(
                    err,
                    "note: {file}: {object_ref} skipped: only DeviceClasses, ResourceClaims, ResourceClaimTemplates and ResourceQuotas are checked"
                )?;
                continue;
            }
            report.checked += 1;
            let across = names.add(&file, &object_ref, &object);
            for finding in linter
                .lint(&file, &object_ref, &object)
                .into_iter()
                .chain(across)
            {
                if json {
                    report.findings.push(finding);
                } else {
                    writeln!(out, "{finding}")?;
                }
                findings += 1;
            }
        }
    }
    let unreadable = report.unreadable.len();
    report.files = args.files.len() - unreadable;
    if json {
        serde_json::to_writer_pretty(&mut *out, &report)?;
        writeln!(out)?;
    }
    write_summary(err, findings, report.checked, report.files, unreadable)?;
    Ok(match (unreadable, findings) {
        (1.., _) => ExitCode::from(2),
        (0, 0) => ExitCode::SUCCESS,
        (0, _) => ExitCode::from(1),
    })
}

/// The objects of the YAML file at `path` (named `file`), or `None` when it cannot be read or
/// parsed: then the error is written to `err` and recorded in `report`.
fn read_objects(
    path: &Path,
    file: &str,
    report: &mut JsonReport,
    err: &mut impl Write,
) -> anyhow::Result<Option<Vec<Value>>> {
    let problem = match std::fs::read_to_string(path) {
        Ok(text) => match documents(&text) {
            Ok(objects) => return Ok(Some(objects)),
            Err(e) => format!("not valid YAML: {e}"),
        },
        Err(e) => format!("cannot read: {e}"),
    };
    writeln!(err, "error: {file}: {problem}")?;
    report.unreadable.push(Unreadable {
        file: file.to_owned(),
        error: problem,
    });
    Ok(None)
}

/// The last line on stderr: findings, objects and files checked, and files that were not.
fn write_summary(
    err: &mut impl Write,
    findings: usize,
    checked: usize,
    files: usize,
    unreadable: usize,
) -> std::io::Result<()> {
    let summary = if findings == 0 {
        format!("{checked} object(s) in {files} file(s): no findings")
    } else {
        format!("{findings} finding(s) in {checked} object(s) from {files} file(s)")
    };
    if unreadable > 0 {
        // A clean summary must not hide that some input was never checked.
        writeln!(err, "{summary}; {unreadable} file(s) could not be checked")
    } else {
        writeln!(err, "{summary}")
    }
}

/// The `extendedResourceName`s of the DeviceClasses seen so far, across files: kube-scheduler
/// serves a name from one class only (the newest), so a second class with the same name is a
/// finding, as is a name the API server refuses.
#[derive(Default)]
pub struct ExtendedResourceNames {
    /// name -> "file: DeviceClass/x" of the first class carrying it.
    seen: std::collections::BTreeMap<String, String>,
}

impl ExtendedResourceNames {
    pub fn add(&mut self, file: &str, object_ref: &ObjectRef, object: &Value) -> Vec<Finding> {
        if !object_ref.is_device_class() {
            return Vec::new();
        }
        let Some(name) = object
            .pointer("/spec/extendedResourceName")
            .and_then(Value::as_str)
        else {
            return Vec::new();
        };
        let finding = |problem: String| Finding {
            file: file.to_owned(),
            object: object_ref.to_string(),
            path: "spec.extendedResourceName".to_owned(),
            problem,
        };
        if !is_extended_resource_name(name) {
            return vec![finding(format!(
                "`{name}` is not an extended resource name: it must be `<domain>/<name>` outside \
                 kubernetes.io, e.g. `nvidia.com/gpu` (the API server refuses the class)"
            ))];
        }
        match self.seen.get(name) {
            Some(first) => vec![finding(format!(
                "`{name}` is also the extendedResourceName of {first}: kube-scheduler serves it from \
                 only one class (the newest), so pods asking for it get that class's devices; give \
                 each name to one class (with Tessera's chart: extendedResources.enabled=false or \
                 other names while another driver's class keeps this one)"
            ))],
            None => {
                self.seen
                    .insert(name.to_owned(), format!("{file}: {object_ref}"));
                Vec::new()
            }
        }
    }
}

/// Whether the API server accepts `name` as an extended resource name: a qualified name
/// `<DNS subdomain>/<name>` (name: ≤ 63 alphanumerics, `-`, `_`, `.`, alphanumeric at both
/// ends) outside `kubernetes.io`, whose `requests.`-prefixed form is still a qualified name.
fn is_extended_resource_name(name: &str) -> bool {
    let Some((domain, local)) = name.split_once('/') else {
        return false;
    };
    let label = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    !name.contains("kubernetes.io/")
        && domain.len() + "requests.".len() <= 253
        && domain.split('.').all(label)
        && local.len() <= 63
        && edge(local.chars().next())
        && edge(local.chars().last())
        && local
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// Checks objects; holds the selector compiler shared by all of them.
pub struct Linter {
    compiler: SelectorCompiler,
    samples: schema_check::SampleDevices,
}

impl Linter {
    pub fn new() -> Linter {
        Linter {
            compiler: SelectorCompiler::new(),
            samples: schema_check::SampleDevices::new(),
        }
    }

    /// The findings for one object, read from `file`.
    pub fn lint(&self, file: &str, object_ref: &ObjectRef, object: &Value) -> Vec<Finding> {
        let finding = |path: String, problem: String| Finding {
            file: file.to_owned(),
            object: object_ref.to_string(),
            path,
            problem,
        };
        if object_ref.is_resource_quota() {
            return quota::unenforced_keys(object)
                .into_iter()
                .map(|(path, problem)| finding(path, problem))
                .collect();
        }
        let fields = selector_fields(object_ref, object);
        let mut findings: Vec<Finding> = fields
            .malformed
            .into_iter()
            .map(|(path, problem)| finding(path, problem))
            .collect();
        for (path, expression) in fields.selectors {
            for problem in self.selector_problems(&expression) {
                findings.push(finding(path.clone(), problem));
            }
        }
        for (path, name) in fields.constraint_attributes {
            if let Some(problem) = schema_check::qualified_attribute_problem(&name) {
                findings.push(finding(path, problem));
            }
        }
        for (path, problem) in fields.config_problems {
            findings.push(finding(path, problem));
        }
        findings
    }

    /// What is wrong with one selector expression.
    fn selector_problems(&self, expression: &str) -> Vec<String> {
        let selector = match self.compiler.compile(expression) {
            Ok(selector) => selector,
            Err(e) => return vec![e.to_string()],
        };
        let mut problems = Vec::new();
        if let Err(e) = selector.check_estimated_cost() {
            problems.push(e.to_string());
        }
        problems.extend(
            selector
                .name_references()
                .iter()
                .filter_map(schema_check::reference_problem),
        );
        problems.extend(self.samples.result_problem(&selector));
        problems
    }
}

#[cfg(test)]
mod tests;
