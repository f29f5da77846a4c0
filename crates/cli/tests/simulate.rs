//! `tessera simulate` run as a binary: determinism for a seed, the scenario file format, and the
//! default scenario's verdict (topology-aware ahead of first fit).

use std::process::{Command, Output};

use serde_json::Value;

fn tessera(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(args)
        .output()
        .expect("the tessera binary runs")
}

fn simulate_json(args: &[&str]) -> Value {
    let mut all = vec!["simulate", "-o", "json"];
    all.extend_from_slice(args);
    let out = tessera(&all);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON output")
}

const SMALL: &str = r#"
nodes:
  - topology: dgx-h100
    count: 4
    namePrefix: dgx
  - topology: pcie-l40s
    count: 4
trace:
  claims: 300
  sizes: {1: 40, 2: 25, 4: 20, 8: 15}
  lifetime: {min: 1, max: 40}
"#;

/// The metrics that do not depend on timing.
fn deterministic(m: &Value) -> Value {
    let mut m = m.clone();
    let o = m.as_object_mut().unwrap();
    assert!(o.remove("p50LatencyMicros").unwrap().is_u64());
    assert!(o.remove("p99LatencyMicros").unwrap().is_u64());
    m
}

#[test]
fn a_seed_gives_the_same_placements_every_time() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("small.yaml");
    std::fs::write(&path, SMALL).unwrap();
    let path = path.to_str().unwrap();
    let a = simulate_json(&["--scenario", path, "--seed", "42"]);
    let b = simulate_json(&["--scenario", path, "--seed", "42"]);
    for mode in ["firstFit", "topologyAware"] {
        let keys: Vec<&String> = a[mode].as_object().unwrap().keys().collect();
        assert_eq!(
            keys,
            [
                "allocated",
                "claims",
                "meanCommCost",
                "numaAlignedPercent",
                "nvlinkLocalPercent",
                "p50LatencyMicros",
                "p99LatencyMicros",
                "rejectedWhileFree"
            ]
        );
        assert_eq!(deterministic(&a[mode]), deterministic(&b[mode]), "{mode}");
        assert_eq!(a[mode]["claims"], 300);
    }
    let c = simulate_json(&["--scenario", path, "--seed", "43"]);
    assert_ne!(
        deterministic(&a["firstFit"]),
        deterministic(&c["firstFit"]),
        "another seed, another trace"
    );
}

#[test]
fn the_default_scenario_shows_topology_aware_ahead() {
    let report = simulate_json(&[]);
    let (ff, ta) = (&report["firstFit"], &report["topologyAware"]);
    assert_eq!(ff["claims"], 3000);
    let num = |m: &Value, k: &str| m[k].as_f64().unwrap();
    assert!(
        num(ta, "nvlinkLocalPercent") > num(ff, "nvlinkLocalPercent"),
        "{report}"
    );
    assert!(
        num(ta, "rejectedWhileFree") < num(ff, "rejectedWhileFree"),
        "{report}"
    );
    assert!(
        num(ta, "meanCommCost") < num(ff, "meanCommCost"),
        "{report}"
    );
    assert!(num(ta, "allocated") >= num(ff, "allocated"), "{report}");
}

#[test]
fn a_bad_scenario_names_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.yaml");
    std::fs::write(
        &path,
        SMALL.replace("count: 4\n    namePrefix", "cuont: 4\n    namePrefix"),
    )
    .unwrap();
    let out = tessera(&["simulate", "--scenario", path.to_str().unwrap()]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("unknown field `cuont`"), "{stderr}");
}

#[test]
fn help_says_which_metrics_are_deterministic() {
    let out = tessera(&["simulate", "--help"]);
    // clap wraps the text to the terminal width; compare it as one line.
    let help = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    assert!(
        help.contains("All metrics except the two latencies are deterministic"),
        "{help}"
    );
    assert!(
        help.contains(
            "rejectedWhileFree (claims rejected although the cluster had at least as many free GPUs"
        ),
        "{help}"
    );
}
