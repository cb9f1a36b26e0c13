//! Fixture-driven tests of the rank-table validator (SPEC §4, `reference/ascend.md` §1).
//!
//! Fixtures live in `atlasboost-core/tests/fixtures/`:
//!
//! - `valid/*.json`: tables a real HCCL accepts. Each must give no violation, parse with
//!   [`RankTable::parse`], and survive `to_json_pretty` → `parse` unchanged.
//! - `invalid/*.json`: tables HCCL (or the 910 topology rules) rejects. Next to each
//!   `NAME.json` is `NAME.expect`, the exact violations, one per line as `<rule> <path>`
//!   (`rule` is [`Rule::as_str`], `path` the JSON path), or `warning <rule> <path>` for a
//!   warning. Order does not matter; the lists are compared as multisets. Blank lines and lines
//!   starting with `#` are ignored.
//! - `warning/*.json`: tables HCCL loads but warns about, or where it only recommends
//!   otherwise (`reference/production.md` §3): with a `.expect` file of warnings only; they
//!   parse, and `validate` exits 0 for them (1 with `--strict`).
//!
//! Path conventions in the `.expect` files: a bad value is reported at its own path
//! (`$.server_list[1].device[3].rank_id`); a missing key at the object that lacks it
//! (`$.server_list[0]`, the message names the key); a fact about a whole server at its device
//! list (`$.server_list[0].device`, legacy `$.group_list[0].instance_list[0].devices`); a fact
//! about the whole table that no single value carries (a `rank_id` nobody has, a server in no
//! super pod) at the list concerned (`$.server_list`, `$.super_pod_list`).
//!
//! The chip a fixture is checked against is its file-name prefix up to `--`:
//! `910b--unequal-device-counts.json` is checked as `910b`, `910_93--v1.2-....json` as `910_93`.
//! A name without `--` is checked as `910`.
//!
//! The `.expect` files were written from the rules, not from the validator's output. Where the
//! validator disagrees with the rules, the fixture's name is in [`KNOWN_VALIDATOR_BUGS`]: its
//! mismatch is printed but tolerated, and the test fails once the validator is fixed so the
//! entry gets removed.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::fs;
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use atlasboost_core::Chip;
use atlasboost_core::Error;
use atlasboost_core::ranktable::{RankTable, Rule, Severity, Violation, validate_value};

/// Fixtures (file stems, valid or invalid) on which the validator currently disagrees with the
/// rules. Each is tolerated until the validator is fixed; see the notes for what is wrong.
const KNOWN_VALIDATOR_BUGS: &[&str] = &[];

/// Every rule SPEC §4 (and the brief's rule list: formats 1.2 and legacy, ports) requires a
/// fixture for.
const REQUIRED_RULES: &[Rule] = &[
    Rule::Structure,
    Rule::Missing,
    Rule::NotString,
    Rule::NotDecimal,
    Rule::Version,
    Rule::Status,
    Rule::Count,
    Rule::RankIds,
    Rule::DuplicateServerId,
    Rule::DuplicateDevice,
    Rule::DuplicateDeviceIp,
    Rule::InvalidIp,
    Rule::MixedIpFamilies,
    Rule::MissingDeviceIp,
    Rule::ServerId,
    Rule::UnequalDeviceCounts,
    Rule::DeviceIdRange,
    Rule::DeviceCount,
    Rule::CrossesGroups,
    Rule::Port,
    Rule::SuperPod,
    Rule::DuplicatePodName,
    Rule::DuplicateGroupName,
    Rule::NameLength,
    Rule::DeviceIpCount,
    Rule::HostIp,
];

/// The minimum number of fixtures of each kind, so a lost directory cannot pass vacuously.
const MIN_VALID: usize = 10;
const MIN_INVALID: usize = 35;
const MIN_WARNING: usize = 4;

fn fixture_dir(kind: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("fixtures")
        .join(kind)
}

/// One fixture table: its name (file stem), path, chip and text.
struct Fixture {
    name: String,
    path: PathBuf,
    chip: Chip,
    text: String,
}

