//! Read access to a rank table for the validator, whether parsed JSON or the typed model.
//!
//! The validator walks a [`Node`], so the same rules check a file (a `serde_json::Value`, where a
//! number may stand where a string belongs) and a table the builder made (the typed model,
//! walked in place: no conversion to `Value`, which would cost more than the checks).

use serde_json::{Map, Value};

use super::model::{
    ClusterTable, DeviceEntry, GroupEntry, InstanceEntry, LegacyDeviceEntry, LegacyTable,
    ServerEntry, SuperPodEntry, SuperPodServer,
};

/// One node of a JSON-like document.
pub(super) trait Node<'a>: Copy {
    /// The string, if this node is one.
    fn as_str(self) -> Option<&'a str>;
    /// Whether this node is an object.
    fn is_object(self) -> bool;
    /// The member `key` of an object.
    fn get(self, key: &str) -> Option<Self>;
    /// The length of an array.
    fn len(self) -> Option<usize>;
    /// Element `i` of an array.
    fn at(self, i: usize) -> Option<Self>;
    /// The JSON kind (`number`, `array`, ...) and a short rendering, for messages.
    fn describe(self) -> (&'static str, String);
    /// The members of an object that the typed model keeps as extras (for a JSON object: all of
    /// them). Optional keys the model has no field for can only be among these.
    fn others(self) -> Option<&'a Map<String, Value>>;
}

/// The kind of a JSON value, as messages name it.
pub(super) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

impl<'a> Node<'a> for &'a Value {
    fn as_str(self) -> Option<&'a str> {
        Value::as_str(self)
    }

    fn is_object(self) -> bool {
        Value::is_object(self)
    }

    fn get(self, key: &str) -> Option<Self> {
        self.as_object()?.get(key)
    }

    fn len(self) -> Option<usize> {
        self.as_array().map(Vec::len)
    }

    fn at(self, i: usize) -> Option<Self> {
        self.as_array()?.get(i)
    }

    fn others(self) -> Option<&'a Map<String, Value>> {
        self.as_object()
    }

    fn describe(self) -> (&'static str, String) {
        let text = self.to_string();
        if text.chars().count() > 40 {
            (
                kind(self),
                text.chars().take(37).chain("...".chars()).collect(),
            )
        } else {
            (kind(self), text)
        }
    }
}

