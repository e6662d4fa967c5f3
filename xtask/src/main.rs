//! `cargo xtask`: the few commands that need special flags.
//!
//! - `cargo xtask sim [ARGS...]`: build `weir-sim` for the deterministic simulator
//!   (`RUSTFLAGS="--cfg madsim"`, in `target/madsim` so the normal build is never
//!   invalidated) and run it; ARGS go to `weir-sim` (`--seed N`, `--scenario FILE`,
//!   `--check-determinism`, `--duration-ms MS`).
//! - `cargo xtask bench fabric`: the fabric engine's speed (events per second,
//!   simulated time per wall time) on the 2:1 and 60:1 scenarios.
//! - `cargo xtask test`: every check: formatting, clippy on both builds, the normal
//!   `cargo test --workspace`, and the madsim build of the workspace's tests (device
//!   model, fabric, seeded scenarios, a determinism check and the seed sweep).

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

const MADSIM_TARGET_DIR: &str = "target/madsim";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let root = workspace_root();
    let result = match args.first().map(String::as_str) {
        Some("sim") => sim(&root, &args[1..]),
        Some("test") => test(&root),
        Some("bench") => bench(&root, &args[1..]),
        _ => {
            eprintln!("usage: cargo xtask sim [--seed N] [--scenario FILE] [--check-determinism]");
            eprintln!("       cargo xtask test");
            eprintln!("       cargo xtask bench fabric");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(step) => {
            eprintln!("xtask: {step} failed");
            ExitCode::FAILURE
        }
    }
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

/// A cargo command; `madsim` selects the simulator build and its target dir.
fn cargo(root: &Path, madsim: bool, args: &[&str]) -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(root).args(args);
    if madsim {
        cmd.env("RUSTFLAGS", "--cfg madsim")
            .env("CARGO_TARGET_DIR", root.join(MADSIM_TARGET_DIR));
    } else {
        cmd.env_remove("RUSTFLAGS");
    }
    cmd
}

fn run(step: &str, mut cmd: Command) -> Result<(), String> {
    eprintln!("xtask: {step}");
    let status = cmd.status().map_err(|e| format!("{step} ({e})"))?;
    if status.success() {
        Ok(())
    } else {
        Err(step.to_string())
    }
}

fn sim(root: &Path, args: &[String]) -> Result<(), String> {
    let mut cmd = cargo(root, true, &["run", "--quiet", "-p", "weir-sim", "--"]);
    cmd.args(args);
    // The report is the output: pass the simulator's exit status through.
    let status = cmd.status().map_err(|e| format!("weir-sim ({e})"))?;
    if status.success() {
        Ok(())
    } else {
        Err("weir-sim (a checker failed or the run could not start)".into())
    }
}

/// Benchmarks, in release mode, one core.
fn bench(root: &Path, args: &[String]) -> Result<(), String> {
    match args.first().map(String::as_str) {
        Some("fabric") => run(
            "fabric benchmark",
            cargo(
                root,
                false,
                &[
                    "bench",
                    "-j",
                    "1",
                    "-p",
                    "weir-transport-sim",
                    "--bench",
                    "fabric",
                ],
            ),
        ),
        _ => Err("bench: say which one (available: fabric)".into()),
    }
}

fn test(root: &Path) -> Result<(), String> {
    run(
        "cargo fmt --check",
        cargo(root, false, &["fmt", "--all", "--check"]),
    )?;
    let clippy = [
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ];
    run("clippy", cargo(root, false, &clippy))?;
    run("clippy (madsim build)", cargo(root, true, &clippy))?;
    run(
        "cargo test --workspace",
        cargo(root, false, &["test", "--workspace"]),
    )?;
    let sim_tests = ["test", "--workspace", "--exclude", "xtask"];
    run(
        "cargo test --workspace (madsim build)",
        cargo(root, true, &sim_tests),
    )?;
    // One seed of the default scenario, and a faulty seed: campaign seed 19
    // crashes the Raft leader, pauses another node and flaps a link.
    for sim_args in [
        &["--seed", "1", "--duration-ms", "50"][..],
        &["--campaign", "--seed", "19"][..],
    ] {
        let mut args = vec!["run", "--quiet", "-p", "weir-sim", "--"];
        args.extend_from_slice(sim_args);
        args.push("--check-determinism");
        let what = format!("weir-sim {}", args[5..].join(" "));
        run(&what, cargo(root, true, &args))?;
    }
    eprintln!("xtask: all tests passed");
    Ok(())
}
