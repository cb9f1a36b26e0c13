//! The CPU affinity of each NPU, from the driver's DCMI library (`--bind-cores`): what
//! torch_npu reads with `dcmi_get_affinity_cpu_info_by_device_id` and `npu-smi info -t topo`
//! shows. Loaded like DSMI, at run time; a host without it has no affinity to report (the
//! launcher then splits the allowed CPUs evenly).

use std::ffi::{c_char, c_int};
use std::path::{Path, PathBuf};

use atlasboost_core::EnvVars;
use libloading::Library;

use crate::DsmiError;

/// `int dcmi_init(void)`.
type Init = unsafe extern "C" fn() -> c_int;
/// `int dcmi_get_affinity_cpu_info_by_device_id(int card_id, int device_id, char
/// *affinity_cpu, int *length)`.
type GetAffinity = unsafe extern "C" fn(c_int, c_int, *mut c_char, *mut c_int) -> c_int;
/// `int dcmi_get_card_id_device_id_from_phyid(int *card_id, int *device_id, unsigned int
/// device_phy_id)`: the card and the chip within it of an NPU's physical id (two chips per card
/// on Atlas A3).
type CardOfPhyid = unsafe extern "C" fn(*mut c_int, *mut c_int, std::ffi::c_uint) -> c_int;

/// Where the driver installs `libdcmi.so`.
const DRIVER_DIRS: [&str; 2] = [
    "/usr/local/Ascend/driver/lib64/driver",
    "/usr/local/Ascend/driver/lib64",
];

/// The loaded DCMI library.
#[derive(Debug)]
pub struct Dcmi {
    path: PathBuf,
    get: GetAffinity,
    card_of: Option<CardOfPhyid>,
    // Last: the function above points into it.
    _library: Library,
}

impl Dcmi {
    /// Loads `libdcmi.so` from each directory of `$LD_LIBRARY_PATH` and the driver's; `None`
    /// when none loads, has the two functions and initialises. `$ATLASBOOST_DCMI_LIB` names
    /// the library instead (`none`: do not use one).
    ///
    /// # Errors
    ///
    /// [`DsmiError::BadVariable`] when `$ATLASBOOST_DCMI_LIB` names a library that does not
    /// load as DCMI, saying why: a path the user gave is never ignored.
    pub fn load() -> Result<Option<Dcmi>, DsmiError> {
        // Empty counts as unset, as for every variable.
        if let Some(file) = std::env::var_os(EnvVars::ATLASBOOST_DCMI_LIB).filter(|f| !f.is_empty())
        {
            if file == "none" {
                return Ok(None);
            }
            let bad = |reason: String| DsmiError::BadVariable {
                variable: EnvVars::ATLASBOOST_DCMI_LIB,
                value: file.to_string_lossy().into_owned(),
                reason: format!(
                    "{reason} (name the driver's libdcmi.so, or none to split the CPUs evenly)"
                ),
            };
            return Dcmi::load_from(&PathBuf::from(&file))
                .map(Some)
                .map_err(bad);
        }
        Ok(std::env::var_os(EnvVars::LD_LIBRARY_PATH)
            .map(|v| std::env::split_paths(&v).collect::<Vec<_>>())
            .unwrap_or_default()
            .into_iter()
            .chain(DRIVER_DIRS.iter().map(PathBuf::from))
            .map(|d| d.join("libdcmi.so"))
            .filter(|p| p.exists())
            .find_map(|p| Dcmi::load_from(&p).ok()))
    }

