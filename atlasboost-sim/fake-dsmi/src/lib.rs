//! A fake Ascend driver library, `libdrvdsmi_host.so`, serving simulated devices, so that the
//! real DSMI loading code (`atlasboost-dsmi`) is tested on machines without an NPU.
//!
//! It exports, with the C ABI of the driver header `dsmi_common_interface.h`:
//! [`dsmi_get_device_count`], [`dsmi_list_device`], [`dsmi_get_phyid_from_logicid`],
//! [`dsmi_get_logicid_from_phyid`], [`dsmi_get_device_ip_address`], and the two functions an
//! older driver lacks, [`dsmi_get_chip_info`] and [`dsmi_get_device_health`]. The sibling
//! package `atlasboost-fake-dsmi-old` builds that older driver, `libdrvdsmi.so`, from the same
//! code without those two.
//!
//! # The simulated host
//!
//! Every call reads these variables (so one process can change them between calls); unset and
//! empty are the same:
//!
//! | Variable | Meaning | Default |
//! |---|---|---|
//! | `ATLASBOOST_FAKE_DSMI_DEVICES` | The device count, `0` to `64`. | `8`, or the length of `…_PHYSICAL` |
//! | `ATLASBOOST_FAKE_DSMI_PHYSICAL` | Comma-separated distinct physical ids (`0` to `153`) of logical devices `0, 1, …`: `4,5,6,7` is a container seeing physical 4-7 as logical 0-3. Its length must equal `…_DEVICES` if that is set. | physical = logical |
//! | `ATLASBOOST_FAKE_DSMI_CHIP` | The `chip_name` (at most 31 bytes). | `910` |
//! | `ATLASBOOST_FAKE_DSMI_IP` | `v4` or `v6` addresses. | `v4` |
//! | `ATLASBOOST_FAKE_DSMI_IP_API` | `current`: `dsmi_get_device_ip_address` as the real driver; `old`: as this fake did before (below). | `current` |
//! | `ATLASBOOST_FAKE_DSMI_FAULTS` | Faults, below. | none |
//! | `ATLASBOOST_FAKE_DSMI_FAULTS_FILE` | A file of more faults (`;` or one per line), read at every call; a missing file adds none. | none |
//!
//! The device with physical id `p` has, on its RoCE (port type 1) and VNIC (port type 0) port:
//! - `v4`: `192.168.100.(101+p)`, mask `255.255.255.0`, `ip_type` 0 (`IPADDR_TYPE_V4`);
//! - `v6`: `fd00::ab:(p+1)`, the last group being `p+1` in hex as IPv6 text always is
//!   (`Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0xab, p + 1)`: `fd00::ab:1` for `p = 0`,
//!   `fd00::ab:10` for `p = 15`), mask `ffff:ffff:ffff:ffff::` (/64), `ip_type` 1.
//!
//! **As the real driver** (`hicann/driver`: `dsmi_common_interface.c` and the hccn tool; see
//! `docs/devices.md`): `dsmi_get_device_ip_address` reads the caller's `ip_type` to choose the
//! family (anything but 0 and 1 is `PARA_ERROR`), writes only the address bytes, and answers
//! 1 (`NO_DEVICE`) for a port with no address of that family: an IPv4 host has no IPv6 address
//! and the other way round. `dsmi_get_device_count` answers 7 (`INNER_ERR`) on a host with no
//! device; `dsmi_list_device` refuses a count below 1 or above 64. With
//! `ATLASBOOST_FAKE_DSMI_IP_API=old` the address call ignores the type asked, writes the
//! device's own, and answers a port with no address with success and `0.0.0.0` (what older
//! drivers and earlier versions of this fake did).
//!
//! `dsmi_get_chip_info` reports `chip_type` `Ascend`, the configured `chip_name`, `chip_ver`
//! `V1`, each NUL-padded to 32 bytes. `dsmi_get_device_health` reports 0 (OK) for every device
//! unless a fault says otherwise.
//!
//! Telemetry (the old library has none of it): [`dsmi_get_device_utilization_rate`] (the AI
//! cores, type 2), [`dsmi_get_device_temperature`], [`dsmi_get_device_power_info`],
//! [`dsmi_get_hbm_info`] and [`dsmi_get_device_errorcode`], with values fixed per physical id
//! (see the `telemetry` module).
//!
//! # Faults
//!
//! `ATLASBOOST_FAKE_DSMI_FAULTS` is a `;`-separated list (blanks around elements and empty
//! elements are ignored). Ids must exist in the simulated host; codes are decimal (`-1`) or the
//! 32 bits in hex (`0xfffe`, `0xffffffff`):
//! - `fail:<function>=<code>`: `<function>` (the full C name, e.g. `dsmi_get_device_count`)
//!   returns the `int` `<code>` without writing its outputs (so `=0` is a "success" that leaves
//!   them as they were);
//! - `fail:<function>@<logical>=<code>`: the same, only for that logical device: the calls
//!   taking a logical id, and `dsmi_get_logicid_from_phyid` for that device's physical id
//!   (`dsmi_get_device_count` and `dsmi_list_device` take no device, so this is malformed);
//! - `hang:<function>[@<logical>]=<milliseconds>`: the call (for that logical device) sleeps
//!   that long before it answers, as a driver whose NPU is wedged;
//! - `no-ip:<physical>`: that device's port has no address configured:
//!   `dsmi_get_device_ip_address` answers `NO_DEVICE` (`old` API: success with `0.0.0.0`);
//! - `unhealthy:<physical>[=<code>]`: `dsmi_get_device_health` reports the `unsigned int`
//!   `<code>` (default 3, critical; `0xffffffff`, as the real driver answers for a device that
//!   is not alive) for that device, with success;
//! - `errorcode:<physical>=<code>`: `dsmi_get_device_errorcode` reports `<code>` for that
//!   device (several faults, several codes);
//! - `try-again:<function>[=<times>]`: `<function>` answers 51 (`TRY_AGAIN`, a driver that is
//!   still starting) for its first `<times>` calls on the calling thread, for ever without
//!   `=`.
//!
//! The first matching fault applies.
//!
//! # Errors
//!
//! The checks run in this order: a malformed environment, an injected `fail:`, a null pointer
//! or a `dsmi_list_device` `count` below the device count (8, `PARA_ERROR`), an unknown logical
//! or physical id (2, `INVALID_DEVICE`), a port type or port id outside 0 to 255 (8), a port
//! type other than 0 and 1 (`0xfffe`, `NOT_SUPPORT`).
//!
//! A driver cannot return a message, so while any of the variables is malformed every call
//! returns 3 (`INVALID_VALUE`) and writes one line to stderr naming the variable, the bad part
//! and what is wrong (the same line is not repeated on later calls).

mod optional;
mod shared;
mod telemetry;

pub use optional::{DsmiChipInfo, dsmi_get_chip_info, dsmi_get_device_health};
pub use shared::{
    IPADDR_TYPE_V4, IPADDR_TYPE_V6, IpAddrT, dsmi_get_device_count, dsmi_get_device_ip_address,
    dsmi_get_logicid_from_phyid, dsmi_get_phyid_from_logicid, dsmi_list_device,
};
pub use telemetry::{
    DsmiHbmInfo, DsmiPowerInfo, dsmi_get_device_errorcode, dsmi_get_device_power_info,
    dsmi_get_device_temperature, dsmi_get_device_utilization_rate, dsmi_get_hbm_info,
};
