//! `tessera-parity`: see the crate docs and tests/parity/README.md.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use clap::{Parser, Subcommand};
use tessera_parity::compare::{Difference, compare, without_upstream_timeouts};
use tessera_parity::generate::{DEVIATIONS, Generator, Switches};
use tessera_parity::instance::{Instance, Verdict, VerdictKind};
use tessera_parity::oracle::Oracle;
use tessera_parity::ours;

#[derive(Parser)]
#[command(about = "Tessera's first-fit allocator against upstream's, and benchmarks of both")]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate instances, decide each with both allocators, fail on any difference that no
    /// enabled deviation explains.
    Diff {
        /// The upstream allocator (tests/parity/build prints its path).
        #[arg(long, env = "TESSERA_PARITY_ORACLE")]
        oracle: PathBuf,
        /// Instances to generate.
        #[arg(long, default_value_t = 3000)]
        count: u64,
        /// Generator seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Let the generator exercise a documented deviation (repeatable): shared-non-multi,
        /// adversarial, or all.
        #[arg(long = "deviation")]
        deviations: Vec<String>,
        /// Write each unexplained instance (and both verdicts) here.
        #[arg(long)]
        dump: Option<PathBuf>,
        /// Unexplained differences printed in full.
        #[arg(long, default_value_t = 10)]
        show: usize,
    },
    /// Evaluate CEL selectors on devices with both environments and report every pair whose
    /// verdict (true, false, compile error, runtime error) differs. Input: a JSON file
    /// `{"expressions": [...], "devices": [{"driver": ..., "device": {...}}]}`; without one, the
    /// generator's selectors on the devices of generated instances.
    Cel {
        #[arg(long, env = "TESSERA_PARITY_ORACLE")]
        oracle: PathBuf,
        file: Option<PathBuf>,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Side-by-side benchmarks (docs/benchmarks.md): workloads on the node each claim fits, CEL
    /// selectors, time to fail adversarial claims; interleaved rounds, the fastest of each side.
    /// Use a release build.
    Bench {
        #[arg(long, env = "TESSERA_PARITY_ORACLE")]
        oracle: PathBuf,
        /// Interleaved rounds per benchmark.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// Write parity-bench.json and parity-bench.md here.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Run only this group (repeatable): scheduler-perf, dgx-h100, cel, adversarial.
        #[arg(long)]
        only: Vec<String>,
    },
    /// Decide instances from JSON files with both allocators and print both verdicts.
    Replay {
        #[arg(long, env = "TESSERA_PARITY_ORACLE")]
        oracle: PathBuf,
        files: Vec<PathBuf>,
    },
}

fn main() -> anyhow::Result<()> {
    match Args::parse().command {
        Command::Diff {
            oracle,
            count,
            seed,
            deviations,
            dump,
            show,
        } => diff(&oracle, count, seed, &deviations, dump, show),
        Command::Replay { oracle, files } => replay(&oracle, &files),
        Command::Bench {
            oracle,
            rounds,
            out,
            only,
        } => bench(&oracle, rounds, out, &only),
        Command::Cel { oracle, file, seed } => cel(&oracle, file, seed),
    }
}

