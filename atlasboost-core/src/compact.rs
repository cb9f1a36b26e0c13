//! A compact binary form of devices and of what a rank table is built from, for the launch
//! tree (SPEC §14): hosts report their devices up the tree in it, and the launcher's decision
//! travels down in it, so that every host builds the table's JSON itself instead of receiving
//! it. A device costs about a dozen bytes here against about a hundred in JSON.
//!
//! Numbers are LEB128 varints; strings (server ids, chip names, SuperPoD ids) are written once
//! each in a string table and referred to by index. Reading checks every length and index and
//! says where a message is malformed; it never panics on hostile bytes.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::device::{Device, Health};
use crate::ranktable::{BuildOptions, Format, RankOrder};

/// What is wrong with a compact message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a malformed compact message: {0}")]
pub struct CompactError(pub String);

/// Appends compact values to a buffer.
#[derive(Debug, Default)]
pub struct Writer {
    /// What has been written.
    pub buf: Vec<u8>,
}

impl Writer {
    /// Appends a number (LEB128).
    pub fn varint(&mut self, mut v: u64) {
        loop {
            let byte = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                self.buf.push(byte);
                return;
            }
            self.buf.push(byte | 0x80);
        }
    }

    /// Appends bytes with their length.
    pub fn bytes(&mut self, b: &[u8]) {
        self.varint(b.len() as u64);
        self.buf.extend_from_slice(b);
    }

    /// Appends a string with its length.
    pub fn str(&mut self, s: &str) {
        self.bytes(s.as_bytes());
    }
}

/// Reads compact values from a message, naming what it was reading when the bytes end or
/// make no sense.
#[derive(Debug)]
pub struct Reader<'a> {
    data: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    /// A reader at the start of `data`.
    pub fn new(data: &'a [u8]) -> Reader<'a> {
        Reader { data, at: 0 }
    }

    fn fail(&self, what: &str, why: &str) -> CompactError {
        CompactError(format!("{why} at byte {} while reading {what}", self.at))
    }

    /// Reads a number.
    ///
    /// # Errors
    ///
    /// The message ends, or the number does not fit 64 bits.
    pub fn varint(&mut self, what: &str) -> Result<u64, CompactError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let Some(&byte) = self.data.get(self.at) else {
                return Err(self.fail(what, "the message ends"));
            };
            self.at += 1;
            v |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(self.fail(what, "a number longer than 64 bits"))
    }

    /// Reads a number that must fit 32 bits.
    ///
    /// # Errors
    ///
    /// As [`Reader::varint`], or a number above `u32::MAX`.
    pub fn u32(&mut self, what: &str) -> Result<u32, CompactError> {
        let v = self.varint(what)?;
        u32::try_from(v).map_err(|_| self.fail(what, &format!("{v} does not fit 32 bits")))
    }

    /// Reads `n` raw bytes.
    ///
    /// # Errors
    ///
    /// The message ends first.
    pub fn raw(&mut self, n: usize, what: &str) -> Result<&'a [u8], CompactError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.data.len())
            .ok_or_else(|| self.fail(what, &format!("{n} bytes announced, fewer left")))?;
        let got = &self.data[self.at..end];
        self.at = end;
        Ok(got)
    }

    /// Reads bytes written with their length.
    ///
    /// # Errors
    ///
    /// The message ends first.
    pub fn bytes(&mut self, what: &str) -> Result<&'a [u8], CompactError> {
        let n = self.varint(what)?;
        let n = usize::try_from(n).map_err(|_| self.fail(what, "a length beyond memory"))?;
        self.raw(n, what)
    }

    /// Reads a string written with its length.
    ///
    /// # Errors
    ///
    /// The message ends first, or the string is not UTF-8.
    pub fn str(&mut self, what: &str) -> Result<String, CompactError> {
        let b = self.bytes(what)?;
        String::from_utf8(b.to_vec()).map_err(|_| self.fail(what, "text that is not UTF-8"))
    }

    /// How many bytes are left to read.
    pub fn left(&self) -> usize {
        self.data.len() - self.at
    }

    /// Whether every byte has been read.
    pub fn is_empty(&self) -> bool {
        self.at == self.data.len()
    }

    /// Fails unless every byte has been read.
    ///
    /// # Errors
    ///
    /// Bytes after the end of what was read.
    pub fn finish(&self, what: &str) -> Result<(), CompactError> {
        match self.is_empty() {
            true => Ok(()),
            false => Err(self.fail(
                what,
                &format!("{} bytes after its end", self.data.len() - self.at),
            )),
        }
    }
}

const IP_NONE: u8 = 0;
const IP_V4: u8 = 4;
const IP_V6: u8 = 6;
const HAS_SUPER_DEVICE: u64 = 1;
const HAS_SUPER_POD: u64 = 2;