    /// The library at `path`, or why it is not one DCMI library that initialises.
    fn load_from(path: &Path) -> Result<Dcmi, String> {
        // SAFETY: loading the driver's library runs its initialisers, which have no
        // preconditions; the function types are the header's.
        let library = unsafe { Library::new(path) }.map_err(|e| format!("cannot load it: {e}"))?;
        let missing = |symbol: &str| format!("not a DCMI library: it has no {symbol}");
        // SAFETY: as above; the pointers are used only while `library` is loaded.
        let init: Init = unsafe { library.get::<Init>(b"dcmi_init") }
            .map(|s| *s)
            .map_err(|_| missing("dcmi_init"))?;
        // SAFETY: as above.
        let get: GetAffinity =
            unsafe { library.get::<GetAffinity>(b"dcmi_get_affinity_cpu_info_by_device_id") }
                .map(|s| *s)
                .map_err(|_| missing("dcmi_get_affinity_cpu_info_by_device_id"))?;
        // SAFETY: as above; optional (without it a card holds one NPU, its physical id).
        let card_of: Option<CardOfPhyid> =
            unsafe { library.get::<CardOfPhyid>(b"dcmi_get_card_id_device_id_from_phyid") }
                .ok()
                .map(|s| *s);
        // SAFETY: a function of no arguments.
        match unsafe { init() } {
            0 => {}
            code => return Err(format!("its dcmi_init() returned {code}")),
        }
        Ok(Dcmi {
            path: path.to_path_buf(),
            get,
            card_of,
            _library: library,
        })
    }

    /// The library in use.
    pub fn library(&self) -> &Path {
        &self.path
    }

    /// The card and the chip within it of the NPU with this physical id: the driver's answer
    /// when it has `dcmi_get_card_id_device_id_from_phyid`, else (physical id, 0) — one NPU
    /// per card, as on 910 servers.
    ///
    /// # Errors
    ///
    /// [`DsmiError::DcmiCall`] naming the function, the NPU and the code.
    pub fn card_of(&self, physical: u32) -> Result<(c_int, c_int), DsmiError> {
        let Some(get) = self.card_of else {
            return Ok((physical as c_int, 0));
        };
        let (mut card, mut chip) = (0, 0);
        // SAFETY: two ints to write through valid pointers.
        let code = unsafe { get(&mut card, &mut chip, physical) };
        if code != 0 {
            return Err(DsmiError::DcmiCall {
                function: "dcmi_get_card_id_device_id_from_phyid",
                physical,
                card: None,
                code,
            });
        }
        Ok((card, chip))
    }

    /// The CPUs close to the NPU with this physical id (its card's and chip's).
    ///
    /// # Errors
    ///
    /// [`DsmiError::DcmiCall`] naming the function, the NPU and the code; [`DsmiError::Nonsense`]
    /// for an answer that is not a CPU list.
    pub fn affinity(&self, physical: u32) -> Result<Vec<usize>, DsmiError> {
        const FUNCTION: &str = "dcmi_get_affinity_cpu_info_by_device_id";
        let (card, chip) = self.card_of(physical)?;
        let mut buf = [0 as c_char; 256];
        let mut len = buf.len() as c_int;
        // SAFETY: a 256-byte buffer and its size, as the function is told.
        let code = unsafe { (self.get)(card, chip, buf.as_mut_ptr(), &mut len) };
        if code != 0 {
            return Err(DsmiError::DcmiCall {
                function: FUNCTION,
                physical,
                card: Some((card, chip)),
                code,
            });
        }
        let bytes: Vec<u8> = buf
            .iter()
            .take(usize::try_from(len).unwrap_or(0).min(buf.len()))
            .take_while(|b| **b != 0)
            .map(|b| *b as u8)
            .collect();
        let text = String::from_utf8_lossy(&bytes).into_owned();
        parse_cpu_list(&text).ok_or(DsmiError::Nonsense {
            function: FUNCTION,
            what: format!(
                "{text:?} for card {card}, chip {chip} (expected a CPU list such as 0-11)"
            ),
        })
    }
}

/// `0-11`, `0-3,8-11` or `5`: the CPUs listed, ascending; `None` when malformed or empty.
/// (The project's one id-list parser, [`atlasboost_core::parse_id_list`].)
pub fn parse_cpu_list(text: &str) -> Option<Vec<usize>> {
    let mut cpus = atlasboost_core::parse_id_list(text.trim(), "CPU", 65_535).ok()?;
    cpus.sort_unstable();
    (!cpus.is_empty()).then(|| cpus.into_iter().map(|c| c as usize).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_parse_as_linux_writes_them() {
        assert_eq!(parse_cpu_list("0-3"), Some(vec![0, 1, 2, 3]));
        assert_eq!(parse_cpu_list("8-9,0-1, 5"), Some(vec![0, 1, 5, 8, 9]));
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list(""), None);
        assert_eq!(parse_cpu_list("a-b"), None);
    }
}
