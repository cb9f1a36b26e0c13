//! Real device discovery for atlasboost: the Ascend driver's DSMI C API, loaded at run time,
//! and `/etc/hccn.conf`.
//!
//! - [`DsmiProbe`] loads `libdrvdsmi_host.so` (fallback `libdrvdsmi.so`) with `libloading` and
//!   lists the devices the driver shows this process: logical id, physical id, RoCE IP, chip,
//!   health. Each symbol is resolved on its own, so a driver without an optional function
//!   (`dsmi_get_chip_info`, `dsmi_get_device_health`) still works.
//! - [`Dcmi`] loads the driver's `libdcmi.so` for each NPU's CPU affinity (`--bind-cores`).
//! - [`HccnProbe`] reads `address_<physical id>=<ip>` lines from `/etc/hccn.conf`.
//! - [`VisibleDevices`]: `ASCEND_VISIBLE_DEVICES` (physical ids a container runtime made
//!   visible) and `ASCEND_RT_VISIBLE_DEVICES` (logical ids the CANN runtime shows a process)
//!   filter and renumber what a probe found.
//!
//! ```no_run
//! use atlasboost_core::DeviceProbe;
//! use atlasboost_dsmi::DsmiProbe;
//!
//! let probe = DsmiProbe::load("10.0.0.1")?; // fails, listing every path tried, without a driver
//! for d in probe.probe()? {
//!     println!("{} -> physical {} at {:?}", d.logical_id, d.physical_id, d.ip);
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! This crate never simulates devices (that is `atlasboost-sim`, and its fake driver library)
//! and never guesses: a driver error is an error naming the function, the device and the code.
#![deny(missing_docs)]

mod dcmi;
mod dsmi;
mod hccn;
mod raw;
mod visible;

use std::path::PathBuf;

pub use dcmi::{Dcmi, parse_cpu_list};
pub use dsmi::{DsmiProbe, check_settings, library_candidates};
pub use hccn::{HccnProbe, parse_hccn_conf};
pub use visible::VisibleDevices;

/// The default location of hccn.conf.
pub const HCCN_CONF: &str = "/etc/hccn.conf";

/// Errors of real device discovery.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DsmiError {
    /// No driver library could be loaded.
    #[error(
        "cannot load the Ascend driver library; tried: {}. {}",
        tried.join("; "),
        match named {
            true => "ATLASBOOST_DSMI_LIB names it (and only it is tried): point it at the \
                     driver's libdrvdsmi_host.so, or unset it to search LD_LIBRARY_PATH and \
                     the driver's directories",
            false => "Set ATLASBOOST_DSMI_LIB to the library's path or add its directory to \
                      LD_LIBRARY_PATH",
        }
    )]
    NotFound {
        /// Every path tried, with why it failed.
        tried: Vec<String>,
        /// `ATLASBOOST_DSMI_LIB` named the one path tried.
        named: bool,
    },
    /// The library lacks a function atlasboost cannot do without.
    #[error("the driver library {} has no function {symbol}", library.display())]
    MissingSymbol {
        /// The library.
        library: PathBuf,
        /// The function.
        symbol: &'static str,
    },
    /// A driver function returned an error code.
    #[error("{function}({}) returned {code}{}", device.map_or(String::new(), |d| format!("device {d}")), meaning(*code))]
    Call {
        /// The C function.
        function: &'static str,
        /// The (logical) device it was called for, if any.
        device: Option<u32>,
        /// Its return code.
        code: i32,
    },
    /// A DCMI function (`--bind-cores`) returned an error code. DCMI addresses an NPU by
    /// card and chip, found from its physical id.
    #[error(
        "{function}({}) returned {code}",
        match card {
            Some((card, chip)) => format!("card {card}, chip {chip}: the NPU with physical id {physical}"),
            None => format!("physical id {physical}"),
        }
    )]
    DcmiCall {
        /// The C function.
        function: &'static str,
        /// The NPU's physical id.
        physical: u32,
        /// Its card and chip, when the call took them.
        card: Option<(i32, i32)>,
        /// Its return code.
        code: i32,
    },
    /// The driver says this host has no device.
    #[error(
        "the driver reports no device on this host (dsmi_get_device_count {})",
        if *code == 0 { "answered 0".to_string() } else { format!("returned {code}{}, how a driver without devices answers", meaning(*code)) }
    )]
    NoDevice {
        /// What the count answered: `INNER_ERR` (7), or success with 0.
        code: i32,
    },
    /// A driver function kept answering `TRY_AGAIN` (the driver is still starting).
    #[error(
        "{function}({}) kept returning 51 (TRY_AGAIN: the driver is still starting); called {}, the probe having waited {:.1} s for the driver (ATLASBOOST_DSMI_RETRY_SECS sets how long)",
        device.map_or(String::new(), |d| format!("device {d}")),
        if *tries == 1 { "once".to_string() } else { format!("{tries} times") },
        waited.as_secs_f64()
    )]
    StillStarting {
        /// The C function.
        function: &'static str,
        /// The (logical) device it was called for, if any.
        device: Option<u32>,
        /// How many calls were made.
        tries: u32,
        /// For how long.
        waited: std::time::Duration,
    },
    /// A driver call has not returned for longer than a call may take: the driver, or the
    /// NPU it addresses, is stuck.
    #[error(
        "{function}({}) has not returned after {:.1} s: the driver, or that NPU, is stuck (ATLASBOOST_DSMI_CALL_TIMEOUT_SECS sets how long a call may take)",
        device.map_or(String::new(), |d| format!("device {d}")),
        waited.as_secs_f64()
    )]
    Hung {
        /// The C function.
        function: &'static str,
        /// The (logical) device it was called for, if any.
        device: Option<u32>,
        /// For how long it had not returned.
        waited: std::time::Duration,
    },
    /// A setting of the probe's is malformed.
    #[error("{variable}={value:?}: {reason}")]
    BadVariable {
        /// The variable.
        variable: &'static str,
        /// Its value.
        value: String,
        /// What is wrong.
        reason: String,
    },
    /// The driver answered something impossible (a count out of range, an unknown address type).
    #[error("{function} answered {what}")]
    Nonsense {
        /// The C function.
        function: &'static str,
        /// What it answered.
        what: String,
    },
    /// hccn.conf is malformed; every problem is listed with its line.
    #[error("{} is not a valid hccn.conf:{}", path.display(), problems.iter().map(|p| format!("\n  {p}")).collect::<String>())]
    BadHccnConf {
        /// The file.
        path: PathBuf,
        /// `line 3: ...` for every problem.
        problems: Vec<String>,
    },
    /// hccn.conf cannot be read.
    #[error("cannot read {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A visible-devices variable is malformed or names a device that is not there.
    #[error("{variable}={value:?}: {reason}")]
    BadVisible {
        /// The variable.
        variable: &'static str,
        /// Its value.
        value: String,
        /// What is wrong.
        reason: String,
    },
}

/// ` (INVALID_DEVICE: no such device)` for the driver's known codes.
fn meaning(code: i32) -> String {
    atlasboost_core::dsmi_code_meaning(code).map_or(String::new(), |text| format!(" ({text})"))
}