fn chip_of(name: &str) -> Chip {
    match name.split_once("--") {
        Some((prefix, _)) => prefix
            .parse()
            .unwrap_or_else(|e| panic!("fixture {name}: bad chip prefix {prefix:?}: {e}")),
        None => Chip::Ascend910,
    }
}

fn fixtures(kind: &str) -> Vec<Fixture> {
    let dir = fixture_dir(kind);
    let mut out: Vec<Fixture> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
        .map(|path| {
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            let text = fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
            Fixture {
                chip: chip_of(&name),
                name,
                path,
                text,
            }
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

fn value_of(fixture: &Fixture) -> serde_json::Value {
    serde_json::from_str(&fixture.text)
        .unwrap_or_else(|e| panic!("fixture {} is not JSON: {e}", fixture.name))
}

/// `(rule, path)` pairs, sorted, so two lists compare as multisets (a warning's rule is
/// `warning <rule>`).
fn pairs(violations: &[Violation]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = violations
        .iter()
        .map(|v| {
            let rule = match v.severity {
                Severity::Error => v.rule.as_str().to_string(),
                Severity::Warning => format!("warning {}", v.rule.as_str()),
            };
            (rule, v.path.clone())
        })
        .collect();
    out.sort();
    out
}

fn expected_pairs(fixture: &Fixture) -> Vec<(String, String)> {
    let path = fixture.path.with_extension("expect");
    let text = fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "invalid fixture {} has no readable {}: {e}",
            fixture.name,
            path.display()
        )
    });
    let mut out: Vec<(String, String)> = text
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(|line| {
            let (warning, line) = match line.strip_prefix("warning ") {
                Some(rest) => ("warning ", rest.trim()),
                None => ("", line),
            };
            let (rule, json_path) = line.split_once(' ').unwrap_or_else(|| {
                panic!(
                    "{}: line {line:?} is not `[warning] <rule> <path>`",
                    path.display()
                )
            });
            let json_path = json_path.trim();
            assert!(
                REQUIRED_RULES.iter().any(|r| r.as_str() == rule),
                "{}: unknown rule {rule:?}",
                path.display()
            );
            assert!(
                json_path.starts_with('$'),
                "{}: path {json_path:?} does not start with `$`",
                path.display()
            );
            (format!("{warning}{rule}"), json_path.to_string())
        })
        .collect();
    out.sort();
    out
}

fn show(violations: &[Violation]) -> String {
    let mut s = String::new();
    for v in violations {
        let _ = write!(s, "\n    {} {}    ({})", v.rule.as_str(), v.path, v.message);
    }
    if s.is_empty() {
        s.push_str("\n    (none)");
    }
    s
}

fn show_pairs(pairs: &[(String, String)]) -> String {
    pairs.iter().fold(String::new(), |mut s, (rule, path)| {
        let _ = write!(s, "\n    {rule} {path}");
        s
    })
}

/// Runs `f`, turning a panic into an error message (a panic on input is a bug in itself).
fn no_panic<T>(what: &str, f: impl FnOnce() -> T) -> Result<T, String> {
    panic::catch_unwind(AssertUnwindSafe(f)).map_err(|payload| {
        let msg = payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_string()))
            .unwrap_or_default();
        format!("{what} panicked: {msg}")
    })
}

/// Problems found in one fixture, or none.
fn check_valid(fixture: &Fixture) -> Vec<String> {
    let mut problems = Vec::new();
    let value = value_of(fixture);
    match no_panic("validate_value", || validate_value(&value, fixture.chip)) {
        Ok(violations) if violations.is_empty() => {}
        Ok(violations) => problems.push(format!(
            "expected no violation for chip {}, got:{}",
            fixture.chip,
            show(&violations)
        )),
        Err(e) => problems.push(e),
    }
    match no_panic("RankTable::parse", || {
        RankTable::parse(&fixture.text, &fixture.path, fixture.chip)
    }) {
        Ok(Ok(table)) => {
            let json = table.to_json_pretty();
            // Writing the table keeps every key and value of the fixture.
            let written: serde_json::Value = serde_json::from_str(&json).unwrap();
            if written != value {
                problems.push(format!("to_json_pretty lost or changed keys:\n{json}"));
            }
            match RankTable::parse(&json, &fixture.path, fixture.chip) {
                Ok(again) if again == table => {}
                Ok(again) => problems.push(format!(
                    "to_json_pretty re-parsed differs:\n  before: {table:?}\n  after:  {again:?}"
                )),
                Err(e) => {
                    problems.push(format!("to_json_pretty does not parse again: {e}\n{json}"))
                }
            }
        }
        Ok(Err(e)) => problems.push(format!("RankTable::parse failed: {e}")),
        Err(e) => problems.push(e),
    }
    problems
}

