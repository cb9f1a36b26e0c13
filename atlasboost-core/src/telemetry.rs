//! Device telemetry (SPEC §13): what each NPU is doing now — AI core utilisation, HBM, temperature,
//! power, health, error codes — as a probe's backend can tell. A sibling of
//! [`DeviceProbe`](crate::DeviceProbe): probing finds the devices once per launch, sampling reads
//! them every few seconds.
//!
//! Every metric is optional: a driver without the call for it (an older driver, another chip)
//! leaves it absent, and a call that fails leaves it absent for that sample, named in the
//! sample's `failures` (a failing health call reads as the device unreadable, as a probe
//! reads it). Sampling never fails as a whole.

use serde::{Deserialize, Serialize};

use crate::{Device, Health};

/// One reading of one device. Units as `npu-smi info` and MindX's `npu-exporter` show them.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct DeviceSample {
    /// The device's physical id (the table's `device_id`).
    pub physical_id: u32,
    /// AI core utilisation, percent.
    pub ai_core_percent: Option<u32>,
    /// HBM in use, MB.
    pub hbm_used_mb: Option<u64>,
    /// HBM in all, MB.
    pub hbm_total_mb: Option<u64>,
    /// Chip temperature, °C.
    pub temperature_c: Option<i32>,
    /// Power draw, in tenths of a watt (as the driver reports it).
    pub power_decwatts: Option<u32>,
    /// The driver's health.
    pub health: Option<Health>,
    /// The driver's current error codes (empty: none).
    pub error_codes: Option<Vec<u32>>,
    /// Why values are absent from this sample although the driver has the calls for them: each
    /// call that failed, named with its code (`dsmi_get_device_temperature(device 2) returned
    /// 13 (BUSY: the device is busy)`), or why the driver could not be read at all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failures: Vec<String>,
}

impl DeviceSample {
    /// An empty sample of device `physical_id`: every metric absent.
    pub fn of(physical_id: u32) -> DeviceSample {
        DeviceSample {
            physical_id,
            ..DeviceSample::default()
        }
    }

    /// A sample of device `physical_id` without values, for the reasons `failures`.
    pub fn failed(physical_id: u32, failures: Vec<String>) -> DeviceSample {
        DeviceSample {
            failures,
            ..DeviceSample::of(physical_id)
        }
    }

    /// A sample of each of `devices` without values, each for the reason `why` (a driver that
    /// cannot be read at all).
    pub fn all_failed(devices: &[crate::Device], why: &str) -> Vec<DeviceSample> {
        devices
            .iter()
            .map(|d| DeviceSample::failed(d.physical_id, vec![why.to_string()]))
            .collect()
    }

    /// An empty sample of each of `devices`: what is shown when nothing could be read.
    pub fn none_of(devices: &[crate::Device]) -> Vec<DeviceSample> {
        devices
            .iter()
            .map(|d| DeviceSample::of(d.physical_id))
            .collect()
    }

    /// Power draw in watts.
    pub fn power_watts(&self) -> Option<f64> {
        self.power_decwatts.map(|p| f64::from(p) / 10.0)
    }
}

/// A source of device telemetry.
pub trait Telemetry: Send + Sync {
    /// One sample of each of `devices` (as this host's probe found them: the driver addresses
    /// them by their logical id), in the same order. Never fails: what cannot be read is absent.
    fn sample(&self, devices: &[Device]) -> Vec<DeviceSample>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn power_is_in_tenths_of_a_watt_and_absent_stays_absent() {
        let mut s = DeviceSample::of(3);
        assert_eq!((s.physical_id, s.power_watts()), (3, None));
        s.power_decwatts = Some(2155);
        assert_eq!(s.power_watts(), Some(215.5));
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<DeviceSample>(&json).unwrap(), s);
    }
}
