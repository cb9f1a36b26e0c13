//! Probing 16 devices through the DSMI loader and the fake driver library the workspace builds
//! (`atlasboost-sim/fake-dsmi`): the driver calls, the address decoding, the visible-devices
//! filter. The fake reads its settings from the environment on every call, as cheaply as it
//! can, so this measures an upper bound of atlasboost's own cost per probe.

use std::path::PathBuf;

use atlasboost_core::{DeviceProbe, EnvVars};
use atlasboost_dsmi::DsmiProbe;
use criterion::{Criterion, criterion_group};

/// The fake driver: next to this benchmark's profile directory, else the debug build.
fn fake_driver() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let profile = exe.parent()?.parent()?;
    [
        profile.join("libdrvdsmi_host.so"),
        profile.parent()?.join("debug/libdrvdsmi_host.so"),
    ]
    .into_iter()
    .find(|p| p.is_file())
}

fn probe(c: &mut Criterion) {
    let Some(lib) = fake_driver() else {
        eprintln!(
            "skipping probe/dsmi_16: no libdrvdsmi_host.so next to the benchmark; \
             build it with `cargo build -p atlasboost-fake-dsmi`"
        );
        return;
    };
    // SAFETY: set before anything else runs in this process; criterion is single-threaded here.
    unsafe {
        std::env::set_var(EnvVars::ATLASBOOST_FAKE_DSMI_DEVICES, "16");
        std::env::set_var(EnvVars::ATLASBOOST_FAKE_DSMI_CHIP, "910B3");
    }
    let probe = match DsmiProbe::load_from("10.0.0.1", &lib) {
        Ok(p) => p,
        Err(e) => panic!("cannot load {}: {e}", lib.display()),
    };
    match probe.probe() {
        Ok(d) if d.len() == 16 => {}
        other => panic!("the fake driver should show 16 devices: {other:?}"),
    }
    let mut g = c.benchmark_group("probe");
    g.bench_function("dsmi_16", |b| b.iter(|| probe.probe()));
    g.bench_function("dsmi_load_and_probe_16", |b| {
        b.iter(|| DsmiProbe::load_from("10.0.0.1", &lib).map(|p| p.probe()))
    });
    g.finish();
}

criterion_group!(benches, probe);

fn main() {
    benches();
    criterion::Criterion::default()
        .configure_from_args()
        .final_summary();
}
