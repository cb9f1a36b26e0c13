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

/// A NUL-padded C string field as text (up to the first NUL).
pub fn c_field(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).trim().to_string()
}
