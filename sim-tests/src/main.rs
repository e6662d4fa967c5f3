//! `weir-sim`: run one scenario for one seed and print the report.
//!
//! Built under `--cfg madsim` by `cargo xtask sim`, which sets the flags.

use clap::Parser;
use std::path::PathBuf;
use std::process::ExitCode;

/// Run a weir scenario on the deterministic simulator and print its report.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Seed of the run; the same seed replays the same run exactly.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Scenario file (TOML); the embedded default when absent.
    #[arg(long)]
    scenario: Option<PathBuf>,
    /// Run the seed twice and fail unless both runs are identical.
    #[arg(long)]
    check_determinism: bool,
    /// Run the fault campaign's scenario for the seed (replays a campaign seed):
    /// node crashes, pauses and partitions, link faults, drawn from the seed. The
    /// report lists the faults injected, failovers and rebuilds, and the verdicts.
    #[arg(long, visible_alias = "faults", conflicts_with = "scenario")]
    campaign: bool,
    /// Override the scenario's simulated duration, in milliseconds.
    #[arg(long)]
    duration_ms: Option<u64>,
    /// Carry frames through RDMA's messenger wherever the fabric is RoCE's
    /// (`fabric.transport = "rdma"` for "roce"): with `--campaign`, the campaign
    /// over RDMA.
    #[arg(long)]
    rdma: bool,
    /// Write fabric telemetry (CSV series, SVG plots of queues and QP rates) here.
    #[arg(long)]
    telemetry: Option<PathBuf>,
    /// Telemetry sampling interval, microseconds.
    #[arg(long, default_value_t = 10)]
    sample_us: u64,
    /// Run an experiment (a matrix of variants, see `--experiment list`) instead
    /// of one scenario: prints its table, writes its plots.
    #[arg(long, conflicts_with_all = ["scenario", "campaign"])]
    experiment: Option<String>,
    /// The experiment's quick form: a few simulated milliseconds per variant.
    #[arg(long, requires = "experiment")]
    quick: bool,
    /// Write the experiment's results as JSON here.
    #[arg(long, requires = "experiment")]
    json: Option<PathBuf>,
    /// Write the experiment's SVG plots here (default:
    /// target/experiments/NAME).
    #[arg(long, requires = "experiment")]
    plots: Option<PathBuf>,
    /// Turn on a deliberate bug (repeatable), to see the checkers catch it:
    /// skip-last-replica, ack-before-slowest, serve-before-lease, rebuild-one-short,
    /// accept-stale-epoch, ignore-lease-margin.
    #[arg(long, value_enum)]
    bug: Vec<Bug>,
}

/// The deliberate bugs of `[bugs]`, by name.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum Bug {
    SkipLastReplica,
    AckBeforeSlowest,
    ServeBeforeLease,
    RebuildOneShort,
    AcceptStaleEpoch,
    IgnoreLeaseMargin,
    LeakIntoSnapshot,
    GiveUpAtOnce,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    if let Some(name) = &args.experiment {
        return experiment(&args, name);
    }
    let (text, name) = match &args.scenario {
        None => (
            weir_sim::scenario::DEFAULT_SCENARIO.to_string(),
            "default".to_string(),
        ),
        Some(path) => match std::fs::read_to_string(path) {
            Ok(text) => (text, path.display().to_string()),
            Err(e) => {
                eprintln!("error: cannot read scenario {}: {e}", path.display());
                return ExitCode::from(2);
            }
        },
    };
    let (mut scenario, name) = if args.campaign {
        (
            weir_sim::scenario::Scenario::campaign(args.seed),
            "campaign".to_string(),
        )
    } else {
        match weir_sim::scenario::Scenario::parse(&text, &name) {
            Ok(s) => (s, name),
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
        }
    };
    if let Some(ms) = args.duration_ms {
        scenario.workload.duration_ms = ms;
    }
    if args.rdma && scenario.fabric.transport == weir_sim::scenario::Transport::Roce {
        scenario.fabric.transport = weir_sim::scenario::Transport::Rdma;
    }
    for bug in &args.bug {
        match bug {
            Bug::SkipLastReplica => scenario.bugs.skip_last_replica = true,
            Bug::AckBeforeSlowest => scenario.bugs.ack_before_slowest = true,
            Bug::ServeBeforeLease => scenario.bugs.serve_before_lease = true,
            Bug::RebuildOneShort => scenario.bugs.rebuild_one_short = true,
            Bug::AcceptStaleEpoch => scenario.bugs.accept_stale_epoch = true,
            Bug::IgnoreLeaseMargin => scenario.bugs.ignore_lease_margin = true,
            Bug::LeakIntoSnapshot => scenario.bugs.leak_into_snapshot = true,
            Bug::GiveUpAtOnce => scenario.bugs.give_up_at_once = true,
        }
    }
    run(&args, &scenario, &name)
}

