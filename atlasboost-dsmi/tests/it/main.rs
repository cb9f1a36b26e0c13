#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `DsmiProbe` and `HccnProbe` through the real loading path: the fake driver libraries the
//! workspace builds (`atlasboost-sim/fake-dsmi`, `fake-dsmi-old`), opened with `dlopen`.

mod fake_dcmi;
mod fake_driver;
mod hccn;

use std::sync::{Mutex, MutexGuard};

use atlasboost_core::EnvVars;

// The environment is process-wide and the probes read it (the visible-devices variables, the
// fake driver's settings), so every test of this binary holds one lock while it sets variables
// and probes.
static ENV: Mutex<()> = Mutex::new(());

/// Every variable a test may set; cleared before each test.
const VARS: [&str; 15] = [
    EnvVars::ATLASBOOST_DCMI_LIB,
    EnvVars::ATLASBOOST_FAKE_DCMI_AFFINITY,
    EnvVars::ATLASBOOST_FAKE_DCMI_CHIPS_PER_CARD,
    EnvVars::ATLASBOOST_FAKE_DSMI_DEVICES,
    EnvVars::ATLASBOOST_FAKE_DSMI_IP_API,
    EnvVars::ATLASBOOST_DSMI_RETRY_SECS,
    EnvVars::ATLASBOOST_DSMI_CALL_TIMEOUT_SECS,
    EnvVars::ATLASBOOST_FAKE_DSMI_PHYSICAL,
    EnvVars::ATLASBOOST_FAKE_DSMI_CHIP,
    EnvVars::ATLASBOOST_FAKE_DSMI_IP,
    EnvVars::ATLASBOOST_FAKE_DSMI_FAULTS,
    EnvVars::ATLASBOOST_FAKE_DSMI_FAULTS_FILE,
    EnvVars::ATLASBOOST_DSMI_LIB,
    EnvVars::ASCEND_VISIBLE_DEVICES,
    EnvVars::ASCEND_RT_VISIBLE_DEVICES,
];

/// The environment for one test: set on creation, cleared on drop, under the lock.
pub(crate) struct Env {
    _lock: MutexGuard<'static, ()>,
}

impl Env {
    pub(crate) fn set(vars: &[(&str, &str)]) -> Env {
        let lock = ENV.lock().unwrap_or_else(|p| p.into_inner());
        for v in VARS {
            // SAFETY: every test of this binary that reads or writes the environment holds
            // ENV, and the libraries involved read it only while the test's probe runs (on the
            // probe's thread: a test that leaves one behind waits for it under the lock).
            unsafe { std::env::remove_var(v) };
        }
        for (k, v) in vars {
            // SAFETY: as above.
            unsafe { std::env::set_var(k, v) };
        }
        Env { _lock: lock }
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        for v in VARS {
            // SAFETY: the lock is still held.
            unsafe { std::env::remove_var(v) };
        }
    }
}
