//! One host's part in agreeing on the cluster table: probe, gather over a rendezvous, build.

use serde::{Deserialize, Serialize};

use crate::device::{Device, DeviceProbe};
use crate::error::{Error, Result};
use crate::ranktable::{BuildOptions, RankTable, build_table};
use crate::rendezvous::Rendezvous;

/// What one host tells the others: its devices, or why it has none.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HostReport {
    /// The host's devices (already restricted to the ones the job uses).
    Devices(Vec<Device>),
    /// The host's probe failed; the message says why.
    ProbeFailed {
        /// The host.
        server_id: String,
        /// The probe's error, with its causes.
        message: String,
    },
}

/// Probes this host, gathers every host's report and builds the cluster table.
///
/// A host whose probe fails still takes part in the gather, so every participant fails with
/// the same error naming that host instead of waiting for it. `select` restricts the probed
/// devices (e.g. `--devices`); its error is reported like a probe failure.
///
/// # Errors
///
/// [`Error::RemoteProbe`] naming the first host whose probe failed (this one included),
/// [`Error::BadPayload`] if a participant sent something that is not a report, the
/// rendezvous's own errors, and the builder's.
pub fn gather_cluster_table(
    rdv: &mut dyn Rendezvous,
    probe: &dyn DeviceProbe,
    host: &str,
    select: &dyn Fn(Vec<Device>) -> Result<Vec<Device>>,
    opts: &BuildOptions,
) -> Result<RankTable> {
    let report = match probe.probe().and_then(select) {
        Ok(devices) => HostReport::Devices(devices),
        Err(e) => HostReport::ProbeFailed {
            server_id: host.to_string(),
            message: error_chain(&e),
        },
    };
    let payload = serde_json::to_vec(&report).map_err(|source| Error::BadPayload {
        participant: rdv.index(),
        source,
    })?;
    let gathered = rdv.all_gather(&payload)?;
    let mut devices = Vec::new();
    for (participant, bytes) in gathered.iter().enumerate() {
        let report: HostReport =
            serde_json::from_slice(bytes).map_err(|source| Error::BadPayload {
                participant,
                source,
            })?;
        match report {
            HostReport::Devices(d) => devices.extend(d),
            HostReport::ProbeFailed { server_id, message } => {
                return Err(Error::RemoteProbe { server_id, message });
            }
        }
    }
    build_table(&devices, opts)
}

/// An error and its causes on one line, for sending to other hosts.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use mockall::mock;

    use super::*;
    use crate::device::Health;

    mock! {
        Rdv {}
        impl Rendezvous for Rdv {
            fn index(&self) -> usize;
            fn size(&self) -> usize;
            fn all_gather(&mut self, payload: &[u8]) -> Result<Vec<Vec<u8>>>;
            fn barrier(&mut self) -> Result<()>;
        }
    }

    struct Fixed(Result<Vec<Device>>);

    impl DeviceProbe for Fixed {
        fn name(&self) -> &str {
            "fixed"
        }

        fn probe(&self) -> Result<Vec<Device>> {
            match &self.0 {
                Ok(d) => Ok(d.clone()),
                Err(e) => Err(Error::Build(e.to_string())),
            }
        }
    }

    fn devices(server: &str) -> Vec<Device> {
        (0..2)
            .map(|p| Device {
                server_id: server.into(),
                logical_id: p,
                physical_id: p,
                ip: Some(
                    format!("192.168.{}.{}", server.len(), p + 1)
                        .parse()
                        .unwrap(),
                ),
                chip: "910".into(),
                health: Health::Healthy,
                super_device_id: None,
                super_pod_id: None,
            })
            .collect()
    }

    #[test]
    fn garbage_from_a_participant_is_named() {
        let mut rdv = MockRdv::new();
        rdv.expect_index().return_const(0usize);
        rdv.expect_all_gather()
            .returning(|mine| Ok(vec![mine.to_vec(), b"\x00garbage".to_vec()]));
        let probe = Fixed(Ok(devices("h1")));
        let err =
            gather_cluster_table(&mut rdv, &probe, "h1", &|d| Ok(d), &BuildOptions::default())
                .unwrap_err();
        assert!(
            matches!(err, Error::BadPayload { participant: 1, .. }),
            "{err}"
        );
    }

    #[test]
    fn a_failed_probe_is_still_sent_so_everyone_fails_naming_the_host() {
        let mut rdv = MockRdv::new();
        rdv.expect_index().return_const(1usize);
        let peer = serde_json::to_vec(&HostReport::Devices(devices("h1"))).unwrap();
        rdv.expect_all_gather().times(1).returning(move |mine| {
            let report: HostReport = serde_json::from_slice(mine).unwrap();
            assert!(matches!(report, HostReport::ProbeFailed { .. }));
            Ok(vec![peer.clone(), mine.to_vec()])
        });
        let probe = Fixed(Err(Error::Build("driver gone".into())));
        let err =
            gather_cluster_table(&mut rdv, &probe, "h2", &|d| Ok(d), &BuildOptions::default())
                .unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("host h2") && text.contains("driver gone"),
            "{text}"
        );
    }

    #[test]
    fn a_rendezvous_error_passes_through() {
        let mut rdv = MockRdv::new();
        rdv.expect_index().return_const(0usize);
        rdv.expect_all_gather().returning(|_| {
            Err(Error::Rendezvous {
                backend: "mock".into(),
                temporary: true,
                source: "participant 3 never arrived".into(),
            })
        });
        let err = gather_cluster_table(
            &mut rdv,
            &Fixed(Ok(devices("h1"))),
            "h1",
            &|d| Ok(d),
            &BuildOptions::default(),
        )
        .unwrap_err();
        assert!(err.is_temporary());
        assert!(error_chain(&err).contains("participant 3 never arrived"));
    }

    #[test]
    fn two_hosts_build_the_same_table() {
        let a = serde_json::to_vec(&HostReport::Devices(devices("h1"))).unwrap();
        let b = serde_json::to_vec(&HostReport::Devices(devices("host2"))).unwrap();
        let mut tables = Vec::new();
        for (index, name) in [(0usize, "h1"), (1, "host2")] {
            let mut rdv = MockRdv::new();
            rdv.expect_index().return_const(index);
            let (a, b) = (a.clone(), b.clone());
            rdv.expect_all_gather()
                .returning(move |_| Ok(vec![a.clone(), b.clone()]));
            let probe = Fixed(Ok(devices(name)));
            tables.push(
                gather_cluster_table(&mut rdv, &probe, name, &|d| Ok(d), &BuildOptions::default())
                    .unwrap(),
            );
        }
        assert_eq!(tables[0], tables[1]);
        assert_eq!(tables[0].rank_count(), 4);
    }
}
