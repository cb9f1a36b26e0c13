//! The telemetry calls (SPEC §13), with the driver header's structs; the old library lacks them
//! all, as older drivers lack some. Values are fixed per physical id `p`, so tests can check
//! them: AI core `(10 + 7p) % 100` %, `40 + p` °C, `(2000 + 50p)` tenths of a watt, HBM
//! 65,536 MB of which `1024 + 512p` MB in use. Health comes from `unhealthy:` faults (as
//! `dsmi_get_device_health`), error codes from `errorcode:` faults.

use std::ffi::{c_int, c_uint, c_ulonglong, c_ushort};

use crate::shared::{NOT_SUPPORT, PARA_ERROR, call};

/// `struct dsmi_power_info_stru`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DsmiPowerInfo {
    /// Tenths of a watt.
    pub power: c_ushort,
}

/// `struct dsmi_hbm_info_stru`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DsmiHbmInfo {
    /// KB in all.
    pub memory_size: c_ulonglong,
    /// MHz.
    pub freq: c_uint,
    /// KB in use.
    pub memory_usage: c_ulonglong,
    /// °C.
    pub temp: c_int,
    /// Percent.
    pub bandwith_util_rate: c_uint,
}
const _: () = assert!(size_of::<DsmiPowerInfo>() == 2);
const _: () = assert!(size_of::<DsmiHbmInfo>() == 32);

/// `device_type` of the AI cores, the only utilisation this fake serves.
const AI_CORE: c_int = 2;
/// `ERROR_CODE_MAX_NUM`.
const MAX_ERROR_CODES: usize = 128;

/// Runs `body` with the physical id of logical `device_id`, writing through `out` when it is
/// not null.
fn per_device<T>(
    function: &'static str,
    device_id: c_int,
    out: *mut T,
    body: impl FnOnce(u32) -> Result<T, c_int>,
) -> c_int {
    call(
        function,
        |_| u32::try_from(device_id).ok(),
        |config| {
            if out.is_null() {
                return Err(PARA_ERROR);
            }
            let value = body(config.physical_id(i64::from(device_id))?)?;
            // SAFETY: non-null, and the caller passes a writable value (the C contract).
            unsafe { out.write(value) };
            Ok(())
        },
    )
}

/// `int dsmi_get_device_utilization_rate(int device_id, int device_type, unsigned int
/// *putilization_rate)`: the AI cores' (type 2) only; other types `NOT_SUPPORT`.
///
/// # Safety
///
/// `putilization_rate` is null or points to a writable `unsigned int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dsmi_get_device_utilization_rate(
    device_id: c_int,
    device_type: c_int,
    putilization_rate: *mut c_uint,
) -> c_int {
    per_device(
        "dsmi_get_device_utilization_rate",
        device_id,
        putilization_rate,
        |p| match device_type {
            AI_CORE => Ok((10 + 7 * p) % 100),
            1..=6 => Err(NOT_SUPPORT),
            _ => Err(PARA_ERROR),
        },
    )
}

/// `int dsmi_get_device_temperature(int device_id, int *ptemperature)`.
///
/// # Safety
///
/// `ptemperature` is null or points to a writable `int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dsmi_get_device_temperature(
    device_id: c_int,
    ptemperature: *mut c_int,
) -> c_int {
    per_device(
        "dsmi_get_device_temperature",
        device_id,
        ptemperature,
        |p| Ok(40 + p as c_int),
    )
}

/// `int dsmi_get_device_power_info(int device_id, struct dsmi_power_info_stru *)`.
///
/// # Safety
///
/// `pdevice_power_info` is null or points to a writable struct.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dsmi_get_device_power_info(
    device_id: c_int,
    pdevice_power_info: *mut DsmiPowerInfo,
) -> c_int {
    per_device(
        "dsmi_get_device_power_info",
        device_id,
        pdevice_power_info,
        |p| {
            Ok(DsmiPowerInfo {
                power: (2000 + 50 * p) as c_ushort,
            })
        },
    )
}

/// `int dsmi_get_hbm_info(int device_id, struct dsmi_hbm_info_stru *)`.
///
/// # Safety
///
/// `pdevice_hbm_info` is null or points to a writable struct.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dsmi_get_hbm_info(
    device_id: c_int,
    pdevice_hbm_info: *mut DsmiHbmInfo,
) -> c_int {
    per_device("dsmi_get_hbm_info", device_id, pdevice_hbm_info, |p| {
        Ok(DsmiHbmInfo {
            memory_size: 65_536 * 1024,
            freq: 1600,
            memory_usage: c_ulonglong::from(1024 + 512 * p) * 1024,
            temp: 45 + p as c_int,
            bandwith_util_rate: 0,
        })
    })
}

/// `int dsmi_get_device_errorcode(int device_id, int *errorcount, unsigned int *perrorcode)`:
/// the device's `errorcode:` faults (at most 128), `perrorcode` holding 128.
///
/// # Safety
///
/// `errorcount` is null or points to a writable `int`; `perrorcode` is null or points to 128
/// writable `unsigned int`s.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dsmi_get_device_errorcode(
    device_id: c_int,
    errorcount: *mut c_int,
    perrorcode: *mut c_uint,
) -> c_int {
    call(
        "dsmi_get_device_errorcode",
        |_| u32::try_from(device_id).ok(),
        |config| {
            if errorcount.is_null() || perrorcode.is_null() {
                return Err(PARA_ERROR);
            }
            let codes = config.error_codes(config.physical_id(i64::from(device_id))?);
            let n = codes.len().min(MAX_ERROR_CODES);
            // SAFETY: non-null; the caller passes 128 writable entries and an int (the C
            // contract), and at most 128 are written.
            unsafe {
                std::ptr::copy_nonoverlapping(codes.as_ptr(), perrorcode, n);
                errorcount.write(n as c_int);
            }
            Ok(())
        },
    )
}
