//! `HccnProbe` on real-looking files and broken ones.

use std::io::Write;
use std::net::IpAddr;
use std::os::fd::AsRawFd;

use atlasboost_core::DeviceProbe;
use atlasboost_core::EnvVars;
use atlasboost_core::conformance::check_probe;
use atlasboost_dsmi::HccnProbe;

use crate::Env;

fn file(text: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(text.as_bytes()).unwrap();
    f
}

/// The error of probing the hccn.conf at `path` (which must fail), with its source.
fn probe_error(path: &std::path::Path) -> String {
    let e = HccnProbe::new("10.0.0.1", path)
        .unwrap()
        .probe()
        .unwrap_err();
    let source = std::error::Error::source(&e).map_or(String::new(), |s| s.to_string());
    format!("{e}: {source}")
}

#[test]
fn a_file_with_every_key_passes_the_conformance_suite() {
    let mut text = String::new();
    for p in 0..8 {
        text.push_str(&format!(
            "address_{p}=29.1.{}.{}\nnetmask_{p}=255.255.0.0\nnetdetect_{p}=29.1.0.1\n\
             gateway_{p}=29.1.0.1\nsend_arp_status_{p}=1\ntls_enable_{p}=0\n\
             arp_{p}=-i eth{p} -s 29.1.137.{p} 00:11:22:33:44:{p:02x}\n",
            137 + p / 8,
            200 + p
        ));
    }
    let f = file(&text);
    let _env = Env::set(&[]);
    let probe = HccnProbe::new("10.0.0.1", f.path()).unwrap();
    assert_eq!(probe.name(), "hccn");
    let devices = check_probe(&probe, "10.0.0.1").unwrap();
    assert_eq!(devices.len(), 8);
    assert_eq!(devices[6].physical_id, 6);
    assert_eq!(devices[6].ip, Some(IpAddr::from([29, 1, 137, 206])));
}

#[test]
fn a_path_to_something_endless_is_refused_after_a_megabyte() {
    let _env = Env::set(&[]);
    // A valid start, then far more than any hccn.conf: refused whole, without reading it all.
    let mut text = "address_0=10.1.0.1\n".to_string();
    text.push_str(&"# padding\n".repeat(200_000));
    let f = file(&text);
    for path in [f.path(), std::path::Path::new("/dev/zero")] {
        let text = probe_error(path);
        assert!(text.contains("more than 1 MiB"), "{text}");
        assert!(text.contains(&path.display().to_string()), "{text}");
    }
}

/// The probe of `path` on a thread of its own: its error, or a failed test (not a hung one)
/// if it has not answered within 20 s.
fn probe_error_within(path: &std::path::Path) -> String {
    let path = path.to_path_buf();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(probe_error(&path)));
    rx.recv_timeout(std::time::Duration::from_secs(20))
        .expect("the probe of a FIFO has not returned after 20 s: it waits for a writer")
}

#[test]
fn a_fifo_nobody_writes_to_is_named_instead_of_waited_for() {
    let _env = Env::set(&[]);
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("hccn.conf");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
    let text = probe_error_within(&fifo);
    assert!(text.contains(&fifo.display().to_string()), "{text}");
    assert!(
        text.contains("it is a FIFO (a named pipe) that no process was writing to"),
        "{text}"
    );
}

#[test]
fn a_pipe_with_a_writer_is_read_to_its_end() {
    // What `--hccn-conf <(ssh node cat /etc/hccn.conf)` hands the probe: a pipe's path.
    let _env = Env::set(&[]);
    let (read, write) = nix::unistd::pipe().unwrap();
    let path = std::path::PathBuf::from(format!("/proc/self/fd/{}", read.as_raw_fd()));
    let writer = std::thread::spawn(move || {
        let mut w = std::fs::File::from(write);
        w.write_all(b"address_0=10.1.0.1\n").unwrap();
        // The rest comes later: the probe waits for it, up to the writer's end.
        std::thread::sleep(std::time::Duration::from_millis(200));
        w.write_all(b"address_1=10.1.0.2\n").unwrap();
    });
    let devices = HccnProbe::new("10.0.0.1", &path).unwrap().probe().unwrap();
    writer.join().unwrap();
    let ips: Vec<_> = devices.iter().map(|d| d.ip).collect();
    assert_eq!(
        ips,
        [
            Some(IpAddr::from([10, 1, 0, 1])),
            Some(IpAddr::from([10, 1, 0, 2]))
        ]
    );
}

#[test]
fn a_line_that_is_not_utf8_is_named_beside_every_other_problem() {
    let _env = Env::set(&[]);
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(
        b"address_0=10.1.0.1\naddress_1=10.1.\xff.2\naddress_2=10.1.0.300\r\naddress_3=10.1.0.4\n",
    )
    .unwrap();
    let text = probe_error(f.path());
    let two = text.find("line 2 is not UTF-8 text");
    let three = text.find("line 3: address_2=\"10.1.0.300\" is not an IPv4 or IPv6 address");
    assert!(two.is_some() && three.is_some() && two < three, "{text}");
}

