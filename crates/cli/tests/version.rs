//! `tessera version` and `--version`: what build this is, the same facts the servers export as
//! `tessera_build_info`; and `$NODE_NAME` read as the downward API's convention.

use std::process::Command;

fn tessera(args: &[&str], env: &[(&str, &str)]) -> (String, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_tessera"));
    command
        .args(args)
        .env_remove("NODE_NAME")
        .env_remove("TESSERA_NODE_NAME");
    for (k, v) in env {
        command.env(k, v);
    }
    let out = command.output().expect("the tessera binary runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[test]
fn version_names_release_commit_compiler_and_target() {
    let (text, _) = tessera(&["version"], &[]);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], format!("tessera {}", env!("CARGO_PKG_VERSION")));
    assert!(
        lines[1].starts_with("commit: ") && lines[1].len() > "commit: ".len(),
        "{text}"
    );
    assert!(lines[2].starts_with("compiler: rustc "), "{text}");
    assert!(lines[3].starts_with("target: "), "{text}");

    let (json, _) = tessera(&["version", "-o", "json"], &[]);
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(json["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(
        format!("commit: {}", json["gitCommit"].as_str().unwrap()),
        lines[1]
    );

    let (long, _) = tessera(&["--version"], &[]);
    assert!(
        long.contains(lines[1]),
        "--version lacks the commit: {long}"
    );
}

#[test]
fn the_node_name_comes_from_the_flag_the_prefixed_variable_or_node_name() {
    let pool = |args: &[&str], env: &[(&str, &str)]| {
        let mut all = vec!["inventory", "--topology", "pcie-l40s", "-o", "json"];
        all.extend_from_slice(args);
        let (out, _) = tessera(&all, env);
        let slices: serde_json::Value = serde_json::from_str(&out).unwrap();
        slices[0]["spec"]["nodeName"].as_str().unwrap().to_owned()
    };
    assert_eq!(
        pool(&[], &[("NODE_NAME", "from-downward-api")]),
        "from-downward-api"
    );
    assert_eq!(
        pool(&[], &[("NODE_NAME", "old"), ("TESSERA_NODE_NAME", "new")]),
        "new"
    );
    assert_eq!(
        pool(&["--node-name", "flag"], &[("NODE_NAME", "old")]),
        "flag"
    );
}