fn diff(
    oracle: &std::path::Path,
    count: u64,
    seed: u64,
    deviations: &[String],
    dump: Option<PathBuf>,
    show: usize,
) -> anyhow::Result<()> {
    let (switches, enabled) = switches(deviations)?;
    if let Some(dir) = &dump {
        std::fs::create_dir_all(dir)?;
    }
    let mut oracle = Oracle::start(oracle)?;
    let mut generator = Generator::new(seed, switches);
    let mut coverage: BTreeMap<String, u64> = BTreeMap::new();
    let mut explained: BTreeMap<&str, u64> = BTreeMap::new();
    let mut unexplained = 0u64;
    let start = Instant::now();
    for _ in 0..count {
        let instance = generator.instance();
        let upstream = oracle.allocate(&instance)?;
        let mine = ours::run(&instance)?;
        *coverage.entry(coverage_key(&upstream)).or_default() += 1;
        let differences = compare(&mine, &upstream);
        if differences.is_empty() {
            continue;
        }
        if without_upstream_timeouts(&mine, &upstream)
            .is_some_and(|u| compare(&mine, &u).is_empty())
        {
            *explained.entry("upstream-timeout").or_default() += 1;
            continue;
        }
        if let Some(d) = explain(&mut oracle, &instance, &enabled)? {
            *explained.entry(d).or_default() += 1;
            continue;
        }
        unexplained += 1;
        if unexplained <= show as u64 {
            report(&instance, &mine, &upstream, &differences);
        }
        if let Some(dir) = &dump {
            let file = dir.join(format!("{}.json", instance.name));
            let doc = serde_json::json!({"instance": instance, "ours": mine, "upstream": upstream,
                "differences": differences.iter().map(ToString::to_string).collect::<Vec<_>>()});
            std::fs::write(&file, serde_json::to_vec_pretty(&doc)?)?;
        }
    }
    println!(
        "{count} instances (seed {seed}, deviations: {}) in {:.1} s",
        if enabled.is_empty() {
            "none".into()
        } else {
            enabled.join(", ")
        },
        start.elapsed().as_secs_f64()
    );
    print_counts(&coverage, &explained, unexplained);
    if unexplained > 0 {
        anyhow::bail!(
            "{unexplained} of {count} instances differ from upstream without a documented deviation"
        );
    }
    Ok(())
}

/// The switches `--deviation` names turn on (`all`: every one), and their names as listed.
fn switches(deviations: &[String]) -> anyhow::Result<(Switches, Vec<&'static str>)> {
    let mut switches = Switches::default();
    let mut enabled: Vec<&str> = Vec::new();
    for d in deviations {
        if d == "all" {
            switches = Switches::all();
            enabled = DEVIATIONS.to_vec();
        } else {
            switches.enable(d)?;
            enabled.push(DEVIATIONS.iter().find(|x| **x == d).copied().unwrap_or("?"));
        }
    }
    Ok((switches, enabled))
}

/// Upstream's outcomes by kind, then the differences each deviation explains and the rest.
fn print_counts(
    coverage: &BTreeMap<String, u64>,
    explained: &BTreeMap<&str, u64>,
    unexplained: u64,
) {
    println!("upstream outcomes:");
    for (k, n) in coverage {
        println!("  {n:>6}  {k}");
    }
    for (d, n) in explained {
        println!("differences explained by deviation {d}: {n}");
    }
    println!("unexplained differences: {unexplained}");
}

fn coverage_key(v: &Verdict) -> String {
    match (v.outcome, &v.error_class, &v.stage) {
        (VerdictKind::Error, Some(c), _) => format!("error: {c}"),
        (VerdictKind::Unsatisfiable, Some(c), _) => format!("unsatisfiable: {c}"),
        (VerdictKind::Unsatisfiable, None, _)
            if v.nodes
                .iter()
                .any(|n| n.error_class.as_deref() == Some("invalid-pools")) =>
        {
            "unsatisfiable: invalid pools on some node".into()
        }
        (k, _, _) => k.to_string(),
    }
}

/// The first enabled deviation whose removal makes the difference disappear.
fn explain(
    oracle: &mut Oracle,
    instance: &Instance,
    enabled: &[&'static str],
) -> anyhow::Result<Option<&'static str>> {
    for &d in enabled {
        let mut stripped = instance.clone();
        Switches::disable(d, &mut stripped);
        if stripped == *instance {
            continue;
        }
        let upstream = oracle.allocate(&stripped)?;
        let mine = ours::run(&stripped)?;
        if compare(&mine, &upstream).is_empty() {
            return Ok(Some(d));
        }
    }
    Ok(None)
}

