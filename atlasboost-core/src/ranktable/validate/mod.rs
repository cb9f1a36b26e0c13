//! The rank-table validator: every rule HCCL applies (SPEC §4), all violations at once.
//!
//! It works on the parsed JSON value rather than on the typed model, so a table with a number
//! where a string belongs is reported like any other problem, together with the rest.

use std::fmt;
use std::net::IpAddr;

use serde::Serialize;
use serde_json::Value;

use super::model::{Format, RankTable};
use super::node::{Node, Typed};
use crate::device::Chip;

mod cluster;
mod devices;
mod keys;
mod legacy;
mod ranks;
mod super_pods;
mod topology;

pub use keys::duplicate_keys;

/// The longest `server_id` HCCL accepts.
pub const MAX_SERVER_ID_LEN: usize = 64;

/// The most bytes HCCL takes in a `group_name`, `pod_name` or `super_pod_id`
/// (`GROUP_NAME_MAX_LEN`, checked as each enters its pool of unique values).
pub const MAX_NAME_LEN: usize = 127;

/// Whether HCCL refuses a table for it, or only warns (`reference/production.md` §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// HCCL refuses the table.
    Error,
    /// HCCL warns, or recommends otherwise, and loads the table.
    Warning,
}

/// One broken rule, where it is broken, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Violation {
    /// A JSON path to the offending value, e.g. `$.server_list[1].device[3].rank_id`.
    pub path: String,
    /// Which rule is broken.
    pub rule: Rule,
    /// Refused, or only warned about.
    pub severity: Severity,
    /// What is wrong, naming the values involved.
    pub message: String,
}

/// The most of a violation's path or message that is kept: a value of megabytes in a table
/// would otherwise be quoted whole, to the console and into `--json`.
const MESSAGE_LIMIT: usize = 1024;

/// `text`, cut to [`MESSAGE_LIMIT`] bytes (at a character's boundary) with a note of its size.
fn capped(mut text: String) -> String {
    if text.len() > MESSAGE_LIMIT {
        let total = text.len();
        let mut end = MESSAGE_LIMIT;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push_str(&format!("... ({total} bytes in all)"));
    }
    text
}

/// A string value as messages quote it: in Rust's debug form, at most 80 characters of it.
fn quoted(s: &str) -> String {
    match s.chars().count() {
        n if n > 80 => format!(
            "{:?}... ({n} characters)",
            s.chars().take(77).collect::<String>()
        ),
        _ => format!("{s:?}"),
    }
}

impl Violation {
    /// Builds an error: a rule HCCL enforces.
    pub fn new(path: String, rule: Rule, message: String) -> Self {
        Violation {
            path: capped(path),
            rule,
            severity: Severity::Error,
            message: capped(message),
        }
    }

    /// Builds a warning: what HCCL only recommends.
    pub fn warning(path: String, rule: Rule, message: String) -> Self {
        Violation {
            severity: Severity::Warning,
            ..Violation::new(path, rule, message)
        }
    }

    /// Whether HCCL refuses the table for it.
    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let warning = match self.severity {
            Severity::Error => "",
            Severity::Warning => "warning: ",
        };
        write!(
            f,
            "{}: {warning}{} [{}]",
            self.path,
            self.message,
            self.rule.as_str()
        )
    }
}

/// `Ok` with the warnings when no violation is an error; else [`crate::Error::Invalid`] with
/// all of them (errors and warnings), naming `origin`.
///
/// # Errors
///
/// [`crate::Error::Invalid`] as above.
pub fn errors_fail(
    violations: Vec<Violation>,
    origin: impl FnOnce() -> String,
) -> crate::error::Result<Vec<Violation>> {
    if violations.iter().any(Violation::is_error) {
        Err(crate::error::Error::Invalid {
            origin: origin(),
            violations,
        })
    } else {
        Ok(violations)
    }
}

