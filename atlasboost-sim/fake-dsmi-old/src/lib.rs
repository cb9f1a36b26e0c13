//! A fake older Ascend driver library, `libdrvdsmi.so` (the fallback name the DSMI loader
//! tries), without the optional `dsmi_get_chip_info` and `dsmi_get_device_health`.
//!
//! It exports [`dsmi_get_device_count`], [`dsmi_list_device`], [`dsmi_get_phyid_from_logicid`],
//! [`dsmi_get_logicid_from_phyid`] and [`dsmi_get_device_ip_address`], compiled from the same
//! source as `atlasboost-fake-dsmi` (`libdrvdsmi_host.so`), whose crate docs describe the
//! `ATLASBOOST_FAKE_DSMI_*` variables and the fault syntax; all of them apply here too (a
//! malformed `ATLASBOOST_FAKE_DSMI_CHIP` still fails every call, and faults may name the two
//! missing functions).

#[allow(
    dead_code,
    reason = "the chip name and health code are read only by the two functions this driver lacks"
)]
#[path = "../../fake-dsmi/src/shared.rs"]
mod shared;

pub use shared::{
    IPADDR_TYPE_V4, IPADDR_TYPE_V6, IpAddrT, dsmi_get_device_count, dsmi_get_device_ip_address,
    dsmi_get_logicid_from_phyid, dsmi_get_phyid_from_logicid, dsmi_list_device,
};
