//! The raw layer: `#[repr(C)]` types matching `dsmi_common_interface.h`, and the functions'
//! pointer types.

use std::ffi::{c_int, c_uint};

/// `ip_addr_t`: a 16-byte union of `ip6[16]` / `ip4[4]`, then `enum ip_addr_type`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct IpAddrT {
    /// IPv4 in `u_addr[0..4]` (dotted order), or IPv6.
    pub u_addr: [u8; 16],
    /// `IPADDR_TYPE_V4` (0), `IPADDR_TYPE_V6` (1), `IPADDR_TYPE_ANY` (2).
    pub ip_type: c_uint,
}

/// `IPADDR_TYPE_V4`.
pub const IPADDR_TYPE_V4: c_uint = 0;
/// `IPADDR_TYPE_V6`.
pub const IPADDR_TYPE_V6: c_uint = 1;

/// `struct dsmi_chip_info_stru`: NUL-padded strings.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ChipInfo {
    /// e.g. `Ascend`.
    pub chip_type: [u8; 32],
    /// e.g. `910`, `910B3`.
    pub chip_name: [u8; 32],
    /// e.g. `V1`.
    pub chip_ver: [u8; 32],
}

// The header's layouts, checked at compile time (enum width is 4 bytes on gcc for x86-64 and
// aarch64, the two platforms Ascend drivers ship for).
const _: () = assert!(std::mem::size_of::<IpAddrT>() == 20);
const _: () = assert!(std::mem::align_of::<IpAddrT>() == 4);
const _: () = assert!(std::mem::size_of::<ChipInfo>() == 96);
const _: () = assert!(std::mem::align_of::<ChipInfo>() == 1);

/// `DSMI_ROCE_PORT`: the port whose address HCCL uses.
pub const DSMI_ROCE_PORT: c_int = 1;

/// `int dsmi_get_device_count(int *device_count)`.
pub type GetDeviceCount = unsafe extern "C" fn(*mut c_int) -> c_int;
/// `int dsmi_list_device(int device_id_list[], int count)`.
pub type ListDevice = unsafe extern "C" fn(*mut c_int, c_int) -> c_int;
/// `int dsmi_get_phyid_from_logicid(unsigned int logicid, unsigned int *phyid)`.
pub type GetPhyidFromLogicid = unsafe extern "C" fn(c_uint, *mut c_uint) -> c_int;
/// `int dsmi_get_device_ip_address(int device_id, int port_type, int port_id, ip_addr_t *ip,
/// ip_addr_t *mask)`.
pub type GetDeviceIpAddress =
    unsafe extern "C" fn(c_int, c_int, c_int, *mut IpAddrT, *mut IpAddrT) -> c_int;
/// `int dsmi_get_chip_info(int device_id, struct dsmi_chip_info_stru *chip_info)`.
pub type GetChipInfo = unsafe extern "C" fn(c_int, *mut ChipInfo) -> c_int;
/// `int dsmi_get_device_health(int device_id, unsigned int *phealth)`.
pub type GetDeviceHealth = unsafe extern "C" fn(c_int, *mut c_uint) -> c_int;

/// `struct dsmi_power_info_stru`: the power draw in units of 0.1 W.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct PowerInfo {
    /// Tenths of a watt.
    pub power: std::ffi::c_ushort,
}

/// `struct dsmi_hbm_info_stru` (910, 910B, 910_93).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct HbmInfo {
    /// HBM in all, KB.
    pub memory_size: std::ffi::c_ulonglong,
    /// Its frequency, MHz.
    pub freq: c_uint,
    /// HBM in use, KB.
    pub memory_usage: std::ffi::c_ulonglong,
    /// Its temperature, °C.
    pub temp: c_int,
    /// Its bandwidth utilisation, percent.
    pub bandwith_util_rate: c_uint,
}

const _: () = assert!(std::mem::size_of::<PowerInfo>() == 2);
const _: () = assert!(std::mem::size_of::<HbmInfo>() == 32);

/// `dsmi_get_device_utilization_rate`'s `device_type` for the AI cores.
pub const UTILIZATION_AI_CORE: c_int = 2;
/// The most error codes `dsmi_get_device_errorcode` writes (`ERROR_CODE_MAX_NUM`).
pub const MAX_ERROR_CODES: usize = 128;

/// `int dsmi_get_device_utilization_rate(int device_id, int device_type, unsigned int
/// *putilization_rate)`.
pub type GetUtilizationRate = unsafe extern "C" fn(c_int, c_int, *mut c_uint) -> c_int;
/// `int dsmi_get_device_temperature(int device_id, int *ptemperature)`.
pub type GetTemperature = unsafe extern "C" fn(c_int, *mut c_int) -> c_int;
/// `int dsmi_get_device_power_info(int device_id, struct dsmi_power_info_stru *pdevice_power_info)`.
pub type GetPowerInfo = unsafe extern "C" fn(c_int, *mut PowerInfo) -> c_int;
/// `int dsmi_get_hbm_info(int device_id, struct dsmi_hbm_info_stru *pdevice_hbm_info)`.
pub type GetHbmInfo = unsafe extern "C" fn(c_int, *mut HbmInfo) -> c_int;
/// `int dsmi_get_device_errorcode(int device_id, int *errorcount, unsigned int *perrorcode)`;
/// `perrorcode` holds [`MAX_ERROR_CODES`].
pub type GetErrorCode = unsafe extern "C" fn(c_int, *mut c_int, *mut c_uint) -> c_int;

/// A NUL-padded C string field as text (up to the first NUL).
pub fn c_field(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).trim().to_string()
}
