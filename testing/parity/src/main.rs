//! `tessera-parity`: see the crate docs and tests/parity/README.md.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use clap::{Parser, Subcommand};
use tessera_parity::canary::Canary;
use tessera_parity::compare::{Difference, compare};
use tessera_parity::generate::{DEVIATIONS, Generator, Switches};
use tessera_parity::instance::{Instance, Verdict, VerdictKind};
use tessera_parity::judge::{Coverage, Judgement, ParityFailure, judge, upstream_timed_out};
use tessera_parity::oracle::Oracle;
use tessera_parity::ours;
use tessera_parity::reference::{self, selectors::SelectorTable};

#[derive(Parser)]
#[command(about = "Tessera's first-fit allocator against upstream's, and benchmarks of both")]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate instances, decide each with Tessera, upstream and the reference allocator; fail
    /// on any difference between Tessera and upstream that no enabled deviation explains, on
    /// any difference between the reference and upstream, on an upstream timeout of an
    /// instance not generated as adversarial, on Tessera differing from the reference where
    /// upstream timed out, and on coverage below its least.
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
        /// Failing instances printed in full.
        #[arg(long, default_value_t = 10)]
        show: usize,
        /// Plant two faults into Tessera's verdicts (one device swapped, one outcome flipped):
        /// the run must fail on exactly those instances (scripts/test-all checks it does).
        #[arg(long)]
        canary: bool,
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
    /// selectors, time to fail adversarial claims; the same work on both sides, both warm;
    /// interleaved rounds, the median of each side with its range and the load average. Use a
    /// release build.
    Bench {
        #[arg(long, env = "TESSERA_PARITY_ORACLE")]
        oracle: PathBuf,
        /// Interleaved rounds per benchmark (at least 5).
        #[arg(long, default_value_t = 5)]
        rounds: usize,
        /// Write parity-bench.json and parity-bench.md here.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Run only this group (repeatable): scheduler-perf, dgx-h100, cel, adversarial.
        #[arg(long)]
        only: Vec<String>,
    },
    /// Decide instances from JSON files with Tessera, upstream and the reference allocator and
    /// print the verdicts and their differences.
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
            canary,
        } => diff(DiffArgs {
            oracle,
            count,
            seed,
            deviations,
            dump,
            show,
            canary,
        }),
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

/// What `diff` is asked to do.
struct DiffArgs {
    oracle: PathBuf,
    count: u64,
    seed: u64,
    deviations: Vec<String>,
    dump: Option<PathBuf>,
    show: usize,
    canary: bool,
}

/// Running totals of a `diff` run.
#[derive(Default)]
struct Tally {
    judged: u64,
    failed: u64,
    agreed: u64,
    past_timeout: u64,
    explained: BTreeMap<&'static str, u64>,
    failures: BTreeMap<String, u64>,
    refused: BTreeMap<String, u64>,
    coverage: Coverage,
    outcomes: BTreeMap<String, u64>,
}

fn diff(args: DiffArgs) -> anyhow::Result<()> {
    let (switches, enabled) = switches(&args.deviations)?;
    if let Some(dir) = &args.dump {
        std::fs::create_dir_all(dir)?;
    }
    let mut oracle = Oracle::start(&args.oracle)?;
    let mut generator = Generator::new(args.seed, switches);
    let mut tally = Tally::default();
    let mut canary = args.canary.then(Canary::default);
    let start = Instant::now();
    // Instances beyond the reference's reach are refused (drawn again), a few at most.
    let refusals_allowed = 5 + args.count / 100;
    while tally.judged < args.count {
        let instance = generator.instance();
        let table = SelectorTable::upstream(&mut oracle, &instance)?;
        let options = reference::Options::for_instance(&instance);
        let reference = match reference::decide(&instance, &table, options) {
            Ok(decision) => decision.verdict,
            Err(beyond) => {
                *tally.refused.entry(beyond.0).or_default() += 1;
                let refused: u64 = tally.refused.values().sum();
                anyhow::ensure!(
                    refused <= refusals_allowed,
                    "the reference could not decide {refused} generated instances (at most \
                     {refusals_allowed} are refused): {:?}",
                    tally.refused
                );
                continue;
            }
        };
        tally.judged += 1;
        let upstream = oracle.allocate(&instance)?;
        let mut mine = ours::run(&instance)?;
        if let Some(what) = canary.as_mut().and_then(|c| c.plant(&instance, &mut mine)) {
            println!("canary: planted {what} in {}", instance.name);
        }
        let judgement = judge(
            &instance,
            &mine,
            &upstream,
            &reference,
            &enabled,
            &mut |i| oracle.allocate(i),
        )?;
        let decided = if upstream_timed_out(&upstream) {
            &reference
        } else {
            &upstream
        };
        tally.coverage.record(
            &instance,
            decided,
            judgement == Judgement::DecidedPastUpstreamTimeout,
        );
        *tally.outcomes.entry(coverage_key(decided)).or_default() += 1;
        match judgement {
            Judgement::Agrees => tally.agreed += 1,
            Judgement::DecidedPastUpstreamTimeout => tally.past_timeout += 1,
            Judgement::Explained(d) => *tally.explained.entry(d).or_default() += 1,
            Judgement::Fails(failures) => {
                tally.failed += 1;
                for (f, _) in &failures {
                    *tally.failures.entry(f.to_string()).or_default() += 1;
                }
                if tally.failed <= args.show as u64 {
                    report(&instance, &mine, &upstream, &reference, &failures);
                }
                if let Some(dir) = &args.dump {
                    dump(dir, &instance, &mine, &upstream, &reference, &failures)?;
                }
            }
        }
    }
    conclude(&args, &enabled, &tally, start)
}