/// A file that lists only devices 4-7 (the others have no RoCE address): on bare metal the
/// driver numbers them 4-7, so do their logical ids; in a container that mounted 5-6 they are
/// 0 and 1.
#[test]
fn a_file_with_gaps_keeps_the_physical_numbering() {
    let f =
        file("address_4=10.1.0.5\naddress_5=10.1.0.6\naddress_6=10.1.0.7\naddress_7=10.1.0.8\n");
    let ids = |devices: &[atlasboost_core::Device]| -> Vec<(u32, u32)> {
        devices
            .iter()
            .map(|d| (d.logical_id, d.physical_id))
            .collect()
    };
    {
        let _env = Env::set(&[]);
        let probe = HccnProbe::new("10.0.0.1", f.path()).unwrap();
        let devices = check_probe(&probe, "10.0.0.1").unwrap();
        assert_eq!(ids(&devices), [(4, 4), (5, 5), (6, 6), (7, 7)]);
    }
    {
        let _env = Env::set(&[(EnvVars::ASCEND_VISIBLE_DEVICES, "5-6")]);
        let devices = HccnProbe::new("10.0.0.1", f.path())
            .unwrap()
            .probe()
            .unwrap();
        assert_eq!(ids(&devices), [(0, 5), (1, 6)]);
    }
    {
        // Device 0 may well be in the machine: the file gives it no address.
        let _env = Env::set(&[(EnvVars::ASCEND_RT_VISIBLE_DEVICES, "0")]);
        let e = HccnProbe::new("10.0.0.1", f.path())
            .unwrap()
            .probe()
            .unwrap_err();
        let text = format!("{e}: {}", std::error::Error::source(&e).unwrap());
        let want = format!(
            "ASCEND_RT_VISIBLE_DEVICES=\"0\": names device 0, to which {} gives no RoCE address \
             (it lists: 4,5,6,7), so this probe cannot use it",
            f.path().display()
        );
        assert!(text.contains(&want), "{text}");
    }
    // Renumbered by a container's ASCEND_VISIBLE_DEVICES, the ids are not the file's.
    let _env = Env::set(&[
        (EnvVars::ASCEND_VISIBLE_DEVICES, "5-6"),
        (EnvVars::ASCEND_RT_VISIBLE_DEVICES, "2"),
    ]);
    let e = HccnProbe::new("10.0.0.1", f.path())
        .unwrap()
        .probe()
        .unwrap_err();
    let text = format!("{e}: {}", std::error::Error::source(&e).unwrap());
    assert!(
        text.contains("names device 2, which this host does not have (it has: 0,1)"),
        "{text}"
    );
}

#[test]
fn a_broken_file_is_reported_with_line_numbers() {
    let f = file("address_0=10.0.0.1\naddress_1=10.0.0.999\n");
    let _env = Env::set(&[]);
    let e = HccnProbe::new("h", f.path()).unwrap().probe().unwrap_err();
    let text = format!("{e}: {}", std::error::Error::source(&e).unwrap());
    assert!(text.contains("hccn probe failed on host h"), "{text}");
    assert!(text.contains("line 2: address_1=\"10.0.0.999\""), "{text}");
}

#[test]
fn a_file_that_is_not_utf8_is_named_with_its_line() {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(b"address_0=10.0.0.1\n# caf\xe9\naddress_1=10.0.0.2\n")
        .unwrap();
    let _env = Env::set(&[]);
    let e = HccnProbe::new("h", f.path()).unwrap().probe().unwrap_err();
    let text = format!("{e}: {}", std::error::Error::source(&e).unwrap());
    assert!(text.contains("line 2 is not UTF-8 text"), "{text}");
    assert!(text.contains(&f.path().display().to_string()), "{text}");
}

#[test]
fn a_container_mount_filters_and_renumbers_the_file_s_devices() {
    let text: String = (0..8)
        .map(|p| format!("address_{p}=10.1.0.{}\n", p + 1))
        .collect();
    let f = file(&text);
    let _env = Env::set(&[
        (EnvVars::ASCEND_VISIBLE_DEVICES, "4-7"),
        (EnvVars::ASCEND_RT_VISIBLE_DEVICES, "1,2"),
    ]);
    let devices = HccnProbe::new("h", f.path()).unwrap().probe().unwrap();
    let ids: Vec<(u32, u32)> = devices
        .iter()
        .map(|d| (d.logical_id, d.physical_id))
        .collect();
    assert_eq!(ids, vec![(0, 5), (1, 6)]);
    drop(_env);
    let _env = Env::set(&[(EnvVars::ASCEND_VISIBLE_DEVICES, "0,x")]);
    let e = HccnProbe::new("h", f.path()).unwrap_err().to_string();
    assert!(e.starts_with("ASCEND_VISIBLE_DEVICES=\"0,x\""), "{e}");
}
