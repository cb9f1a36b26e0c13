//! A fake Ascend DCMI library, `libdcmi.so`, with the two calls atlasboost makes for
//! `--bind-cores`: [`dcmi_init`] and [`dcmi_get_affinity_cpu_info_by_device_id`], which
//! answers an NPU's CPU affinity as the real one does: a `start-end` range of CPU ids (what
//! torch_npu reads, and `npu-smi info -t topo` shows).
//!
//! `dcmi_get_card_id_device_id_from_phyid` maps physical id `p` to card `p / k`, chip `p % k`,
//! with `k` chips per card from `ATLASBOOST_FAKE_DCMI_CHIPS_PER_CARD` (default 1; 2 is Atlas
//! A3's).
//!
//! The affinity of card `c` comes from `ATLASBOOST_FAKE_DCMI_AFFINITY`, read at every call:
//! `;`-separated `<card>:<range>` elements, e.g. `0:0-11;1:12-23` (a card not listed answers
//! `-8005`, as a card that is not there). Unset, every card answers `-8005` too. A malformed
//! value answers `-8001` (`DCMI_ERR_CODE_INVALID_PARAMETER`) and says so on stderr.

use std::ffi::{c_char, c_int};
use std::io::Write;

use atlasboost_core::EnvVars;

/// Success.
const OK: c_int = 0;
/// `DCMI_ERR_CODE_INVALID_PARAMETER`.
const INVALID_PARAMETER: c_int = -8001;
/// `DCMI_ERR_CODE_INVALID_DEVICE_ID`: no such card or device.
const INVALID_DEVICE: c_int = -8005;

/// Chips per card (`ATLASBOOST_FAKE_DCMI_CHIPS_PER_CARD`, default 1).
fn chips_per_card() -> c_int {
    std::env::var(EnvVars::ATLASBOOST_FAKE_DCMI_CHIPS_PER_CARD)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .filter(|k: &c_int| *k >= 1)
        .unwrap_or(1)
}

/// `int dcmi_get_card_id_device_id_from_phyid(int *card_id, int *device_id, unsigned int
/// device_phy_id)`.
///
/// # Safety
///
/// `card_id` and `device_id` are null or point to writable `int`s.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dcmi_get_card_id_device_id_from_phyid(
    card_id: *mut c_int,
    device_id: *mut c_int,
    device_phy_id: std::ffi::c_uint,
) -> c_int {
    if card_id.is_null() || device_id.is_null() {
        return INVALID_PARAMETER;
    }
    let Ok(phy) = c_int::try_from(device_phy_id) else {
        return INVALID_DEVICE;
    };
    let k = chips_per_card();
    // SAFETY: non-null, and the caller passes writable `int`s.
    unsafe {
        card_id.write(phy / k);
        device_id.write(phy % k);
    }
    OK
}

/// `int dcmi_init(void)`.
#[unsafe(no_mangle)]
pub extern "C" fn dcmi_init() -> c_int {
    OK
}

/// The configured affinity of `card`, or the error code to answer.
fn affinity(card: c_int) -> Result<String, c_int> {
    let Ok(spec) = std::env::var(EnvVars::ATLASBOOST_FAKE_DCMI_AFFINITY) else {
        return Err(INVALID_DEVICE);
    };
    for element in spec.split(';').map(str::trim).filter(|e| !e.is_empty()) {
        let parsed = element.split_once(':').and_then(|(c, range)| {
            let c: c_int = c.trim().parse().ok()?;
            let (lo, hi) = range.trim().split_once('-')?;
            let (lo, hi): (u32, u32) = (lo.trim().parse().ok()?, hi.trim().parse().ok()?);
            (lo <= hi).then(|| (c, format!("{lo}-{hi}")))
        });
        match parsed {
            Some((c, range)) if c == card => return Ok(range),
            Some(_) => {}
            None => {
                // No eprintln!: a panic must not unwind out of an `extern "C"` function.
                let _ = writeln!(
                    std::io::stderr(),
                    "atlasboost-fake-dcmi: malformed {}: {element:?}: expected <card>:<start>-<end>",
                    EnvVars::ATLASBOOST_FAKE_DCMI_AFFINITY
                );
                return Err(INVALID_PARAMETER);
            }
        }
    }
    Err(INVALID_DEVICE)
}

/// `int dcmi_get_affinity_cpu_info_by_device_id(int card_id, int device_id, char
/// *affinity_cpu, int *length)`: writes the card's CPU range (`0-11`), NUL-terminated, and its
/// length without the NUL. `*length` is the buffer's size on entry.
///
/// # Safety
///
/// `affinity_cpu` is null or points to `*length` writable bytes; `length` is null or points to
/// a readable and writable `int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dcmi_get_affinity_cpu_info_by_device_id(
    card_id: c_int,
    device_id: c_int,
    affinity_cpu: *mut c_char,
    length: *mut c_int,
) -> c_int {
    if affinity_cpu.is_null() || length.is_null() || !(0..chips_per_card()).contains(&device_id) {
        return INVALID_PARAMETER;
    }
    let text = match affinity(card_id) {
        Ok(t) => t,
        Err(code) => return code,
    };
    // SAFETY: non-null, and the caller passes a readable and writable `int`.
    let capacity = unsafe { length.read() };
    let Ok(needed) = c_int::try_from(text.len() + 1) else {
        return INVALID_PARAMETER;
    };
    if capacity < needed {
        return INVALID_PARAMETER;
    }
    // SAFETY: the buffer holds `capacity >= text.len() + 1` writable bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr().cast::<c_char>(), affinity_cpu, text.len());
        affinity_cpu.add(text.len()).write(0);
        length.write(needed - 1);
    }
    OK
}