/// A node of the typed model.
#[derive(Debug, Clone, Copy)]
pub(super) enum Typed<'a> {
    Str(&'a str),
    Json(&'a Value),
    Cluster(&'a ClusterTable),
    Servers(&'a [ServerEntry]),
    Server(&'a ServerEntry),
    Devices(&'a [DeviceEntry]),
    Device(&'a DeviceEntry),
    Pods(&'a [SuperPodEntry]),
    Pod(&'a SuperPodEntry),
    PodServers(&'a [SuperPodServer]),
    PodServer(&'a SuperPodServer),
    Legacy(&'a LegacyTable),
    Groups(&'a [GroupEntry]),
    Group(&'a GroupEntry),
    Instances(&'a [InstanceEntry]),
    Instance(&'a InstanceEntry),
    LegacyDevices(&'a [LegacyDeviceEntry]),
    LegacyDevice(&'a LegacyDeviceEntry),
}

fn s(v: &str) -> Option<Typed<'_>> {
    Some(Typed::Str(v))
}

fn opt(v: &Option<String>) -> Option<Typed<'_>> {
    v.as_deref().map(Typed::Str)
}

fn extra<'a>(map: &'a Map<String, Value>, key: &str) -> Option<Typed<'a>> {
    map.get(key).map(Typed::Json)
}

impl<'a> Node<'a> for Typed<'a> {
    fn as_str(self) -> Option<&'a str> {
        match self {
            Typed::Str(s) => Some(s),
            Typed::Json(v) => v.as_str(),
            _ => None,
        }
    }

    fn is_object(self) -> bool {
        match self {
            Typed::Str(_)
            | Typed::Servers(_)
            | Typed::Devices(_)
            | Typed::Pods(_)
            | Typed::PodServers(_)
            | Typed::Groups(_)
            | Typed::Instances(_)
            | Typed::LegacyDevices(_) => false,
            Typed::Json(v) => v.is_object(),
            _ => true,
        }
    }

    fn get(self, key: &str) -> Option<Self> {
        match self {
            Typed::Json(v) => v.get(key).map(Typed::Json),
            Typed::Cluster(t) => match key {
                "version" => s(&t.version),
                "server_count" => opt(&t.server_count),
                "server_list" => Some(Typed::Servers(&t.server_list)),
                "super_pod_list" => t.super_pod_list.as_deref().map(Typed::Pods),
                "status" => s(&t.status),
                _ => extra(&t.extra, key),
            },
            Typed::Server(e) => match key {
                "server_id" => s(&e.server_id),
                "device" => Some(Typed::Devices(&e.device)),
                "host_nic_ip" => opt(&e.host_nic_ip),
                _ => extra(&e.extra, key),
            },
            Typed::Device(d) => match key {
                "device_id" => s(&d.device_id),
                "device_ip" => opt(&d.device_ip),
                "super_device_id" => opt(&d.super_device_id),
                "rank_id" => s(&d.rank_id),
                _ => extra(&d.extra, key),
            },
            Typed::Pod(p) => match key {
                "super_pod_id" => s(&p.super_pod_id),
                "server_list" => Some(Typed::PodServers(&p.server_list)),
                _ => extra(&p.extra, key),
            },
            Typed::PodServer(p) => match key {
                "server_id" => s(&p.server_id),
                _ => None,
            },
            Typed::Legacy(t) => match key {
                "group_count" => s(&t.group_count),
                "group_list" => Some(Typed::Groups(&t.group_list)),
                "status" => s(&t.status),
                _ => extra(&t.extra, key),
            },
            Typed::Group(g) => match key {
                "group_name" => opt(&g.group_name),
                "device_count" => s(&g.device_count),
                "instance_count" => s(&g.instance_count),
                "instance_list" => Some(Typed::Instances(&g.instance_list)),
                _ => extra(&g.extra, key),
            },
            Typed::Instance(i) => match key {
                "devices" => Some(Typed::LegacyDevices(&i.devices)),
                "pod_name" => s(&i.pod_name),
                "server_id" => s(&i.server_id),
                _ => extra(&i.extra, key),
            },
            Typed::LegacyDevice(d) => match key {
                "device_id" => s(&d.device_id),
                "device_ip" => opt(&d.device_ip),
                _ => extra(&d.extra, key),
            },
            _ => None,
        }
    }

    fn len(self) -> Option<usize> {
        match self {
            Typed::Json(v) => v.as_array().map(Vec::len),
            Typed::Servers(l) => Some(l.len()),
            Typed::Devices(l) => Some(l.len()),
            Typed::Pods(l) => Some(l.len()),
            Typed::PodServers(l) => Some(l.len()),
            Typed::Groups(l) => Some(l.len()),
            Typed::Instances(l) => Some(l.len()),
            Typed::LegacyDevices(l) => Some(l.len()),
            _ => None,
        }
    }

    fn at(self, i: usize) -> Option<Self> {
        match self {
            Typed::Json(v) => v.as_array()?.get(i).map(Typed::Json),
            Typed::Servers(l) => l.get(i).map(Typed::Server),
            Typed::Devices(l) => l.get(i).map(Typed::Device),
            Typed::Pods(l) => l.get(i).map(Typed::Pod),
            Typed::PodServers(l) => l.get(i).map(Typed::PodServer),
            Typed::Groups(l) => l.get(i).map(Typed::Group),
            Typed::Instances(l) => l.get(i).map(Typed::Instance),
            Typed::LegacyDevices(l) => l.get(i).map(Typed::LegacyDevice),
            _ => None,
        }
    }

    fn others(self) -> Option<&'a Map<String, Value>> {
        match self {
            Typed::Json(v) => v.as_object(),
            Typed::Cluster(t) => Some(&t.extra),
            Typed::Server(e) => Some(&e.extra),
            Typed::Device(d) => Some(&d.extra),
            Typed::Legacy(t) => Some(&t.extra),
            Typed::Pod(p) => Some(&p.extra),
            Typed::Group(g) => Some(&g.extra),
            Typed::Instance(i) => Some(&i.extra),
            Typed::LegacyDevice(d) => Some(&d.extra),
            _ => None,
        }
    }

    fn describe(self) -> (&'static str, String) {
        match self {
            Typed::Json(v) => v.describe(),
            Typed::Str(s) => ("string", format!("{s:?}")),
            n if n.len().is_some() => ("array", "[...]".into()),
            _ => ("object", "{...}".into()),
        }
    }
}
