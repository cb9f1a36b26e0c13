//! Settings resolved once, with no command-line types: where devices come from, and how
//! durations are read. `atlasboost-cli` resolves its flags into these at its edge; library
//! mode reads them from the environment ([`Discovery::from_env`]). Each setting remembers how
//! the user gave it ([`Origin`]), so that a message names the flag or the variable the user
//! actually set.

use std::path::PathBuf;
use std::time::Duration;

use atlasboost_core::{DeviceList, EnvVars};
use serde::{Deserialize, Serialize};

/// How the user gave the settings: flags of the `atlasboost` command, or `ATLASBOOST_*`
/// variables in library mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Origin {
    /// Flags (`--sim 8`).
    CommandLine,
    /// Variables (`ATLASBOOST_SIM=8`).
    Environment,
}

/// A setting, as messages name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setting {
    /// `--probe` / `ATLASBOOST_PROBE`.
    Probe,
    /// `--sim N` / `ATLASBOOST_SIM`.
    Sim,
    /// `--hccn-conf PATH` / `ATLASBOOST_HCCN_CONF`.
    HccnConf,
    /// `--server-id` / `ATLASBOOST_SERVER_ID`.
    ServerId,
}

impl Origin {
    /// How the user gives `setting` (`--sim N`, `ATLASBOOST_SIM`).
    #[must_use]
    pub fn name(self, setting: Setting) -> &'static str {
        match (self, setting) {
            (Origin::CommandLine, Setting::Probe) => "--probe",
            (Origin::CommandLine, Setting::Sim) => "--sim N",
            (Origin::CommandLine, Setting::HccnConf) => "--hccn-conf PATH",
            (Origin::CommandLine, Setting::ServerId) => "--server-id",
            (Origin::Environment, Setting::Probe) => EnvVars::ATLASBOOST_PROBE,
            (Origin::Environment, Setting::Sim) => EnvVars::ATLASBOOST_SIM,
            (Origin::Environment, Setting::HccnConf) => EnvVars::ATLASBOOST_HCCN_CONF,
            (Origin::Environment, Setting::ServerId) => EnvVars::ATLASBOOST_SERVER_ID,
        }
    }

    /// `setting` given `value`, as the user would write it (`--probe sim`, `ATLASBOOST_PROBE=sim`).
    #[must_use]
    pub fn assignment(self, setting: Setting, value: &str) -> String {
        let name = self.name(setting);
        match self {
            Origin::CommandLine => format!("{} {value}", name.split(' ').next().unwrap_or(name)),
            Origin::Environment => format!("{name}={value}"),
        }
    }

    /// "pass" a flag, "set" a variable.
    #[must_use]
    pub fn verb(self) -> &'static str {
        match self {
            Origin::CommandLine => "pass",
            Origin::Environment => "set",
        }
    }
}

/// Where devices come from (SPEC §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProbeKind {
    /// The driver if it loads, else /etc/hccn.conf; never simulated devices.
    Auto,
    /// The driver's DSMI library.
    Dsmi,
    /// /etc/hccn.conf.
    Hccn,
    /// Simulated devices (needs a number of them).
    Sim,
}

impl ProbeKind {
    /// Every kind.
    pub const ALL: [ProbeKind; 4] = [
        ProbeKind::Auto,
        ProbeKind::Dsmi,
        ProbeKind::Hccn,
        ProbeKind::Sim,
    ];

    /// The name `--probe` and `ATLASBOOST_PROBE` use.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            ProbeKind::Auto => "auto",
            ProbeKind::Dsmi => "dsmi",
            ProbeKind::Hccn => "hccn",
            ProbeKind::Sim => "sim",
        }
    }

    /// The kind named `name` (as [`ProbeKind::as_str`] spells it).
    #[must_use]
    pub fn from_name(name: &str) -> Option<ProbeKind> {
        ProbeKind::ALL.into_iter().find(|k| k.as_str() == name)
    }
}