/// The rules a rank table must follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum Rule {
    /// The file is not JSON at all (`validate` only: every other reader refuses it outright).
    NotJson,
    /// The document's shape: an object, an array or a key where the format wants one.
    Structure,
    /// A required key is missing.
    Missing,
    /// A scalar is not a JSON string (HCCL rejects numbers, booleans and null).
    NotString,
    /// A numeric string is not a decimal number.
    NotDecimal,
    /// `version` is not one HCCL's concise parser reads.
    Version,
    /// `status` is not `completed`.
    Status,
    /// A count (`server_count`, `group_count`, `instance_count`, `device_count`) disagrees with its list.
    Count,
    /// `rank_id`s are not exactly `0..N-1`.
    RankIds,
    /// A `server_id` appears twice.
    DuplicateServerId,
    /// A device appears twice on one server.
    DuplicateDevice,
    /// A `device_ip` appears twice in the cluster.
    DuplicateDeviceIp,
    /// A value is not a valid IPv4 or IPv6 address.
    InvalidIp,
    /// Servers use different IP families.
    MixedIpFamilies,
    /// `device_ip` is missing although the table has more than one server.
    MissingDeviceIp,
    /// `server_id` is empty or longer than 64 characters.
    ServerId,
    /// Servers have different device counts.
    UnequalDeviceCounts,
    /// `device_id` is above what the chip has.
    DeviceIdRange,
    /// On 910, a server has a device count other than 1, 2, 4 or 8.
    DeviceCount,
    /// On 910, a 2- or 4-device server crosses the 0-3 / 4-7 groups.
    CrossesGroups,
    /// A port is not a number in 1..65535.
    Port,
    /// SuperPoD rules of version 1.2.
    SuperPod,
    /// A `pod_name` appears twice (legacy format).
    DuplicatePodName,
    /// A `group_name` appears twice (legacy format).
    DuplicateGroupName,
    /// A `group_name`, `pod_name` or `super_pod_id` is longer than HCCL takes.
    NameLength,
    /// Devices list different numbers of `device_ip` addresses.
    DeviceIpCount,
    /// `host_ip` is not IPv4.
    HostIp,
    /// A key is given twice in one object: only the last value is read (a warning).
    DuplicateKey,
}

impl Rule {
    /// The rule's kebab-case name, as shown in messages and in `validate --json`.
    pub fn as_str(self) -> &'static str {
        match self {
            Rule::NotJson => "not-json",
            Rule::Structure => "structure",
            Rule::Missing => "missing",
            Rule::NotString => "not-string",
            Rule::NotDecimal => "not-decimal",
            Rule::Version => "version",
            Rule::Status => "status",
            Rule::Count => "count",
            Rule::RankIds => "rank-ids",
            Rule::DuplicateServerId => "duplicate-server-id",
            Rule::DuplicateDevice => "duplicate-device",
            Rule::DuplicateDeviceIp => "duplicate-device-ip",
            Rule::InvalidIp => "invalid-ip",
            Rule::MixedIpFamilies => "mixed-ip-families",
            Rule::MissingDeviceIp => "missing-device-ip",
            Rule::ServerId => "server-id",
            Rule::UnequalDeviceCounts => "unequal-device-counts",
            Rule::DeviceIdRange => "device-id-range",
            Rule::DeviceCount => "device-count",
            Rule::CrossesGroups => "crosses-groups",
            Rule::Port => "port",
            Rule::SuperPod => "super-pod",
            Rule::DuplicatePodName => "duplicate-pod-name",
            Rule::DuplicateGroupName => "duplicate-group-name",
            Rule::NameLength => "name-length",
            Rule::DeviceIpCount => "device-ip-count",
            Rule::HostIp => "host-ip",
            Rule::DuplicateKey => "duplicate-key",
        }
    }
}

