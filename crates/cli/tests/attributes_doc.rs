//! docs/attributes.md carries the schema tables `tessera schema --format markdown` prints; they
//! must stay identical, so that users read what the node plugin publishes.

use std::path::Path;
use std::process::Command;

#[test]
fn docs_attributes_tables_equal_the_schema() {
    let doc_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/attributes.md");
    let doc = std::fs::read_to_string(&doc_path).expect("docs/attributes.md is readable");
    let begin = doc
        .find("<!-- schema:begin")
        .expect("docs/attributes.md has a <!-- schema:begin --> marker");
    let body_start = begin + doc[begin..].find('\n').expect("marker line ends") + 1;
    let end = doc
        .find("<!-- schema:end -->")
        .expect("docs/attributes.md has a <!-- schema:end --> marker");
    let in_doc = &doc[body_start..end];

    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["schema", "--format", "markdown"])
        .output()
        .expect("tessera runs");
    assert!(out.status.success(), "tessera schema failed: {out:?}");
    let generated = String::from_utf8(out.stdout).expect("utf-8");
    assert_eq!(
        in_doc, generated,
        "docs/attributes.md is out of step with the schema: replace the text between its schema \
         markers with the output of `cargo run -q --bin tessera -- schema --format markdown`"
    );
}
