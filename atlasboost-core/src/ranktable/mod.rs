//! HCCL rank tables: the model of the three formats, the builder, the validator, merge, the
//! atomic writer and the lock that keeps a table path to one running job.

mod build;
mod lock;
mod merge;
mod model;
mod node;
mod parse;
mod shrink;
mod validate;
mod write;

pub use build::{
    BuildOptions, RankOrder, build_table, build_table_checked, chip_of_devices, chip_or_reported,
    devices_without_ip, unhealthy_named,
};
pub use lock::{LockOwner, TableLock, TableLockError, lock_path};
pub use merge::{MergeInput, merge_tables};
pub use model::{
    ClusterTable, DeviceEntry, Format, GroupEntry, HOST_NIC_IP_RESERVED, InstanceEntry,
    LEGACY_GROUP_NAME, LegacyDeviceEntry, LegacyTable, RankEntry, RankTable, STATUS_COMPLETED,
    ServerEntry, SuperPodEntry, SuperPodServer,
};
pub use shrink::{HostDevices, largest_world, without_own_address};
pub use validate::{
    MAX_SERVER_ID_LEN, Rule, Severity, Violation, default_chip, duplicate_keys, errors_fail,
    validate_table, validate_value,
};
pub use write::{
    TABLE_SIZE_LIMIT, hccl_name_problem, read_json, read_json_bytes, read_json_from, read_table,
    write_atomically, write_table,
};

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;