/// A table HCCL loads with warnings: exactly the expected warnings, and it parses.
fn check_warning(fixture: &Fixture) -> Vec<String> {
    let mut problems = Vec::new();
    let expected = expected_pairs(fixture);
    if expected.is_empty()
        || expected
            .iter()
            .any(|(rule, _)| !rule.starts_with("warning "))
    {
        problems.push("a warning fixture's .expect lists warnings, and only warnings".into());
    }
    let value = value_of(fixture);
    match no_panic("validate_value", || validate_value(&value, fixture.chip)) {
        Ok(violations) if pairs(&violations) == expected => {}
        Ok(violations) => problems.push(format!(
            "chip {}: expected (rule path):{}\n  actual:{}",
            fixture.chip,
            show_pairs(&expected),
            show(&violations)
        )),
        Err(e) => problems.push(e),
    }
    match no_panic("RankTable::parse", || {
        RankTable::parse(&fixture.text, &fixture.path, fixture.chip)
    }) {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => problems.push(format!(
            "RankTable::parse refused a table with only warnings: {e}"
        )),
        Err(e) => problems.push(e),
    }
    problems
}

fn check_invalid(fixture: &Fixture) -> Vec<String> {
    let mut problems = Vec::new();
    let expected = expected_pairs(fixture);
    let value = value_of(fixture);
    match no_panic("validate_value", || validate_value(&value, fixture.chip)) {
        Ok(violations) => {
            let actual = pairs(&violations);
            if actual != expected {
                problems.push(format!(
                    "chip {}: expected (rule path):{}\n  actual:{}",
                    fixture.chip,
                    show_pairs(&expected),
                    show(&violations)
                ));
            }
            for v in violations.iter().filter(|v| v.message.trim().is_empty()) {
                problems.push(format!("empty message for {} {}", v.rule.as_str(), v.path));
            }
        }
        Err(e) => problems.push(e),
    }
    match no_panic("RankTable::parse", || {
        RankTable::parse(&fixture.text, &fixture.path, fixture.chip)
    }) {
        Ok(Err(Error::Invalid { violations, .. })) if !violations.is_empty() => {}
        Ok(Err(e)) => problems.push(format!(
            "RankTable::parse: expected Error::Invalid, got {e:?}"
        )),
        Ok(Ok(table)) => problems.push(format!("RankTable::parse accepted the table: {table:?}")),
        Err(e) => problems.push(e),
    }
    problems
}

/// Checks every fixture of `kind`, tolerating [`KNOWN_VALIDATOR_BUGS`], and fails with a report.
fn run(kind: &str, min: usize, check: fn(&Fixture) -> Vec<String>) {
    let all = fixtures(kind);
    assert!(
        all.len() >= min,
        "{} holds {} fixtures, expected at least {min}",
        fixture_dir(kind).display(),
        all.len()
    );
    let mut failures = String::new();
    for fixture in &all {
        let problems = check(fixture);
        let known = KNOWN_VALIDATOR_BUGS.contains(&fixture.name.as_str());
        match (problems.is_empty(), known) {
            (true, false) => {}
            (false, true) => {
                eprintln!(
                    "tolerated (KNOWN_VALIDATOR_BUGS) {kind}/{}.json:\n  {}",
                    fixture.name,
                    problems.join("\n  ")
                );
            }
            (true, true) => {
                let _ = writeln!(
                    failures,
                    "{kind}/{}.json now passes: remove it from KNOWN_VALIDATOR_BUGS",
                    fixture.name
                );
            }
            (false, false) => {
                let _ = writeln!(
                    failures,
                    "{kind}/{}.json:\n  {}",
                    fixture.name,
                    problems.join("\n  ")
                );
            }
        }
    }
    assert!(
        failures.is_empty(),
        "rank-table fixtures failed:\n{failures}"
    );
}