fn report(instance: &Instance, mine: &Verdict, upstream: &Verdict, differences: &[Difference]) {
    println!("--- {}", instance.name);
    for d in differences {
        println!("  {d}");
    }
    if let Some(m) = &upstream.message {
        println!("  upstream says: {m}");
    }
    if let Some(m) = &mine.message {
        println!("  ours says: {}", m.lines().next().unwrap_or_default());
    }
}

fn bench(
    oracle: &std::path::Path,
    rounds: usize,
    out: Option<PathBuf>,
    only: &[String],
) -> anyhow::Result<()> {
    anyhow::ensure!(rounds > 0, "--rounds must be at least 1");
    let mut oracle = Oracle::start(oracle)?;
    let rows = tessera_parity::bench::all(&mut oracle, rounds, only)?;
    let md = tessera_parity::bench::markdown(&rows);
    print!("{md}");
    if let Some(dir) = out {
        std::fs::create_dir_all(&dir)?;
        std::fs::write(
            dir.join("parity-bench.json"),
            serde_json::to_vec_pretty(&rows)?,
        )?;
        std::fs::write(dir.join("parity-bench.md"), &md)?;
        println!("wrote {}", dir.join("parity-bench.{json,md}").display());
    }
    Ok(())
}

fn replay(oracle: &std::path::Path, files: &[PathBuf]) -> anyhow::Result<()> {
    let mut oracle = Oracle::start(oracle)?;
    for file in files {
        let text =
            std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
        let value: serde_json::Value = serde_json::from_str(&text)?;
        let instance: Instance =
            serde_json::from_value(value.get("instance").cloned().unwrap_or(value))
                .with_context(|| format!("decoding {}", file.display()))?;
        let upstream = oracle.allocate(&instance)?;
        let mine = ours::run(&instance)?;
        println!("=== {}", file.display());
        println!("upstream: {}", serde_json::to_string_pretty(&upstream)?);
        println!("ours: {}", serde_json::to_string_pretty(&mine)?);
        for d in compare(&mine, &upstream) {
            println!("DIFF {d}");
        }
    }
    Ok(())
}

fn cel(oracle: &std::path::Path, file: Option<PathBuf>, seed: u64) -> anyhow::Result<()> {
    use tessera_parity::cel::{self as c, CelDevice};
    #[derive(serde::Deserialize)]
    struct Input {
        expressions: Vec<String>,
        devices: Vec<CelDevice>,
    }
    let input = match file {
        Some(f) => serde_json::from_str::<Input>(&std::fs::read_to_string(&f)?)?,
        None => {
            let (expressions, devices) = tessera_parity::generate::cel_cases(seed);
            Input {
                expressions,
                devices,
            }
        }
    };
    let mut oracle = Oracle::start(oracle)?;
    let upstream = c::upstream(&mut oracle, &input.expressions, &input.devices)?;
    let ours = c::ours(&input.expressions, &input.devices);
    let diffs = c::differences(&input.expressions, &ours, &upstream);
    let mut grouped: BTreeMap<(String, String, String), (usize, String)> = BTreeMap::new();
    for (e, d, o, u) in &diffs {
        let entry = grouped
            .entry((e.clone(), o.result.clone(), u.result.clone()))
            .or_insert((
                0,
                format!(
                    "device {d}: ours {} / upstream {}",
                    o.message.as_deref().unwrap_or(&o.result),
                    u.message.as_deref().unwrap_or(&u.result)
                ),
            ));
        entry.0 += 1;
    }
    for ((e, o, u), (n, example)) in &grouped {
        println!("{e}\n  {n} devices: ours {o} / upstream {u}; e.g. {example}");
    }
    println!(
        "{} expressions x {} devices: {} differences",
        input.expressions.len(),
        input.devices.len(),
        diffs.len()
    );
    if !diffs.is_empty() {
        anyhow::bail!("CEL verdicts differ from upstream");
    }
    Ok(())
}