/// Prints the run's totals; fails the run on a failing instance or a coverage shortfall.
fn conclude(
    args: &DiffArgs,
    enabled: &[&'static str],
    tally: &Tally,
    start: Instant,
) -> anyhow::Result<()> {
    println!(
        "{} instances (seed {}, deviations: {}) in {:.1} s",
        args.count,
        args.seed,
        if enabled.is_empty() {
            "none".into()
        } else {
            enabled.join(", ")
        },
        start.elapsed().as_secs_f64()
    );
    let shortfalls = tally
        .coverage
        .shortfalls(args.count, enabled.contains(&"adversarial"));
    print_tally(tally, &shortfalls);
    if tally.failed > 0 {
        anyhow::bail!(
            "{} of {} instances fail the parity job",
            tally.failed,
            args.count
        );
    }
    if !shortfalls.is_empty() {
        anyhow::bail!(
            "the generated instances no longer cover every outcome and feature often enough: \
             {shortfalls:?}"
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

/// The run's totals: refusals, judgements, outcomes, coverage against its least.
fn print_tally(tally: &Tally, shortfalls: &[(&str, u64, u64)]) {
    let refused: u64 = tally.refused.values().sum();
    println!("refused as beyond the reference's reach (drawn again): {refused}");
    for (reason, n) in &tally.refused {
        println!("  {n:>6}  {reason}");
    }
    println!("decided outcomes (upstream's; the reference's where upstream timed out):");
    for (k, n) in &tally.outcomes {
        println!("  {n:>6}  {k}");
    }
    println!("coverage (instances reaching each outcome and feature):");
    for (k, n) in &tally.coverage.counts {
        println!("  {n:>6}  {k}");
    }
    for (k, reached, least) in shortfalls {
        println!("  BELOW THE LEAST: {k}: {reached} of at least {least}");
    }
    println!(
        "agree (Tessera, upstream and the reference): {}",
        tally.agreed
    );
    println!(
        "upstream timed out, Tessera equals the reference (adversarial): {}",
        tally.past_timeout
    );
    for (d, n) in &tally.explained {
        println!("explained by deviation {d}: {n}");
    }
    for (f, n) in &tally.failures {
        println!("FAIL {f}: {n}");
    }
    println!("failing instances: {}", tally.failed);
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

fn report(
    instance: &Instance,
    mine: &Verdict,
    upstream: &Verdict,
    reference: &Verdict,
    failures: &[(ParityFailure, Vec<Difference>)],
) {
    println!("--- {}", instance.name);
    for (failure, differences) in failures {
        println!("  {failure}:");
        for d in differences {
            println!("    {d}");
        }
    }
    for (side, v) in [
        ("upstream", upstream),
        ("ours", mine),
        ("reference", reference),
    ] {
        if let Some(m) = &v.message {
            println!("  {side} says: {}", m.lines().next().unwrap_or_default());
        }
    }
}

fn dump(
    dir: &std::path::Path,
    instance: &Instance,
    mine: &Verdict,
    upstream: &Verdict,
    reference: &Verdict,
    failures: &[(ParityFailure, Vec<Difference>)],
) -> anyhow::Result<()> {
    let file = dir.join(format!("{}.json", instance.name));
    let failures: Vec<serde_json::Value> = failures
        .iter()
        .map(|(f, d)| {
            serde_json::json!({"failure": f.to_string(),
                "differences": d.iter().map(ToString::to_string).collect::<Vec<_>>()})
        })
        .collect();
    let doc = serde_json::json!({"instance": instance, "ours": mine, "upstream": upstream,
        "reference": reference, "failures": failures});
    std::fs::write(&file, serde_json::to_vec_pretty(&doc)?)?;
    Ok(())
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
        let table = SelectorTable::upstream(&mut oracle, &instance)?;
        let options = reference::Options::for_instance(&instance);
        println!("=== {}", file.display());
        println!("upstream: {}", serde_json::to_string_pretty(&upstream)?);
        println!("ours: {}", serde_json::to_string_pretty(&mine)?);
        match reference::decide(&instance, &table, options) {
            Ok(d) => {
                println!("reference: {}", serde_json::to_string_pretty(&d.verdict)?);
                for diff in compare(&d.verdict, &upstream) {
                    println!("DIFF {}", diff.between("reference", "upstream"));
                }
            }
            Err(beyond) => println!("reference: {beyond}"),
        }
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