/// Appends `devices`: a string table, then a dozen bytes or so per device.
pub fn put_devices(w: &mut Writer, devices: &[Device]) {
    let mut index: HashMap<&str, u64> = HashMap::new();
    let mut strings: Vec<&str> = Vec::new();
    for d in devices {
        for s in [
            Some(d.server_id.as_str()),
            Some(d.chip.as_str()),
            d.super_pod_id.as_deref(),
        ]
        .into_iter()
        .flatten()
        {
            if !index.contains_key(s) {
                index.insert(s, strings.len() as u64);
                strings.push(s);
            }
        }
    }
    w.varint(strings.len() as u64);
    for s in &strings {
        w.str(s);
    }
    w.varint(devices.len() as u64);
    for d in devices {
        w.varint(index[d.server_id.as_str()]);
        w.varint(u64::from(d.logical_id));
        w.varint(u64::from(d.physical_id));
        match d.ip {
            None => w.buf.push(IP_NONE),
            Some(IpAddr::V4(ip)) => {
                w.buf.push(IP_V4);
                w.buf.extend_from_slice(&ip.octets());
            }
            Some(IpAddr::V6(ip)) => {
                w.buf.push(IP_V6);
                w.buf.extend_from_slice(&ip.octets());
            }
        }
        w.varint(index[d.chip.as_str()]);
        w.varint(d.health.to_wire());
        let flags = d.super_device_id.map_or(0, |_| HAS_SUPER_DEVICE)
            | d.super_pod_id.as_ref().map_or(0, |_| HAS_SUPER_POD);
        w.varint(flags);
        if let Some(id) = d.super_device_id {
            w.varint(u64::from(id));
        }
        if let Some(pod) = &d.super_pod_id {
            w.varint(index[pod.as_str()]);
        }
    }
}

/// Reads what [`put_devices`] wrote.
///
/// # Errors
///
/// A truncated or malformed list, naming the device and the field.
pub fn get_devices(r: &mut Reader<'_>) -> Result<Vec<Device>, CompactError> {
    let count = r.varint("the string count")?;
    // A count beyond what the rest of the message can hold is a lie, not a reason to reserve
    // memory: a string takes at least a byte, a device at least seven.
    let mut strings = Vec::with_capacity(count.min(r.left() as u64) as usize);
    for i in 0..count {
        strings.push(r.str(&format!("string {i}"))?);
    }
    let string = |r: &Reader<'_>, i: u64, what: &str| {
        strings
            .get(i as usize)
            .cloned()
            .ok_or_else(|| r.fail(what, &format!("string {i} of {}", strings.len())))
    };
    let count = r.varint("the device count")?;
    let mut devices = Vec::with_capacity(count.min(r.left() as u64 / 7) as usize);
    for n in 0..count {
        let what = |field: &str| format!("device {n}'s {field}");
        let server = r.varint(&what("server id"))?;
        let server_id = string(r, server, &what("server id"))?;
        let logical_id = r.u32(&what("logical id"))?;
        let physical_id = r.u32(&what("physical id"))?;
        let ip = match r.raw(1, &what("address"))?[0] {
            IP_NONE => None,
            IP_V4 => {
                let b: [u8; 4] = r.raw(4, &what("address"))?.try_into().unwrap_or_default();
                Some(IpAddr::V4(Ipv4Addr::from(b)))
            }
            IP_V6 => {
                let b: [u8; 16] = r.raw(16, &what("address"))?.try_into().unwrap_or_default();
                Some(IpAddr::V6(Ipv6Addr::from(b)))
            }
            other => return Err(r.fail(&what("address"), &format!("address kind {other}"))),
        };
        let chip = r.varint(&what("chip"))?;
        let chip = string(r, chip, &what("chip"))?;
        let health = r.varint(&what("health"))?;
        let health = Health::from_wire(health)
            .ok_or_else(|| r.fail(&what("health"), &format!("health {health:#x}")))?;
        let flags = r.varint(&what("flags"))?;
        if flags & !(HAS_SUPER_DEVICE | HAS_SUPER_POD) != 0 {
            return Err(r.fail(&what("flags"), &format!("unknown flags {flags:#x}")));
        }
        let super_device_id = match flags & HAS_SUPER_DEVICE {
            0 => None,
            _ => Some(r.u32(&what("super_device_id"))?),
        };
        let super_pod_id = match flags & HAS_SUPER_POD {
            0 => None,
            _ => {
                let i = r.varint(&what("super_pod_id"))?;
                Some(string(r, i, &what("super_pod_id"))?)
            }
        };
        devices.push(Device {
            server_id,
            logical_id,
            physical_id,
            ip,
            chip,
            health,
            super_device_id,
            super_pod_id,
        });
    }
    Ok(devices)
}

/// Appends what a table is built from: the options, then the devices.
pub fn put_table_inputs(w: &mut Writer, devices: &[Device], opts: &BuildOptions) {
    w.str(opts.format.as_str());
    match &opts.order {
        RankOrder::ServerId => w.varint(0),
        RankOrder::Hosts(list) => {
            w.varint(1);
            w.varint(list.len() as u64);
            for s in list {
                w.str(s);
            }
        }
    }
    w.str(opts.chip.map_or("", |c| c.as_str()));
    put_devices(w, devices);
}

