//! Keeps docs/deviceclass-cookbook.md true: every YAML example passes `tessera validate`, and
//! every selector in its "Mistakes" table gets the finding the table promises.

use std::path::Path;
use std::process::{Command, Output};

fn cookbook() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/deviceclass-cookbook.md");
    std::fs::read_to_string(path).expect("the cookbook is readable")
}

fn validate(dir: &tempfile::TempDir, name: &str, yaml: &str) -> Output {
    let path = dir.path().join(name);
    std::fs::write(&path, yaml).expect("temp file written");
    Command::new(env!("CARGO_BIN_EXE_tessera"))
        .arg("validate")
        .arg(&path)
        .output()
        .expect("the tessera binary runs")
}

fn yaml_blocks(markdown: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in markdown.lines() {
        match (&mut current, line.trim_end()) {
            (None, "```yaml") => current = Some(String::new()),
            (Some(block), "```") => {
                blocks.push(std::mem::take(block));
                current = None;
            }
            (Some(block), text) => {
                block.push_str(text);
                block.push('\n');
            }
            (None, _) => {}
        }
    }
    blocks
}

#[test]
fn every_yaml_example_passes_validation() {
    let dir = tempfile::tempdir().unwrap();
    let blocks = yaml_blocks(&cookbook());
    assert!(
        blocks.len() >= 10,
        "found only {} YAML examples",
        blocks.len()
    );
    for (i, block) in blocks.iter().enumerate() {
        let out = validate(&dir, &format!("example-{i}.yaml"), block);
        assert_eq!(
            out.status.code(),
            Some(0),
            "example {i}:\n{block}\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn every_mistake_in_the_table_gets_its_finding() {
    let dir = tempfile::tempdir().unwrap();
    let cookbook = cookbook();
    let rows: Vec<(&str, &str)> = cookbook
        .lines()
        .filter_map(|line| {
            let cells: Vec<&str> = line.split(" | ").collect();
            let selector = cells.first()?.strip_prefix("| `")?.strip_suffix('`')?;
            let finding = cells.get(1)?.trim_end_matches(" |").trim();
            Some((selector, finding))
        })
        .collect();
    assert!(rows.len() >= 5, "found only {} table rows", rows.len());
    for (i, (selector, finding)) in rows.iter().enumerate() {
        let yaml = format!(
            "apiVersion: resource.k8s.io/v1\nkind: DeviceClass\nmetadata:\n  name: mistake\nspec:\n  selectors:\n  - cel:\n      expression: {selector:?}\n"
        );
        let out = validate(&dir, &format!("mistake-{i}.yaml"), &yaml);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(1), "{selector}: {stdout}");
        assert!(
            stdout.contains(finding.trim_matches('`')),
            "{selector}: expected {finding:?} in {stdout}"
        );
    }
}
