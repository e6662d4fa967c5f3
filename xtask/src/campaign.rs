//! `cargo xtask campaign`: many campaign seeds, each in a `weir-sim` process of
//! its own (a process per run gives every run's memory back), a few at a time.

use super::{cargo, run, MADSIM_TARGET_DIR};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Seeds the test command draws from the commit id.
const COMMIT_SEEDS: u64 = 100;
/// Commit-derived seeds start past every fixed seed the tests and the README name.
const COMMIT_SEED_BASE: u64 = 10_000;
/// ... and stay below this, so a replay command stays short.
const COMMIT_SEED_SPAN: u64 = 1_000_000_000;

/// `cargo xtask campaign --seeds A..B [--jobs N] [ARGS...]`.
pub(crate) fn run_cli(root: &Path, args: &[String]) -> Result<(), String> {
    let mut seeds = None;
    let mut jobs = None;
    let mut rest = Vec::new();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--seeds" => seeds = Some(parse_seeds(it.next().map(String::as_str))?),
            "--jobs" | "-j" => {
                let n = it.next().and_then(|n| n.parse::<usize>().ok());
                jobs = Some(n.filter(|&n| n > 0).ok_or("--jobs takes a count above 0")?);
            }
            "--campaign" | "--faults" | "--scenario" | "--seed" | "--check-determinism" => {
                return Err(format!(
                    "campaign: {arg} is not for the campaign (it sets its own)"
                ));
            }
            _ => rest.push(arg.clone()),
        }
    }
    let (first, last) = seeds.ok_or("campaign: say which seeds, --seeds A..B (or A..=B)")?;
    sweep(root, first, last, jobs, &rest)
}

/// `A..B` (B not included, as in Rust) or `A..=B`: the first and last seed.
fn parse_seeds(text: Option<&str>) -> Result<(u64, u64), String> {
    let bad = || "--seeds takes a range: A..B or A..=B".to_string();
    let text = text.ok_or_else(bad)?;
    let (a, b, inclusive) = match text.split_once("..=") {
        Some((a, b)) => (a, b, true),
        None => {
            let (a, b) = text.split_once("..").ok_or_else(bad)?;
            (a, b, false)
        }
    };
    let a: u64 = a.trim().parse().map_err(|_| bad())?;
    let b: u64 = b.trim().parse().map_err(|_| bad())?;
    let last = if inclusive { Some(b) } else { b.checked_sub(1) };
    match last {
        Some(last) if last >= a => Ok((a, last)),
        _ => Err(format!("--seeds {text} holds no seed")),
    }
}

/// The seeds of this commit: [`COMMIT_SEEDS`] from a point its id picks.
pub(crate) fn commit_seeds(root: &Path) -> Result<(), String> {
    let head = Command::new("git")
        .current_dir(root)
        .args(["rev-parse", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    let Some(head) = head else {
        eprintln!("xtask: not a git checkout: no commit-derived campaign seeds");
        return Ok(());
    };
    let first = seed_of_commit(&head)
        .ok_or_else(|| format!("git rev-parse HEAD gave {head:?}, not a commit id"))?;
    eprintln!(
        "xtask: campaign seeds of commit {}: {first}..={}",
        &head[..12],
        first + COMMIT_SEEDS - 1
    );
    sweep(root, first, first + COMMIT_SEEDS - 1, None, &[])
}

/// The first seed of a commit: its id's leading 60 bits, folded into the span.
fn seed_of_commit(id: &str) -> Option<u64> {
    let hex = id.get(..15)?;
    let bits = u64::from_str_radix(hex, 16).ok()?;
    Some(COMMIT_SEED_BASE + bits % COMMIT_SEED_SPAN)
}

/// One seed's result: its failed checker lines (empty when it passed).
struct SeedResult {
    seed: u64,
    failed: Option<Vec<String>>,
}

/// Run seeds `first..=last`, `jobs` at a time, and print what failed.
fn sweep(
    root: &Path,
    first: u64,
    last: u64,
    jobs: Option<usize>,
    args: &[String],
) -> Result<(), String> {
    run(
        "build weir-sim (madsim)",
        cargo(root, true, &["build", "--quiet", "-p", "weir-sim"]),
    )?;
    let bin = root.join(MADSIM_TARGET_DIR).join("debug/weir-sim");
    let jobs = jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from))
        .min((last - first + 1) as usize);
    let next = AtomicU64::new(first);
    let results = Mutex::new(Vec::new());
    let start = std::time::Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..jobs {
            scope.spawn(|| loop {
                let seed = next.fetch_add(1, Ordering::Relaxed);
                if seed > last {
                    break;
                }
                let result = run_seed(&bin, seed, args);
                if let Some(lines) = &result.failed {
                    // Printed as they come, so a long sweep shows its failures early.
                    eprintln!(
                        "campaign seed {seed} FAILED:\n{}\n  replay: cargo xtask sim --campaign --seed {seed}{}",
                        lines.join("\n"),
                        args.iter().map(|a| format!(" {a}")).collect::<String>()
                    );
                }
                results.lock().expect("results").push(result);
            });
        }
    });
    let mut results = results.into_inner().expect("results");
    results.sort_by_key(|r| r.seed);
    let failed: Vec<u64> = results
        .iter()
        .filter(|r| r.failed.is_some())
        .map(|r| r.seed)
        .collect();
    let passed = results.len() - failed.len();
    eprintln!("campaign seeds {first}..={last}:");
    eprintln!(
        "campaign: {passed} passed, {} failed, in {:.0} s on {jobs} jobs",
        failed.len(),
        start.elapsed().as_secs_f64()
    );
    if failed.is_empty() {
        return Ok(());
    }
    let list: Vec<String> = failed.iter().map(u64::to_string).collect();
    eprintln!("failing seeds: {}", list.join(" "));
    Err(format!(
        "campaign ({} of {} seeds)",
        failed.len(),
        results.len()
    ))
}