/// Reads what [`put_table_inputs`] wrote.
///
/// # Errors
///
/// A truncated or malformed message, or a format or chip this build does not know.
pub fn get_table_inputs(r: &mut Reader<'_>) -> Result<(Vec<Device>, BuildOptions), CompactError> {
    let format: Format = r
        .str("the format")?
        .parse()
        .map_err(|e| r.fail("the format", &format!("{e}")))?;
    let order = match r.varint("the order")? {
        0 => RankOrder::ServerId,
        1 => {
            let n = r.varint("the host order's length")?;
            let mut list = Vec::with_capacity(n.min(r.left() as u64) as usize);
            for i in 0..n {
                list.push(r.str(&format!("host {i} of the order"))?);
            }
            RankOrder::Hosts(list)
        }
        other => return Err(r.fail("the order", &format!("order kind {other}"))),
    };
    let chip = match r.str("the chip")?.as_str() {
        "" => None,
        name => Some(
            name.parse()
                .map_err(|e| r.fail("the chip", &format!("{e}")))?,
        ),
    };
    let devices = get_devices(r)?;
    Ok((
        devices,
        BuildOptions {
            format,
            order,
            chip,
        },
    ))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::Chip;

    fn device() -> impl Strategy<Value = Device> {
        (
            "[a-z0-9.]{1,12}",
            0u32..64,
            0u32..64,
            prop_oneof![
                Just(None),
                any::<[u8; 4]>().prop_map(|b| Some(IpAddr::from(b))),
                any::<[u8; 16]>().prop_map(|b| Some(IpAddr::from(b))),
            ],
            prop_oneof![Just("910"), Just("910B3"), Just("910_9391")],
            prop_oneof![Just(0u32), Just(3), Just(u32::MAX)],
            proptest::option::of(any::<u32>()),
            proptest::option::of("[0-9]{1,3}"),
        )
            .prop_map(
                |(server_id, logical_id, physical_id, ip, chip, health, sd, sp)| Device {
                    server_id,
                    logical_id,
                    physical_id,
                    ip,
                    chip: chip.into(),
                    health: Health::from_code(health),
                    super_device_id: sd,
                    super_pod_id: sp,
                },
            )
    }

    proptest! {
        /// Whatever the devices and options, reading gives back what was written.
        #[test]
        fn table_inputs_round_trip(
            devices in proptest::collection::vec(device(), 0..40),
            hosts in proptest::option::of(proptest::collection::vec("[a-z0-9.]{1,12}", 0..5)),
            chip in proptest::option::of(prop_oneof![Just(Chip::Ascend910), Just(Chip::Ascend910B)]),
        ) {
            let opts = BuildOptions {
                format: Format::V1_2,
                order: hosts.map_or(RankOrder::ServerId, RankOrder::Hosts),
                chip,
            };
            let mut w = Writer::default();
            put_table_inputs(&mut w, &devices, &opts);
            let mut r = Reader::new(&w.buf);
            let (got, got_opts) = get_table_inputs(&mut r).unwrap();
            r.finish("the inputs").unwrap();
            prop_assert_eq!(got, devices);
            prop_assert_eq!(got_opts, opts);
        }

        /// Any cut or any byte changed is an error or another valid message, never a panic.
        #[test]
        fn hostile_bytes_never_panic(
            devices in proptest::collection::vec(device(), 1..8),
            cut in 0usize..400,
            flip in 0usize..400,
            byte in any::<u8>(),
        ) {
            let mut w = Writer::default();
            put_devices(&mut w, &devices);
            let mut bytes = w.buf;
            if let Some(b) = bytes.get_mut(flip) {
                *b = byte;
            }
            bytes.truncate(cut.min(bytes.len()));
            let _ = get_devices(&mut Reader::new(&bytes));
        }
    }

    #[test]
    fn a_device_costs_a_dozen_bytes() {
        let devices: Vec<Device> = (0..8)
            .flat_map(|s| {
                (0..8).map(move |p| Device {
                    server_id: format!("10.0.{s}.1"),
                    logical_id: p,
                    physical_id: p,
                    ip: Some(IpAddr::from([192, 168, s as u8, p as u8])),
                    chip: "910".into(),
                    health: Health::Healthy,
                    super_device_id: None,
                    super_pod_id: None,
                })
            })
            .collect();
        let mut w = Writer::default();
        put_devices(&mut w, &devices);
        let json = serde_json::to_vec(&devices).unwrap().len();
        assert!(w.buf.len() <= 64 * 12 + 8 * 10 + 8, "{} bytes", w.buf.len());
        assert!(
            w.buf.len() * 8 < json,
            "{} against JSON's {json}",
            w.buf.len()
        );
    }

    #[test]
    fn a_truncated_message_says_where() {
        let mut w = Writer::default();
        let device = Device {
            server_id: "10.0.0.1".into(),
            logical_id: 3,
            physical_id: 3,
            ip: None,
            chip: "910".into(),
            health: Health::Healthy,
            super_device_id: None,
            super_pod_id: None,
        };
        put_devices(&mut w, &[device]);
        let bytes = &w.buf[..w.buf.len() - 2];
        let e = get_devices(&mut Reader::new(bytes)).unwrap_err();
        assert!(e.0.contains("device 0's"), "{e}");
    }
}
