//! `cargo xtask`: the few commands that need special flags.
//!
//! - `cargo xtask sim [ARGS...]`: build `weir-sim` for the deterministic simulator
//!   (`RUSTFLAGS="--cfg madsim"`, in `target/madsim` so the normal build is never
//!   invalidated) and run it; ARGS go to `weir-sim` (`--seed N`, `--scenario FILE`,
//!   `--check-determinism`, `--duration-ms MS`).
//! - `cargo xtask experiment NAME [--seed N] [--json FILE] [--quick] [--plots DIR]`:
//!   one of the published deployments' comparisons (`cargo xtask experiment list`
//!   names them) on the simulator: a table, SVG plots (default
//!   `target/experiments/NAME`), and with `--json` the measured figures.
//! - `cargo xtask bench rdma`: RDMA's messenger on the simulated fabric against the
//!   raw path: message rate and latency at 64 B, 4 KiB and 128 KiB
//!   (`transport-sim/benches/rdma.rs`).
//! - `cargo xtask bench fabric`: the fabric engine's speed (events per second,
//!   simulated time per wall time) on the 2:1 and 60:1 scenarios.
//! - `cargo xtask bench nbd`: fio through the nbd engine against weir (1 and 3
//!   replicas) and qemu-nbd (`node/examples/bench_nbd.rs`).
//! - `cargo xtask bench snapshots`: fio with 0 and 10 snapshots of the volume,
//!   and the time each `weir snapshot create` took
//!   (`node/examples/bench_snapshots.rs`).
//! - `cargo xtask bench memory`: a node's RSS as 6 GiB are written with 4 KiB
//!   random writes and rewritten (`node/examples/bench_memory.rs`).
//! - `cargo xtask campaign --seeds A..B [--jobs N] [ARGS...]`: the fault campaign's
//!   seeds A to B (`A..=B` takes B too), each in a `weir-sim --campaign` process of
//!   its own, `--jobs` at a time (default: one per core); ARGS go to every run (a
//!   `--bug NAME` to see which seeds catch it). Prints each failing seed's failed
//!   checkers and replay command, then a summary line; fails if any seed failed.
//! - `cargo xtask test`: first the tools of the real-client tests (installed with
//!   apt-get when missing and run as root; else it stops with the command to run),
//!   then every check: formatting, clippy on both builds, the normal
//!   `cargo test --workspace`, and the madsim build of the workspace's tests (device
//!   model, fabric, seeded scenarios, a determinism check and the seed sweep), then
//!   every experiment in its quick form (twice, comparing the JSON byte for
//!   byte), then 100 campaign seeds derived from the commit id: the same for a commit, new
//!   for the next, so every commit widens the campaign's reach.

mod campaign;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

