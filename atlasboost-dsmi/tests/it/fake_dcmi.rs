//! The DCMI loader (`--bind-cores`) through `dlopen`, against the fake `libdcmi.so`
//! (`atlasboost-sim/fake-dcmi`).

use atlasboost_core::EnvVars;
use atlasboost_dsmi::Dcmi;

use crate::Env;

fn fake_dcmi() -> String {
    let exe = std::env::current_exe().unwrap();
    let lib = exe.parent().unwrap().parent().unwrap().join("libdcmi.so");
    assert!(
        lib.is_file(),
        "{} is missing: run `cargo build -p atlasboost-fake-dcmi` first",
        lib.display()
    );
    lib.display().to_string()
}

#[test]
fn an_npus_cpus_are_its_cards_and_two_chips_share_a_card() {
    let lib = fake_dcmi();
    // One NPU per card: card = physical id.
    let _env = Env::set(&[
        (EnvVars::ATLASBOOST_DCMI_LIB, &lib),
        (EnvVars::ATLASBOOST_FAKE_DCMI_AFFINITY, "0:0-3;1:4-7"),
    ]);
    let dcmi = Dcmi::load().unwrap().expect("the fake loads");
    assert_eq!(dcmi.card_of(1).unwrap(), (1, 0));
    assert_eq!(dcmi.affinity(1).unwrap(), vec![4, 5, 6, 7]);
    let e = dcmi.affinity(2).unwrap_err().to_string();
    assert!(
        // DCMI takes a card and a chip, not a device id: named as such.
        e.contains(
            "dcmi_get_affinity_cpu_info_by_device_id(card 2, chip 0: the NPU with physical id \
             2) returned -8005"
        ),
        "{e}"
    );
    drop(_env);
    // Atlas A3: two chips per card; physical 2 and 3 are card 1's.
    let _env = Env::set(&[
        (EnvVars::ATLASBOOST_DCMI_LIB, &lib),
        (EnvVars::ATLASBOOST_FAKE_DCMI_AFFINITY, "0:0-3;1:4-7"),
        (EnvVars::ATLASBOOST_FAKE_DCMI_CHIPS_PER_CARD, "2"),
    ]);
    let dcmi = Dcmi::load().unwrap().expect("the fake loads");
    assert_eq!(dcmi.card_of(3).unwrap(), (1, 1));
    assert_eq!(dcmi.affinity(2).unwrap(), vec![4, 5, 6, 7]);
    assert_eq!(dcmi.affinity(1).unwrap(), vec![0, 1, 2, 3]);
}

#[test]
fn a_named_library_that_is_not_dcmi_is_an_error_and_none_means_none() {
    let _env = Env::set(&[(EnvVars::ATLASBOOST_DCMI_LIB, "libc.so.6")]);
    let e = Dcmi::load().unwrap_err().to_string();
    assert!(
        e.contains("ATLASBOOST_DCMI_LIB=\"libc.so.6\": not a DCMI library: it has no dcmi_init"),
        "{e}"
    );
    drop(_env);
    // A path that does not exist is said to be missing.
    let _env = Env::set(&[(EnvVars::ATLASBOOST_DCMI_LIB, "/nonexistent/libdcmi.so")]);
    let e = Dcmi::load().unwrap_err().to_string();
    assert!(
        e.contains("cannot load it") && e.contains("No such file"),
        "{e}"
    );
    drop(_env);
    let _env = Env::set(&[(EnvVars::ATLASBOOST_DCMI_LIB, "none")]);
    assert!(Dcmi::load().unwrap().is_none());
}