/// The chip whose rules apply to a table when the user names none: 910_93 for version 1.2
/// (only Atlas A3 reads it), 910 otherwise.
pub fn default_chip(value: &Value) -> Chip {
    match value.get("version").and_then(Value::as_str) {
        Some(v) if v == Format::V1_2.as_str() => Chip::Ascend910_93,
        _ => Chip::Ascend910,
    }
}

/// Validates a typed table (e.g. one the builder made) for `chip`.
pub fn validate_table(table: &RankTable, chip: Chip) -> Vec<Violation> {
    match table {
        RankTable::Cluster(t) => validate_node(Typed::Cluster(t), chip),
        RankTable::Legacy(t) => validate_node(Typed::Legacy(t), chip),
    }
}

/// Validates any JSON value as a rank table for `chip`; returns every violation (empty = valid).
pub fn validate_value(value: &Value, chip: Chip) -> Vec<Violation> {
    validate_node(value, chip)
}

fn validate_node<'a, N: Node<'a>>(top: N, chip: Chip) -> Vec<Violation> {
    let mut v = Validator {
        chip,
        out: Vec::new(),
    };
    if !top.is_object() {
        v.push(
            "$".into(),
            Rule::Structure,
            format!("a rank table is a JSON object, found {}", top.describe().0),
        );
    } else if top.get("version").is_some()
        || (top.get("server_list").is_some() && top.get("group_list").is_none())
    {
        // A table with a server_list and no version is a 1.x table that lacks it: said (the
        // version is required), and its other problems with it.
        v.cluster(top);
    } else if top.get("deploy_mode").is_some() {
        // HCCL reads a legacy table with deploy_mode by its lab parser (MindSpore r0.2's
        // format: explicit rank_id per instance, board_id, para_plane_*), with other rules.
        v.push(
            "$.deploy_mode".into(),
            Rule::Version,
            "a legacy table with \"deploy_mode\" is HCCL's lab format, which atlasboost does not \
             check (it checks the cloud legacy format, without deploy_mode, and 1.0/1.2)"
                .into(),
        );
    } else if top.get("group_list").is_some() {
        v.legacy(top);
    } else {
        v.push(
            "$".into(),
            Rule::Missing,
            "neither \"version\" (formats 1.0, 1.2) nor \"group_list\" (legacy format) is present"
                .into(),
        );
    }
    v.out
}

/// The elements of an array node, with their indices.
fn items<'a, N: Node<'a>>(list: N) -> impl Iterator<Item = (usize, N)> {
    (0..list.len().unwrap_or(0)).filter_map(move |i| list.at(i).map(|n| (i, n)))
}

/// Where a device is in the document. Paths are only formatted for violations, which keeps
/// validating a 32,768-rank table fast.
#[derive(Debug, Clone, Copy)]
enum Loc {
    Cluster {
        server: usize,
        device: usize,
    },
    Legacy {
        group: usize,
        instance: usize,
        device: usize,
    },
}

impl Loc {
    fn path(self) -> String {
        match self {
            Loc::Cluster { server, device } => format!("$.server_list[{server}].device[{device}]"),
            Loc::Legacy {
                group,
                instance,
                device,
            } => format!("$.group_list[{group}].instance_list[{instance}].devices[{device}]"),
        }
    }

    fn key(self, key: &str) -> String {
        format!("{}.{key}", self.path())
    }
}

/// The first address seen, and the first address of the other family: each with where it is.
#[derive(Default)]
struct Families {
    first: Option<(String, IpAddr)>,
    other: Option<(String, IpAddr)>,
}

impl Families {
    fn note(&mut self, ip: IpAddr, path: impl FnOnce() -> String) {
        match &self.first {
            None => self.first = Some((path(), ip)),
            Some((_, f)) if f.is_ipv6() != ip.is_ipv6() && self.other.is_none() => {
                self.other = Some((path(), ip));
            }
            Some(_) => {}
        }
    }
}

/// A device as seen on one server: its physical id and where it is.
struct SeenDevice {
    id: Option<u32>,
    loc: Loc,
}

struct Validator {
    chip: Chip,
    out: Vec<Violation>,
}