const MADSIM_TARGET_DIR: &str = "target/madsim";
/// Crates of real sockets, files and processes: never built for the simulator.
const REAL_IO_ONLY: [&str; 4] = [
    "weir",
    "weir-transport-tcp",
    "weir-nvme-uring",
    "weir-nvme-spdk",
];

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let root = workspace_root();
    let result = match args.first().map(String::as_str) {
        Some("sim") => sim(&root, &args[1..]),
        Some("test") => test(&root),
        Some("test-rdma") => test_rdma(&root),
        Some("bench") => bench(&root, &args[1..]),
        Some("experiment") => experiment(&root, &args[1..]),
        Some("campaign") => campaign::run_cli(&root, &args[1..]),
        Some("fuzz") => fuzz(&root, &args[1..], true),
        _ => {
            eprintln!("usage: cargo xtask sim [--seed N] [--scenario FILE] [--check-determinism]");
            eprintln!("       cargo xtask campaign --seeds A..B [--jobs N] [weir-sim args]");
            eprintln!("       cargo xtask experiment list|NAME [--seed N] [--json FILE] [--quick]");
            eprintln!("       cargo xtask test");
            eprintln!("       cargo xtask test-rdma");
            eprintln!("       cargo xtask bench fabric|rdma|nbd|memory|device|snapshots");
            eprintln!("       cargo xtask fuzz [--cases N] [--seed S]");
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
    let start = std::time::Instant::now();
    let status = cmd.status().map_err(|e| format!("{step} ({e})"))?;
    // Where a run's time goes, for keeping CI within its budget.
    eprintln!(
        "xtask: {step}: {} in {:.0} s",
        if status.success() { "done" } else { "FAILED" },
        start.elapsed().as_secs_f64()
    );
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

/// `cargo xtask experiment ...`: weir-sim's `--experiment`, built for the
/// simulator.
fn experiment(root: &Path, args: &[String]) -> Result<(), String> {
    let Some(name) = args.first() else {
        return Err("experiment: say which one (`cargo xtask experiment list` names them)".into());
    };
    let mut cmd = cargo(root, true, &["run", "--quiet", "-p", "weir-sim", "--"]);
    cmd.arg("--experiment").arg(name).args(&args[1..]);
    let status = cmd.status().map_err(|e| format!("weir-sim ({e})"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("experiment {name}"))
    }
}

/// Every experiment in its quick form, twice with the same seed: each must run
/// to its end with its checkers passing, and both runs must write the same JSON.
fn quick_experiments(root: &Path) -> Result<(), String> {
    let bin = root.join(MADSIM_TARGET_DIR).join("debug/weir-sim");
    let list = Command::new(&bin)
        .args(["--experiment", "list"])
        .output()
        .map_err(|e| format!("weir-sim --experiment list ({e})"))?;
    let list = String::from_utf8_lossy(&list.stdout).to_string();
    let names: Vec<&str> = list
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    if names.is_empty() {
        return Err("weir-sim --experiment list (named no experiment)".into());
    }
    let dir = root.join("target/experiments/quick");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{} ({e})", dir.display()))?;
    for name in names {
        let mut jsons = Vec::new();
        for run_no in 0..2 {
            let json = dir.join(format!("{name}-{run_no}.json"));
            let mut cmd = Command::new(&bin);
            cmd.args(["--experiment", name, "--quick", "--json"])
                .arg(&json)
                .arg("--plots")
                .arg(dir.join(name));
            run(
                &format!("experiment {name} --quick (run {})", run_no + 1),
                cmd,
            )?;
            jsons.push(std::fs::read(&json).map_err(|e| format!("{} ({e})", json.display()))?);
        }
        if jsons[0] != jsons[1] {
            return Err(format!(
                "experiment {name} --quick: two runs of one seed wrote different JSON"
            ));
        }
    }
    Ok(())
}

/// Benchmarks, in release mode, one core.
fn bench(root: &Path, args: &[String]) -> Result<(), String> {
    match args.first().map(String::as_str) {
        Some("fabric") => sim_bench(root, "fabric", "fabric benchmark"),
        Some("rdma") => sim_bench(root, "rdma", "RDMA messenger benchmark (simulated fabric)"),
        Some("engine") => run(
            "engine benchmark (CPU time per operation of weir's sans-IO engine)",
            cargo(
                root,
                false,
                &["run", "--release", "-p", "weir-core", "--example", "bench_engine"],
            ),
        ),
        Some("nbd") => release_example(
            root,
            "bench_nbd",
            "NBD benchmark (fio: weir 1 replica, qemu-nbd, weir 3 replicas)",
        ),
        Some("memory") => release_example(
            root,
            "bench_memory",
            "memory benchmark (a node's RSS as 6 GiB are written and rewritten)",
        ),
        Some("snapshots") => release_example(
            root,
            "bench_snapshots",
            "snapshot benchmark (fio with 0 and 10 snapshots, snapshot create times)",
        ),
        Some("device") => release_example(
            root,
            "bench_device",
            "device benchmark (weir's io_uring device vs fio's io_uring engine, each poll mode)",
        ),
        _ => Err(
            "bench: say which one (available: engine, fabric, rdma, nbd, memory, device, snapshots)".into(),
        ),
    }
}

/// Every decoder and parser fed mutated and random input (`weir`'s example
/// `fuzz`; `args` are its own: `--cases N`, `--seed S`), in release mode
/// unless `release` is false (the short form in `cargo xtask test`).
fn fuzz(root: &Path, args: &[String], release: bool) -> Result<(), String> {
    let mut cargo_args = vec!["run", "-p", "weir", "--example", "fuzz"];
    if release {
        cargo_args.insert(1, "--release");
    }
    cargo_args.push("--");
    cargo_args.extend(args.iter().map(String::as_str));
    run(
        "fuzz (every decoder and parser)",
        cargo(root, false, &cargo_args),
    )
}

/// Run weir-transport-sim's bench target `name` in release mode on one core.
fn sim_bench(root: &Path, name: &str, what: &str) -> Result<(), String> {
    let args = [
        "bench",
        "-j",
        "1",
        "-p",
        "weir-transport-sim",
        "--bench",
        name,
    ];
    run(what, cargo(root, false, &args))
}

/// Build the release `weir` binary, then run the `weir` crate's `example` in
/// release mode with `WEIR_BIN` pointing at it.
fn release_example(root: &Path, example: &str, what: &str) -> Result<(), String> {
    run(
        "build the release weir binary",
        cargo(
            root,
            false,
            &["build", "--release", "-p", "weir", "--bin", "weir"],
        ),
    )?;
    let mut cmd = cargo(
        root,
        false,
        &["run", "--release", "-p", "weir", "--example", example],
    );
    cmd.env("WEIR_BIN", root.join("target/release/weir"));
    run(what, cmd)
}

/// The tools the daemon's real-client tests drive, with the Debian package of each.
const TEST_TOOLS: [(&str, &str); 7] = [
    ("qemu-io", "qemu-utils"),
    ("nbdcopy", "libnbd-bin"),
    ("nbdfuse", "libnbd-bin"),
    ("fio", "fio"),
    ("mkfs.ext4", "e2fsprogs"),
    ("e2fsck", "e2fsprogs"),
    ("fusermount3", "fuse3"),
];

/// Files the build of the RDMA verbs layer needs (rdma-sys runs pkg-config
/// and bindgen over rdma-core's headers; its bindgen needs libclang 14), with
/// the Debian package of each.
const BUILD_FILES: [(&str, &str); 4] = [
    ("/usr/bin/pkg-config", "pkg-config"),
    ("/usr/include/infiniband/verbs.h", "libibverbs-dev"),
    ("/usr/include/rdma/rdma_cma.h", "librdmacm-dev"),
    ("/usr/lib/llvm-14/lib/libclang.so", "libclang-14-dev"),
];

/// Whether `tool` is an executable file in a directory of `path` (as `PATH`).
fn on_path(tool: &str, path: &std::ffi::OsStr) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::env::split_paths(path).any(|dir| {
        std::fs::metadata(dir.join(tool))
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    })
}

/// The Debian packages of the test tools missing from `path`, and of the
/// build's files missing, each once.
fn missing_packages(path: &std::ffi::OsStr) -> Vec<&'static str> {
    let mut pkgs: Vec<&str> = TEST_TOOLS
        .iter()
        .filter(|(tool, _)| !on_path(tool, path))
        .map(|&(_, pkg)| pkg)
        .chain(
            BUILD_FILES
                .iter()
                .filter(|(file, _)| !Path::new(file).exists())
                .map(|&(_, pkg)| pkg),
        )
        .collect();
    pkgs.dedup();
    pkgs
}