/// `--experiment NAME`: list them, or run one.
fn experiment(args: &Args, name: &str) -> ExitCode {
    use weir_sim::experiment::{find, setups::ALL};
    if name == "list" {
        for e in ALL {
            println!("{:<18} {}", e.name, e.about);
        }
        return ExitCode::SUCCESS;
    }
    let Some(e) = find(name) else {
        let names: Vec<&str> = ALL.iter().map(|e| e.name).collect();
        eprintln!(
            "error: no experiment {name:?}; there are: {}",
            names.join(", ")
        );
        return ExitCode::from(2);
    };
    run_experiment(args, &e)
}

#[cfg(madsim)]
fn run_experiment(args: &Args, e: &weir_sim::experiment::Experiment) -> ExitCode {
    let wall = std::time::Instant::now();
    let results = weir_sim::experiment::run(e, args.seed, args.quick, |m| {
        eprintln!(
            "  {} done: {:.0} IOPS (wall clock {:.1} s so far)",
            m.name,
            m.iops,
            wall.elapsed().as_secs_f64()
        );
    });
    print!("{}", results.table());
    let dir = args
        .plots
        .clone()
        .unwrap_or_else(|| PathBuf::from("target/experiments").join(e.name));
    match results.plot(&dir) {
        Ok(files) => eprintln!("plots: {}", files.join(", ")),
        Err(err) => {
            eprintln!("error: {err}");
            return ExitCode::FAILURE;
        }
    }
    if let Some(path) = &args.json {
        if let Err(err) = std::fs::write(path, results.json()) {
            eprintln!("error: cannot write {}: {err}", path.display());
            return ExitCode::FAILURE;
        }
        eprintln!("json: {}", path.display());
    }
    eprintln!("(wall clock {:.1} s)", wall.elapsed().as_secs_f64());
    if results.variants.iter().all(|m| m.checkers_passed) {
        ExitCode::SUCCESS
    } else {
        eprintln!("error: a variant's checkers failed (see the table)");
        ExitCode::FAILURE
    }
}

#[cfg(not(madsim))]
fn run_experiment(_: &Args, _: &weir_sim::experiment::Experiment) -> ExitCode {
    run_needs_madsim()
}

#[cfg(madsim)]
fn run(args: &Args, scenario: &weir_sim::scenario::Scenario, name: &str) -> ExitCode {
    let wall = std::time::Instant::now();
    let options = weir_sim::runner::RunOptions {
        telemetry_interval: args
            .telemetry
            .as_ref()
            .map(|_| std::time::Duration::from_micros(args.sample_us.max(1))),
    };
    let outcome = weir_sim::runner::run_with(args.seed, scenario, name, options);
    let text = outcome.report.to_string();
    print!("{text}");
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    if args.check_determinism {
        let again = weir_sim::runner::run(args.seed, scenario, name);
        if again.report.to_string() != text || again.history != outcome.history {
            eprintln!(
                "error: seed {} is not deterministic: two runs differ",
                args.seed
            );
            return ExitCode::FAILURE;
        }
        println!("  determinism  second run identical (report and full history)");
    }
    if let (Some(dir), Some(telemetry)) = (&args.telemetry, &outcome.telemetry) {
        match telemetry.write(dir) {
            Ok(files) => eprintln!("telemetry: {}", files.join(", ")),
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    eprintln!("(wall clock {:.1} s)", wall.elapsed().as_secs_f64());
    if outcome.report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

#[cfg(not(madsim))]
fn run(_: &Args, _: &weir_sim::scenario::Scenario, _: &str) -> ExitCode {
    run_needs_madsim()
}

#[cfg(not(madsim))]
fn run_needs_madsim() -> ExitCode {
    eprintln!(
        "error: weir-sim runs only on the deterministic simulator; \
         use `cargo xtask sim`, which builds it with RUSTFLAGS=\"--cfg madsim\""
    );
    ExitCode::from(2)
}