/// How to find this host's devices.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Discovery {
    /// Where from.
    pub probe: ProbeKind,
    /// This many simulated devices (1-255).
    pub sim: Option<u32>,
    /// The chip simulated devices report (`910`, `910B3`, `910_9391`).
    pub sim_chip: String,
    /// Simulated devices with IPv6 addresses.
    pub sim_ipv6: bool,
    /// Only these physical devices.
    pub devices: Option<DeviceList>,
    /// The hccn.conf to read (else `ATLASBOOST_HCCN_CONF`, else `/etc/hccn.conf`).
    pub hccn_conf: Option<PathBuf>,
    /// How the user gave these, for messages.
    pub origin: Origin,
    /// Simulated devices' faults as a launcher read them, for its agents on other hosts, whose
    /// own environment has neither variable; `None`: this process's environment.
    #[serde(default)]
    pub sim_faults: Option<SimFaults>,
}

/// `ATLASBOOST_SIM_FAULTS` and `ATLASBOOST_SIM_FAULTS_FILE`, as read where they were set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimFaults {
    /// `ATLASBOOST_SIM_FAULTS`.
    pub spec: Option<String>,
    /// `ATLASBOOST_SIM_FAULTS_FILE`.
    pub file: Option<PathBuf>,
}

impl Discovery {
    /// What nothing set means: `auto` (the driver, else hccn.conf), every device, chip 910 for
    /// simulated ones; given by `origin`.
    #[must_use]
    pub fn defaults(origin: Origin) -> Discovery {
        Discovery {
            probe: ProbeKind::Auto,
            sim: None,
            sim_chip: "910".into(),
            sim_ipv6: false,
            devices: None,
            hccn_conf: None,
            origin,
            sim_faults: None,
        }
    }

    /// Whether simulated devices are asked for (`--sim N`, with `--probe sim` or `auto`; a real
    /// probe beside them is refused).
    #[must_use]
    pub fn simulated(&self) -> bool {
        self.sim.is_some() && matches!(self.probe, ProbeKind::Sim | ProbeKind::Auto)
    }

    /// For agents on other hosts: this process's simulated faults (its variables), when it
    /// simulates devices.
    #[must_use]
    pub fn with_sim_faults_of_env(mut self) -> Discovery {
        if self.simulated() {
            self.sim_faults = Some(SimFaults {
                spec: env(EnvVars::ATLASBOOST_SIM_FAULTS),
                // Absolute: another host's agent starts in another directory.
                file: std::env::var_os(EnvVars::ATLASBOOST_SIM_FAULTS_FILE)
                    .filter(|p| !p.is_empty())
                    .map(|p| std::path::absolute(&p).unwrap_or_else(|_| p.into())),
            });
        }
        self
    }

    /// Library mode's discovery: `ATLASBOOST_PROBE`, `ATLASBOOST_SIM` (and
    /// `ATLASBOOST_HCCN_CONF`, read when the probe needs it).
    ///
    /// # Errors
    ///
    /// A message naming the malformed variable and its value.
    pub fn from_env() -> Result<Discovery, String> {
        let probe = match env(EnvVars::ATLASBOOST_PROBE) {
            None => ProbeKind::Auto,
            Some(name) => ProbeKind::from_name(&name).ok_or_else(|| {
                format!(
                    "{}={name}: expected auto, dsmi, hccn or sim",
                    EnvVars::ATLASBOOST_PROBE
                )
            })?,
        };
        let sim = match env(EnvVars::ATLASBOOST_SIM) {
            None => None,
            Some(v) => match v.parse::<u32>() {
                Ok(n) if (1..=255).contains(&n) => Some(n),
                _ => {
                    return Err(format!(
                        "{}={v}: expected a number of simulated devices, 1 to 255",
                        EnvVars::ATLASBOOST_SIM
                    ));
                }
            },
        };
        Ok(Discovery {
            probe,
            sim,
            ..Discovery::defaults(Origin::Environment)
        })
    }
}