fn run_seed(bin: &Path, seed: u64, args: &[String]) -> SeedResult {
    let out = Command::new(bin)
        .args(["--campaign", "--seed", &seed.to_string()])
        .args(args)
        .output();
    let failed = match out {
        Err(e) => Some(vec![format!("  weir-sim did not start: {e}")]),
        Ok(out) => {
            let report = String::from_utf8_lossy(&out.stdout);
            if out.status.success() && report.contains("verdict PASS") {
                None
            } else {
                let mut lines: Vec<String> = report
                    .lines()
                    .filter(|l| {
                        // A failed checker, or client operations that failed.
                        let l = l.trim();
                        l.contains(" FAIL ")
                            || (l.starts_with("throughput") && !l.ends_with("errors 0)"))
                    })
                    .map(|l| format!("  {}", l.trim()))
                    .collect();
                if lines.is_empty() {
                    // No report: the run panicked or was killed; its last words.
                    let err = String::from_utf8_lossy(&out.stderr);
                    let tail: Vec<&str> = err.lines().rev().take(5).collect();
                    lines.push(format!("  weir-sim exited with {}", out.status));
                    lines.extend(tail.into_iter().rev().map(|l| format!("  {l}")));
                }
                Some(lines)
            }
        }
    };
    SeedResult { seed, failed }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_ranges_parse_as_in_rust() {
        assert_eq!(parse_seeds(Some("1..1001")), Ok((1, 1000)));
        assert_eq!(parse_seeds(Some("9073..=9073")), Ok((9073, 9073)));
        assert!(parse_seeds(Some("5..5")).is_err());
        assert!(parse_seeds(Some("0..0")).is_err());
        assert!(parse_seeds(Some("7..=3")).is_err());
        assert!(parse_seeds(Some("1-100")).is_err());
        assert!(parse_seeds(None).is_err());
    }

    #[test]
    fn a_commit_picks_its_seeds_and_the_next_commit_others() {
        let a = seed_of_commit("771b31e5c0ffee00000000000000000000000000").unwrap();
        let b = seed_of_commit("d15bc86aa0ffee00000000000000000000000000").unwrap();
        assert_eq!(
            a,
            seed_of_commit("771b31e5c0ffee00000000000000000000000000").unwrap()
        );
        assert_ne!(a, b);
        for s in [a, b] {
            assert!((COMMIT_SEED_BASE..COMMIT_SEED_BASE + COMMIT_SEED_SPAN).contains(&s));
        }
        assert_eq!(seed_of_commit("not hex at all, not at all"), None);
        assert_eq!(seed_of_commit("abc"), None);
    }
}