#[test]
fn valid_fixtures_are_accepted_and_round_trip() {
    run("valid", MIN_VALID, check_valid);
}

#[test]
fn invalid_fixtures_report_exactly_the_expected_violations() {
    run("invalid", MIN_INVALID, check_invalid);
}

#[test]
fn warning_fixtures_load_with_exactly_the_expected_warnings() {
    run("warning", MIN_WARNING, check_warning);
}

#[test]
fn every_invalid_fixture_has_an_expect_file_and_no_expect_file_is_stray() {
    for dir in [fixture_dir("invalid"), fixture_dir("warning")] {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            match path.extension().and_then(|e| e.to_str()) {
                Some("json") => assert!(
                    path.with_extension("expect").is_file(),
                    "{} has no .expect file",
                    path.display()
                ),
                Some("expect") => assert!(
                    path.with_extension("json").is_file(),
                    "{} has no .json fixture",
                    path.display()
                ),
                _ => panic!("unexpected file {}", path.display()),
            }
        }
    }
}

#[test]
fn known_validator_bugs_name_existing_fixtures() {
    let names: BTreeSet<String> = fixtures("valid")
        .into_iter()
        .chain(fixtures("invalid"))
        .chain(fixtures("warning"))
        .map(|f| f.name)
        .collect();
    for name in KNOWN_VALIDATOR_BUGS {
        assert!(
            names.contains(*name),
            "KNOWN_VALIDATOR_BUGS names no fixture {name:?}"
        );
    }
}

#[test]
fn invalid_fixtures_cover_every_rule_of_the_spec() {
    let all = fixtures("invalid");
    assert!(
        all.len() >= MIN_INVALID,
        "too few invalid fixtures: {}",
        all.len()
    );
    let covered: BTreeSet<String> = all
        .iter()
        .flat_map(expected_pairs)
        .map(|(rule, _)| rule)
        .collect();
    let missing: Vec<&str> = REQUIRED_RULES
        .iter()
        .map(|r| r.as_str())
        .filter(|r| !covered.contains(*r))
        .collect();
    assert!(
        missing.is_empty(),
        "no invalid fixture expects rules {missing:?}"
    );
}

/// SPEC §4: unequal device counts per server are a fault "not on 910B": the very same table is
/// in both directories, checked as 910 (invalid) and as 910b (valid).
#[test]
fn unequal_device_counts_table_is_the_same_in_both_directories() {
    let invalid =
        fs::read_to_string(fixture_dir("invalid").join("unequal-device-counts.json")).unwrap();
    let valid =
        fs::read_to_string(fixture_dir("valid").join("910b--unequal-device-counts.json")).unwrap();
    assert_eq!(invalid, valid);
}

/// Acceptance criterion: a table with five different faults reports all five, each with its JSON
/// path.
#[test]
fn five_faults_are_all_reported_with_their_paths() {
    let fixture = fixtures("invalid")
        .into_iter()
        .find(|f| f.name == "five-faults")
        .expect("invalid/five-faults.json exists");
    let expected = expected_pairs(&fixture);
    let rules: BTreeSet<&str> = expected.iter().map(|(rule, _)| rule.as_str()).collect();
    assert_eq!(
        expected.len(),
        5,
        "five-faults.expect must list five faults"
    );
    assert_eq!(
        rules.len(),
        5,
        "the five faults must break five different rules"
    );
    if KNOWN_VALIDATOR_BUGS.contains(&"five-faults") {
        return;
    }
    let violations = validate_value(&value_of(&fixture), fixture.chip);
    assert_eq!(pairs(&violations), expected, "actual:{}", show(&violations));
    match RankTable::parse(&fixture.text, &fixture.path, fixture.chip) {
        Err(Error::Invalid { violations, .. }) => {
            assert_eq!(pairs(&violations), expected, "actual:{}", show(&violations));
        }
        other => panic!("expected Error::Invalid, got {other:?}"),
    }
}