/// A variable's value in library mode; empty (or blank) counts as unset. A value that is not
/// UTF-8 is read with its bad bytes replaced (U+FFFD), so that it is refused by name where it
/// is parsed, not taken for unset.
pub(crate) fn env(name: &str) -> Option<String> {
    let value = std::env::var_os(name)?;
    Some(value.to_string_lossy().into_owned()).filter(|v| !v.trim().is_empty())
}

/// A path variable's value, as bytes (a path need not be UTF-8); empty (or blank) counts as
/// unset, as for [`env`].
pub(crate) fn env_path(name: &str) -> Option<std::path::PathBuf> {
    std::env::var_os(name)
        .filter(|v| !v.to_string_lossy().trim().is_empty())
        .map(std::path::PathBuf::from)
}

/// A number of seconds more than 0 (possibly fractional): `--rendezvous-timeout`,
/// `ATLASBOOST_RENDEZVOUS_TIMEOUT`.
///
/// # Errors
///
/// Why `s` is not one.
pub fn parse_seconds(s: &str) -> Result<Duration, String> {
    match parse_seconds_or_zero(s)? {
        d if d.is_zero() => Err("must be more than 0".into()),
        d => Ok(d),
    }
}

/// The most seconds any duration setting takes (1e300 would overflow a `Duration`).
const MAX_SECONDS: f64 = 1e9;

/// A number of seconds, possibly fractional; 0 is allowed (`--grace 0`).
///
/// # Errors
///
/// Why `s` is not one (1e300 would overflow a `Duration`).
pub fn parse_seconds_or_zero(s: &str) -> Result<Duration, String> {
    let secs: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if secs.is_nan() {
        return Err(format!("{s:?} is not a number of seconds"));
    }
    if secs < 0.0 {
        return Err(format!("{s} seconds is less than 0"));
    }
    if secs > MAX_SECONDS {
        return Err(format!(
            "{s} seconds is more than the most allowed, 1e9 (about 31 years)"
        ));
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_out_of_bounds_say_which_bound() {
        assert_eq!(
            parse_seconds_or_zero("-1").unwrap_err(),
            "-1 seconds is less than 0"
        );
        for s in ["1e10", "inf"] {
            assert_eq!(
                parse_seconds_or_zero(s).unwrap_err(),
                format!("{s} seconds is more than the most allowed, 1e9 (about 31 years)")
            );
        }
        assert_eq!(
            parse_seconds_or_zero("nan").unwrap_err(),
            "\"nan\" is not a number of seconds"
        );
        assert_eq!(
            parse_seconds_or_zero("1e9"),
            Ok(Duration::from_secs(1_000_000_000))
        );
    }

    #[test]
    fn messages_name_the_flag_or_the_variable() {
        assert_eq!(
            Origin::CommandLine.assignment(Setting::Probe, "sim"),
            "--probe sim"
        );
        assert_eq!(
            Origin::Environment.assignment(Setting::Probe, "sim"),
            "ATLASBOOST_PROBE=sim"
        );
        assert_eq!(Origin::CommandLine.name(Setting::Sim), "--sim N");
        assert_eq!(Origin::Environment.name(Setting::Sim), "ATLASBOOST_SIM");
    }

    #[test]
    fn probe_kinds_round_trip_their_names() {
        for k in ProbeKind::ALL {
            assert_eq!(ProbeKind::from_name(k.as_str()), Some(k));
        }
        assert_eq!(ProbeKind::from_name("gpu"), None);
    }

    #[test]
    fn seconds_are_positive_finite_and_bounded() {
        assert_eq!(parse_seconds("1.5"), Ok(Duration::from_millis(1500)));
        assert!(parse_seconds("0").is_err());
        assert_eq!(parse_seconds_or_zero("0"), Ok(Duration::ZERO));
        assert!(parse_seconds("1e300").is_err());
        assert!(parse_seconds("inf").is_err());
        assert!(parse_seconds("ten").unwrap_err().contains("\"ten\""));
    }
}