/// Make sure the real-client tests' tools are there before anything is built:
/// as root with apt-get, install the missing packages (`apt-get update` once,
/// then one install); otherwise stop at once with the command to run.
fn ensure_test_tools() -> Result<(), String> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let missing = missing_packages(&path);
    if missing.is_empty() {
        return Ok(());
    }
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    let command = format!("sudo apt-get install -y {}", missing.join(" "));
    if !root || !on_path("apt-get", &path) {
        eprintln!(
            "xtask: the daemon's real-client tests and the RDMA verbs build need the Debian packages {}; install them first:\n    {command}",
            missing.join(", ")
        );
        return Err("the test tools check".into());
    }
    eprintln!(
        "xtask: installing {} for the real-client tests and the verbs build",
        missing.join(" ")
    );
    let apt = |args: &[&str]| {
        let mut c = Command::new("apt-get");
        c.args(args).env("DEBIAN_FRONTEND", "noninteractive");
        c
    };
    run("apt-get update", apt(&["update", "-qq"]))?;
    let mut install = vec!["install", "-y", "-qq"];
    install.extend(&missing);
    run("apt-get install", apt(&install))?;
    let still = missing_packages(&path);
    if !still.is_empty() {
        eprintln!(
            "xtask: still missing after the install: {}",
            still.join(", ")
        );
        return Err("the test tools check".into());
    }
    Ok(())
}

