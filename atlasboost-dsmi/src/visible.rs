//! Visible devices (SPEC §3): which of a host's devices this process may use.
//!
//! - `ASCEND_VISIBLE_DEVICES` (Ascend Docker Runtime): **physical** ids mounted into a
//!   container, e.g. `0-3` or `1,3`. Inside, the devices are renumbered as logical 0..n-1 in
//!   physical order. The driver already shows only those; hccn.conf lists them all, so it is
//!   applied to hccn.conf's devices.
//! - `ASCEND_RT_VISIBLE_DEVICES` (CANN runtime): **logical** ids a process sees, ascending,
//!   renumbered from 0. Applied to every probe, since the workers inherit it.

use std::path::Path;

use atlasboost_core::{Device, EnvVars};

use crate::DsmiError;

/// The two variables, parsed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VisibleDevices {
    /// `ASCEND_VISIBLE_DEVICES`, if set: physical ids.
    pub physical: Option<Vec<u32>>,
    /// `ASCEND_RT_VISIBLE_DEVICES`, if set: logical ids, ascending.
    pub runtime: Option<Vec<u32>>,
}

impl VisibleDevices {
    /// Reads both variables from the environment.
    ///
    /// # Errors
    ///
    /// [`DsmiError::BadVisible`] naming the variable whose value is malformed.
    pub fn from_env() -> Result<VisibleDevices, DsmiError> {
        let visible = VisibleDevices {
            physical: read_list(EnvVars::ASCEND_VISIBLE_DEVICES)?,
            ..VisibleDevices::runtime_from_env()?
        };
        Ok(visible)
    }

    /// Only `ASCEND_RT_VISIBLE_DEVICES`: what applies to devices that are not a driver's view
    /// of a host (simulated ones), which no container runtime mounted.
    ///
    /// # Errors
    ///
    /// [`DsmiError::BadVisible`] when it is malformed.
    pub fn runtime_from_env() -> Result<VisibleDevices, DsmiError> {
        let runtime = read_list(EnvVars::ASCEND_RT_VISIBLE_DEVICES)?;
        if let Some(ids) = &runtime
            && ids.windows(2).any(|w| w[0] >= w[1])
        {
            return Err(DsmiError::BadVisible {
                variable: EnvVars::ASCEND_RT_VISIBLE_DEVICES,
                value: join(ids),
                reason: "the CANN runtime needs ascending ids, each once".into(),
            });
        }
        Ok(VisibleDevices {
            physical: None,
            runtime,
        })
    }

    /// Keeps the devices whose physical id is listed, renumbered 0..n-1 in physical order.
    /// `listed_by`: the hccn.conf the devices come from (it lists only those with an address).
    ///
    /// # Errors
    ///
    /// [`DsmiError::BadVisible`] for a listed id the host does not have.
    pub fn apply_physical(
        &self,
        devices: Vec<Device>,
        listed_by: Option<&Path>,
    ) -> Result<Vec<Device>, DsmiError> {
        let Some(ids) = &self.physical else {
            return Ok(devices);
        };
        let mut kept = pick(
            devices,
            ids,
            |d| d.physical_id,
            EnvVars::ASCEND_VISIBLE_DEVICES,
            listed_by,
        )?;
        kept.sort_by_key(|d| d.physical_id);
        for (logical, d) in kept.iter_mut().enumerate() {
            d.logical_id = logical as u32;
        }
        Ok(kept)
    }

    /// Keeps the devices whose logical id is listed, renumbered 0..n-1 in that order.
    /// `listed_by`: as for [`VisibleDevices::apply_physical`].
    ///
    /// # Errors
    ///
    /// [`DsmiError::BadVisible`] for a listed id the host does not have.
    pub fn apply_runtime(
        &self,
        devices: Vec<Device>,
        listed_by: Option<&Path>,
    ) -> Result<Vec<Device>, DsmiError> {
        let Some(ids) = &self.runtime else {
            return Ok(devices);
        };
        let mut kept = pick(
            devices,
            ids,
            |d| d.logical_id,
            EnvVars::ASCEND_RT_VISIBLE_DEVICES,
            listed_by,
        )?;
        kept.sort_by_key(|d| d.logical_id);
        for (logical, d) in kept.iter_mut().enumerate() {
            d.logical_id = logical as u32;
        }
        Ok(kept)
    }
}

