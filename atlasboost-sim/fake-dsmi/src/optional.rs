//! The two functions an older driver lacks: `dsmi_get_chip_info` and `dsmi_get_device_health`.

use std::ffi::{c_int, c_uint};

use crate::shared::{PARA_ERROR, call};

/// The driver's `struct dsmi_chip_info_stru`: three NUL-padded `unsigned char[32]`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DsmiChipInfo {
    /// Always `Ascend`.
    pub chip_type: [u8; 32],
    /// `ATLASBOOST_FAKE_DSMI_CHIP`, default `910`.
    pub chip_name: [u8; 32],
    /// Always `V1`.
    pub chip_ver: [u8; 32],
}
const _: () = assert!(size_of::<DsmiChipInfo>() == 96);
const _: () = assert!(align_of::<DsmiChipInfo>() == 1);

/// `text` NUL-padded to 32 bytes (the configuration keeps it to at most 31).
fn padded(text: &str) -> [u8; 32] {
    let mut field = [0; 32];
    let len = text.len().min(31);
    field[..len].copy_from_slice(&text.as_bytes()[..len]);
    field
}

/// `int dsmi_get_chip_info(int device_id, struct dsmi_chip_info_stru *chip_info)`: `Ascend`,
/// the configured chip name, `V1`.
///
/// # Safety
///
/// `chip_info` is null or points to a writable `struct dsmi_chip_info_stru`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dsmi_get_chip_info(
    device_id: c_int,
    chip_info: *mut DsmiChipInfo,
) -> c_int {
    call(
        "dsmi_get_chip_info",
        |_| u32::try_from(device_id).ok(),
        |config| {
            if chip_info.is_null() {
                return Err(PARA_ERROR);
            }
            config.physical_id(i64::from(device_id))?;
            let info = DsmiChipInfo {
                chip_type: padded("Ascend"),
                chip_name: padded(config.chip_name()),
                chip_ver: padded("V1"),
            };
            // SAFETY: non-null, and the caller passes a writable struct (the C contract).
            unsafe { chip_info.write(info) };
            Ok(())
        },
    )
}

/// `int dsmi_get_device_health(int device_id, unsigned int *phealth)`: 0 (OK) unless an
/// `unhealthy:` fault names the device.
///
/// # Safety
///
/// `phealth` is null or points to a writable `unsigned int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dsmi_get_device_health(device_id: c_int, phealth: *mut c_uint) -> c_int {
    call(
        "dsmi_get_device_health",
        |_| u32::try_from(device_id).ok(),
        |config| {
            if phealth.is_null() {
                return Err(PARA_ERROR);
            }
            let health = config.health(config.physical_id(i64::from(device_id))?);
            // SAFETY: non-null, and the caller passes a writable `unsigned int` (the C contract).
            unsafe { phealth.write(health) };
            Ok(())
        },
    )
}

#[cfg(test)]
mod tests {
    use atlasboost_core::EnvVars;

    use super::*;
    use crate::shared::{INVALID_DEVICE, INVALID_VALUE, test_env};

    fn chip(logical: c_int) -> (c_int, DsmiChipInfo) {
        let mut info = DsmiChipInfo {
            chip_type: [0xee; 32],
            chip_name: [0xee; 32],
            chip_ver: [0xee; 32],
        };
        // SAFETY: a valid pointer to a local.
        let rc = unsafe { dsmi_get_chip_info(logical, &mut info) };
        (rc, info)
    }

    fn health(logical: c_int) -> (c_int, c_uint) {
        let mut out = 999;
        // SAFETY: a valid pointer to a local.
        let rc = unsafe { dsmi_get_device_health(logical, &mut out) };
        (rc, out)
    }

    #[test]
    fn chip_info_is_nul_padded() {
        test_env::set(&[(EnvVars::ATLASBOOST_FAKE_DSMI_CHIP, "910B")]);
        let (rc, info) = chip(7);
        assert_eq!(rc, 0);
        assert_eq!(info.chip_type, padded("Ascend"));
        assert_eq!(&info.chip_name[..5], b"910B\0");
        assert!(info.chip_name[4..].iter().all(|b| *b == 0));
        assert_eq!(info.chip_ver, padded("V1"));
        assert_eq!(chip(8).0, INVALID_DEVICE);
        // SAFETY: the function checks for null.
        assert_eq!(
            unsafe { dsmi_get_chip_info(0, std::ptr::null_mut()) },
            PARA_ERROR
        );
    }

    #[test]
    fn health_follows_unhealthy_faults_by_physical_id() {
        test_env::set(&[
            (EnvVars::ATLASBOOST_FAKE_DSMI_PHYSICAL, "4,5,6"),
            (
                EnvVars::ATLASBOOST_FAKE_DSMI_FAULTS,
                "unhealthy:5; unhealthy:6=0xffffffff; fail:dsmi_get_chip_info@0=9",
            ),
        ]);
        assert_eq!(health(0), (0, 0));
        assert_eq!(health(1), (0, 3));
        assert_eq!(health(2), (0, u32::MAX));
        assert_eq!(health(3), (INVALID_DEVICE, 999));
        assert_eq!(chip(0).0, 9);
        assert_eq!(chip(1).0, 0);
        // SAFETY: the function checks for null.
        assert_eq!(
            unsafe { dsmi_get_device_health(0, std::ptr::null_mut()) },
            PARA_ERROR
        );

        test_env::set(&[(EnvVars::ATLASBOOST_FAKE_DSMI_IP, "v7")]);
        assert_eq!(health(0), (INVALID_VALUE, 999));
    }
}