/// The tests that need an RDMA device (`#[ignore = "requires an RDMA device"]`),
/// where the kernel lists one; elsewhere a clear refusal.
fn test_rdma(root: &Path) -> Result<(), String> {
    let listed = std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut d| d.next().is_some());
    if !listed {
        eprintln!(
            "xtask: /sys/class/infiniband lists no RDMA device, so the device tests cannot \
             run here (an RDMA NIC, or Soft-RoCE: rdma link add rxe0 type rxe netdev IFACE)"
        );
        return Err("the RDMA device check".into());
    }
    let args = [
        "test",
        "-p",
        "weir-transport-rdma",
        "--features",
        "verbs",
        "--",
        "--ignored",
    ];
    run("the RDMA device tests", cargo(root, false, &args))
}

/// weir's SPDK glue with the feature on: the build that links SPDK checks
/// where SPDK is not installed (it then cannot open a device, and says so),
/// and the glue's tests and lints run against the C stand-in of csrc/mock.
fn spdk_glue(root: &Path) -> Result<(), String> {
    let spdk = ["-p", "weir-nvme-spdk", "--features"];
    let with = |cmd: &'static str, feature: &'static str, rest: &[&'static str]| {
        let mut args = vec![cmd];
        args.extend(spdk);
        args.push(feature);
        args.extend(rest);
        args
    };
    run(
        "cargo check nvme-spdk --features spdk",
        cargo(root, false, &with("check", "spdk", &["--all-targets"])),
    )?;
    let lints = with(
        "clippy",
        "spdk-mock",
        &["--all-targets", "--", "-D", "warnings"],
    );
    run("clippy nvme-spdk (glue)", cargo(root, false, &lints))?;
    run(
        "the SPDK glue tests",
        cargo(root, false, &with("test", "spdk-mock", &[])),
    )
}

fn test(root: &Path) -> Result<(), String> {
    ensure_test_tools()?;
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
    let mut sim_clippy = vec!["clippy", "--workspace"];
    sim_clippy.extend(REAL_IO_ONLY.iter().flat_map(|p| ["--exclude", p]));
    sim_clippy.extend(["--all-targets", "--", "-D", "warnings"]);
    run("clippy (madsim build)", cargo(root, true, &sim_clippy))?;
    run(
        "cargo test --workspace",
        cargo(root, false, &["test", "--workspace"]),
    )?;
    spdk_glue(root)?;
    // The short form of `cargo xtask fuzz`, on the debug build just tested,
    // after the harness shows it catches what it looks for.
    fuzz(root, &["--self-test".into()], false)?;
    fuzz(root, &["--cases".into(), "5000".into()], false)?;
    let mut sim_tests = vec!["test", "--workspace", "--exclude", "xtask"];
    sim_tests.extend(REAL_IO_ONLY.iter().flat_map(|p| ["--exclude", p]));
    run(
        "cargo test --workspace (madsim build)",
        cargo(root, true, &sim_tests),
    )?;
    // One seed of the default scenario, and a faulty seed: campaign seed 19
    // crashes a voter that restarts past the replacement timeout (spares take
    // its replicas, a learner its vote), pauses another node and flaps links.
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
    quick_experiments(root)?;
    campaign::commit_seeds(root)?;
    eprintln!("xtask: all tests passed");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn missing_tools_name_their_packages_once_and_present_ones_none() {
        let dir = std::env::temp_dir().join(format!("xtask-tools-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.clone().into_os_string();
        assert_eq!(
            missing_packages(&path),
            ["qemu-utils", "libnbd-bin", "fio", "e2fsprogs", "fuse3"],
            "all missing, each package once"
        );
        for (tool, _) in TEST_TOOLS {
            let f = dir.join(tool);
            std::fs::write(&f, "#!/bin/sh\n").unwrap();
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        assert!(missing_packages(&path).is_empty());
        // A file that is not executable is not the tool.
        std::fs::set_permissions(dir.join("fio"), std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(missing_packages(&path), ["fio"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