fn pick(
    devices: Vec<Device>,
    ids: &[u32],
    key: impl Fn(&Device) -> u32,
    variable: &'static str,
    listed_by: Option<&Path>,
) -> Result<Vec<Device>, DsmiError> {
    if let Some(missing) = ids
        .iter()
        .find(|id| !devices.iter().any(|d| key(d) == **id))
    {
        let mut have: Vec<u32> = devices.iter().map(&key).collect();
        have.sort_unstable();
        // hccn.conf lists the devices it gives an address: another may well be in the machine.
        let reason = match listed_by {
            None => format!(
                "names device {missing}, which this host does not have (it has: {})",
                join(&have)
            ),
            Some(file) => format!(
                "names device {missing}, to which {} gives no RoCE address (it lists: {}), so \
                 this probe cannot use it",
                file.display(),
                join(&have)
            ),
        };
        return Err(DsmiError::BadVisible {
            variable,
            value: join(ids),
            reason,
        });
    }
    Ok(devices
        .into_iter()
        .filter(|d| ids.contains(&key(d)))
        .collect())
}

/// A list variable, `None` when unset or blank.
fn read_list(name: &'static str) -> Result<Option<Vec<u32>>, DsmiError> {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => parse_list(name, &v).map(Some),
        Err(std::env::VarError::NotUnicode(v)) => Err(DsmiError::BadVisible {
            variable: name,
            value: v.to_string_lossy().into_owned(),
            reason: "is not UTF-8".into(),
        }),
        _ => Ok(None),
    }
}

/// `0-3`, `1,3`, `0-2,4`: ids in the order written.
fn parse_list(variable: &'static str, value: &str) -> Result<Vec<u32>, DsmiError> {
    atlasboost_core::parse_id_list(value, "device", 64).map_err(|reason| DsmiError::BadVisible {
        variable,
        value: value.to_string(),
        reason,
    })
}

fn join(ids: &[u32]) -> String {
    ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

#[cfg(test)]
mod tests {
    use atlasboost_core::Health;

    use super::*;

    fn devices(physical: &[u32]) -> Vec<Device> {
        physical
            .iter()
            .enumerate()
            .map(|(l, &p)| Device {
                server_id: "h".into(),
                logical_id: l as u32,
                physical_id: p,
                ip: None,
                chip: "910".into(),
                health: Health::Healthy,
                super_device_id: None,
                super_pod_id: None,
            })
            .collect()
    }

    fn ids(d: &[Device]) -> Vec<(u32, u32)> {
        d.iter().map(|d| (d.logical_id, d.physical_id)).collect()
    }

    #[test]
    fn physical_ids_filter_and_renumber() {
        let v = VisibleDevices {
            physical: Some(parse_list("X", "6,4-5").unwrap()),
            runtime: None,
        };
        let got = v
            .apply_physical(devices(&[0, 1, 2, 3, 4, 5, 6, 7]), None)
            .unwrap();
        assert_eq!(ids(&got), vec![(0, 4), (1, 5), (2, 6)]);
    }

    #[test]
    fn runtime_ids_filter_and_renumber() {
        let v = VisibleDevices {
            physical: None,
            runtime: Some(vec![1, 3]),
        };
        let got = v.apply_runtime(devices(&[4, 5, 6, 7]), None).unwrap();
        assert_eq!(ids(&got), vec![(0, 5), (1, 7)]);
    }

    #[test]
    fn bad_values_name_the_variable() {
        let e = parse_list(EnvVars::ASCEND_VISIBLE_DEVICES, "0,x").unwrap_err();
        assert!(
            e.to_string().starts_with("ASCEND_VISIBLE_DEVICES=\"0,x\""),
            "{e}"
        );
        let e = parse_list(EnvVars::ASCEND_VISIBLE_DEVICES, "3-1").unwrap_err();
        assert!(e.to_string().contains("range 3-1 runs backwards"), "{e}");
        let v = VisibleDevices {
            physical: Some(vec![9]),
            runtime: None,
        };
        let e = v.apply_physical(devices(&[0, 1]), None).unwrap_err();
        assert!(
            e.to_string()
                .contains("names device 9, which this host does not have (it has: 0,1)"),
            "{e}"
        );
    }
}