impl Validator {
    fn push(&mut self, path: String, rule: Rule, message: String) {
        self.out.push(Violation::new(path, rule, message));
    }

    fn warn(&mut self, path: String, rule: Rule, message: String) {
        self.out.push(Violation::warning(path, rule, message));
    }

    /// Reports `name` (a `group_name`, `pod_name` or `super_pod_id` at `path`) if it is longer
    /// than HCCL takes.
    fn name_length(&mut self, name: &str, path: impl FnOnce() -> String) {
        if name.len() > MAX_NAME_LEN {
            self.push(
                path(),
                Rule::NameLength,
                format!(
                    "has {} bytes; HCCL takes at most {MAX_NAME_LEN}",
                    name.len()
                ),
            );
        }
    }

    /// A string field: reports a missing key (if required) or a non-string value.
    fn string<'a, N: Node<'a>>(
        &mut self,
        obj: N,
        key: &str,
        path: &dyn Fn() -> String,
        required: bool,
    ) -> Option<&'a str> {
        match obj.get(key) {
            Some(node) => self.scalar(node, || format!("{}.{key}", path())),
            None if required => {
                self.push(
                    path(),
                    Rule::Missing,
                    format!("required key \"{key}\" is missing"),
                );
                None
            }
            None => None,
        }
    }

    /// A value that must be a string; reports it at `path` if it is not.
    fn scalar<'a, N: Node<'a>>(
        &mut self,
        node: N,
        path: impl FnOnce() -> String,
    ) -> Option<&'a str> {
        let s = node.as_str();
        if s.is_none() {
            let (kind, text) = node.describe();
            let found = match (kind, text.as_str()) {
                ("number", _) => format!("number {text} (write \"{text}\")"),
                // `null` says itself.
                (kind, text) if kind == text => kind.to_string(),
                _ => format!("{kind} {text}"),
            };
            self.push(
                path(),
                Rule::NotString,
                format!("must be a JSON string, found {found}"),
            );
        }
        s
    }

    /// A decimal-number string field.
    fn decimal<'a, N: Node<'a>>(
        &mut self,
        obj: N,
        key: &str,
        path: &dyn Fn() -> String,
        required: bool,
    ) -> Option<u32> {
        let s = self.string(obj, key, path, required)?;
        let n = parse_decimal(s);
        if n.is_none() {
            let digits = !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
            self.push(
                format!("{}.{key}", path()),
                Rule::NotDecimal,
                match digits {
                    true => format!("{} is too large (at most {})", quoted(s), u32::MAX),
                    false => format!("{} is not a decimal number", quoted(s)),
                },
            );
        }
        n
    }

    /// A required, non-empty array.
    fn array<'a, N: Node<'a>>(
        &mut self,
        obj: N,
        key: &str,
        path: &dyn Fn() -> String,
    ) -> Option<N> {
        let Some(node) = obj.get(key) else {
            self.push(
                path(),
                Rule::Missing,
                format!("required key \"{key}\" is missing"),
            );
            return None;
        };
        match node.len() {
            Some(0) => {
                self.push(
                    format!("{}.{key}", path()),
                    Rule::Structure,
                    "must not be empty".into(),
                );
                None
            }
            Some(_) => Some(node),
            None => {
                self.push(
                    format!("{}.{key}", path()),
                    Rule::Structure,
                    format!("must be an array, found {}", node.describe().0),
                );
                None
            }
        }
    }

    fn object<'a, N: Node<'a>>(&mut self, node: N, path: &dyn Fn() -> String) -> Option<N> {
        if node.is_object() {
            Some(node)
        } else {
            self.push(
                path(),
                Rule::Structure,
                format!("must be an object, found {}", node.describe().0),
            );
            None
        }
    }
}

/// Parses a plain decimal number (digits only, as HCCL's `SalStrToULong` wants).
fn parse_decimal(s: &str) -> Option<u32> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}
