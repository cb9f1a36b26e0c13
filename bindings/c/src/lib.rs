//! The C ABI of atlasboost: library mode (SPEC §10) for C and C++ programs.
//!
//! A worker started by `atlasboost run`, `mpirun`, torchrun, Slurm or by hand calls
//! `atlasboost_init()` once; it finds the process's place in the job, makes sure the rank table
//! is written on its host and sets the job's variables (`RANK_TABLE_FILE`, `RANK_ID`,
//! `DEVICE_ID`, ...) in the process environment. The queries then say where the process stands.
//! This crate is a thin layer over `atlasboost_lib::init::session`: every decision is made
//! there, in Rust; here a C string becomes a framework, a Rust error becomes an error code and a
//! message, and no panic leaves.
//!
//! The header is `bindings/c/include/atlasboost.h`, generated from this file by cbindgen
//! (`bindings/c/cbindgen.toml`); `ATLASBOOST_UPDATE_HEADER=1 cargo test -p atlasboost-c --test
//! header` rewrites it after a change here. The library is `libatlasboost.so` (and
//! `libatlasboost.a`) in cargo's target directory.
//!
//! # Example
//!
//! ```c
//! #include <stdio.h>
//! #include "atlasboost.h"
//!
//! int main(void) {
//!     /* Before any thread of your own: init sets environment variables. */
//!     if (atlasboost_init(NULL) != ATLASBOOST_OK) {
//!         fprintf(stderr, "atlasboost_init: %s\n", atlasboost_last_error());
//!         return 1;
//!     }
//!     printf("rank %d of %d on device %d, table %s\n", atlasboost_rank(), atlasboost_size(),
//!            atlasboost_device_id(), atlasboost_rank_table_file());
//!     /* ... aclrtSetDevice(atlasboost_device_id()), HCCL, training ... */
//!     atlasboost_finalize();
//!     return 0;
//! }
//! ```
//!
//! ```sh
//! cargo build -p atlasboost-c
//! cc worker.c -I bindings/c/include -L target/debug -latlasboost -Wl,-rpath,"$PWD/target/debug"
//! atlasboost run --sim 8 -n 4 -- ./a.out
//! ```
//!
//! Linked statically instead, the archive needs the C++ runtime (for ZeroMQ) and a few system
//! libraries: `cc worker.c -I bindings/c/include target/debug/libatlasboost.a -lstdc++ -lgcc_s
//! -lutil -lrt -lpthread -lm -ldl -lc`.
//!
//! # Errors
//!
//! Every call returns `ATLASBOOST_OK` (0), a value (>= 0), or one of the negative
//! `ATLASBOOST_ERR_*` codes, one per kind of `InitError` plus `ATLASBOOST_ERR_INVALID_ARGUMENT`
//! (an argument C can express but atlasboost refuses) and `ATLASBOOST_ERR_INTERNAL` (a bug); the
//! calls that return a string return NULL instead. `atlasboost_last_error()` gives the message.
//!
//! # Panics
//!
//! None reach C: every exported function runs its body under [`std::panic::catch_unwind`] and
//! turns a panic into `ATLASBOOST_ERR_INTERNAL` with the panic's message. `init` runs a
//! rendezvous, a probe, JSON and ZeroMQ code, which cannot be shown panic-free, and a panic
//! unwinding into an `extern "C"` function would abort the caller's process. (Built with
//! `panic = "abort"` a panic aborts all the same: there is nothing to unwind.)
//!
//! # What it does not do
//!
//! - No handle and no second job: one job per process, as in Python; a second
//!   `atlasboost_init()` returns the first one's result.
//! - It does not select the device in CANN: `atlasboost_set_device_id()` only checks that the
//!   device is this rank's; call `aclrtSetDevice()` yourself.
//! - No collective operations (that is HCCL's job) and no launcher: start the program with
//!   `atlasboost run` or any launcher SPEC §10 names.
//! - No rendezvous over MPI unless built with the `mpi` feature (then under `mpirun` it meets
//!   over MPI; without it, over ZeroMQ when `MASTER_ADDR` is set).
//! - No protection of the environment against your threads: see `atlasboost_init()`'s safety
//!   contract.
#![deny(missing_docs)]

use std::any::Any;
use std::cell::Cell;
use std::ffi::{CStr, CString, c_char, c_int};
use std::os::unix::ffi::OsStrExt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr;
use std::sync::{Mutex, MutexGuard};

use atlasboost_core::worker_env::Framework;
use atlasboost_lib::init::{InitError, InitOptions, Job, session};

// The codes are written `0 - n` so that cbindgen writes `#define ATLASBOOST_ERR_... (0 - n)`:
// a bare `-n` in a macro would turn `x-ATLASBOOST_ERR_CONFIG` into `x--4`.

/// Success.
pub const ATLASBOOST_OK: c_int = 0;
/// A call that needs `atlasboost_init()` came before it (or after `atlasboost_finalize()`).
pub const ATLASBOOST_ERR_NOT_INITIALIZED: c_int = 0 - 1;
/// An argument atlasboost refuses: an unknown framework name, a string that is not UTF-8, a
/// negative device id.
pub const ATLASBOOST_ERR_INVALID_ARGUMENT: c_int = 0 - 2;
/// A launcher's variables are partly set, malformed or not enough to meet (e.g. `RANK` without
/// `MASTER_ADDR`).
pub const ATLASBOOST_ERR_LAUNCH_CONTEXT: c_int = 0 - 3;
/// An `ATLASBOOST_*` setting is malformed (e.g. `ATLASBOOST_FRAMEWORK=caffe`).
pub const ATLASBOOST_ERR_CONFIG: c_int = 0 - 4;
/// A device problem: the probe failed, a device reports itself unusable (unhealthy,
/// unreadable), too few devices for the local rank, two processes claim one device, or
/// `atlasboost_set_device_id()` was given another rank's device.
pub const ATLASBOOST_ERR_DEVICE: c_int = 0 - 5;
/// The rendezvous failed (not for lack of time).
pub const ATLASBOOST_ERR_RENDEZVOUS: c_int = 0 - 6;
/// The rendezvous ran out of time: a process never arrived (the message names who).
pub const ATLASBOOST_ERR_RENDEZVOUS_TIMEOUT: c_int = 0 - 7;
/// The rank table cannot be built, validated, read or written.
pub const ATLASBOOST_ERR_RANK_TABLE: c_int = 0 - 8;
/// A bug in atlasboost: a panic caught at the boundary, or an error this build cannot classify.
pub const ATLASBOOST_ERR_INTERNAL: c_int = 0 - 9;

thread_local! {
    /// The calling thread's last error message: a `Cell`, so that reading and replacing it can
    /// never fail on a borrow (the error path must not panic).
    static LAST_ERROR: Cell<Option<CString>> = const { Cell::new(None) };
}

/// The string `atlasboost_rank_table_file()` hands out, kept until `atlasboost_finalize()`.
static TABLE_FILE: Mutex<Option<CString>> = Mutex::new(None);

/// Why a call failed: its code and its message.
#[derive(Debug)]
struct Failure {
    code: c_int,
    message: String,
}

impl Failure {
    fn invalid(message: impl Into<String>) -> Failure {
        Failure {
            code: ATLASBOOST_ERR_INVALID_ARGUMENT,
            message: message.into(),
        }
    }

    fn internal(message: impl Into<String>) -> Failure {
        Failure {
            code: ATLASBOOST_ERR_INTERNAL,
            message: message.into(),
        }
    }

    fn panic(payload: &(dyn Any + Send)) -> Failure {
        let what = payload
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
            .unwrap_or("(no message)");
        Failure::internal(format!("internal error: atlasboost panicked: {what}"))
    }
}

impl From<InitError> for Failure {
    fn from(e: InitError) -> Failure {
        Failure {
            code: error_code(&e),
            message: e.to_string(),
        }
    }
}

/// The code of each kind of [`InitError`].
fn error_code(e: &InitError) -> c_int {
    match e {
        InitError::LaunchContext(_) => ATLASBOOST_ERR_LAUNCH_CONTEXT,
        InitError::BadVariable { .. }
        | InitError::Config(_)
        | InitError::NoServerId { .. }
        | InitError::File { .. } => ATLASBOOST_ERR_CONFIG,
        InitError::NoDevice { .. } | InitError::SameDevice { .. } | InitError::Device(_) => {
            ATLASBOOST_ERR_DEVICE
        }
        InitError::Rendezvous {
            timed_out: true, ..
        } => ATLASBOOST_ERR_RENDEZVOUS_TIMEOUT,
        InitError::Rendezvous { .. } => ATLASBOOST_ERR_RENDEZVOUS,
        InitError::TableNotWritten { .. } | InitError::RankTable(_) => ATLASBOOST_ERR_RANK_TABLE,
        InitError::NotInitialized => ATLASBOOST_ERR_NOT_INITIALIZED,
    }
}

fn set_last_error(message: String) {
    // A message with a NUL byte would be cut short in C: show the NUL instead.
    let message = CString::new(message.replace('\0', "\\0")).unwrap_or_default();
    // `try_with` fails only while the thread is being torn down: the message is lost then.
    let _ = LAST_ERROR.try_with(|slot| slot.replace(Some(message)));
}

fn clear_last_error() {
    let _ = LAST_ERROR.try_with(|slot| slot.take());
}

/// Runs an exported function's body: clears the thread's last error, catches panics, and on
/// failure records the message and returns `on_error(code)`.
fn call<T>(on_error: impl FnOnce(c_int) -> T, body: impl FnOnce() -> Result<T, Failure>) -> T {
    clear_last_error();
    // AssertUnwindSafe: after a panic the only state left behind is the session's mutex (whose
    // Option stays consistent and whose poison the session ignores), TABLE_FILE (likewise) and
    // the thread's last error, which is set below.
    let failure = match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(value)) => return value,
        Ok(Err(failure)) => failure,
        Err(payload) => {
            let failure = Failure::panic(payload.as_ref());
            // Dropping a payload can panic in turn (a payload whose Drop panics): forget it.
            std::mem::forget(payload);
            failure
        }
    };
    set_last_error(failure.message);
    on_error(failure.code)
}

/// [`call`] for the functions that return a code or a value >= 0.
fn call_int(body: impl FnOnce() -> Result<c_int, Failure>) -> c_int {
    call(|code| code, body)
}

/// One number from the job, as a C `int`.
fn query(f: impl FnOnce(&Job) -> u32) -> c_int {
    call_int(|| {
        let value = session::with(f)?;
        c_int::try_from(value)
            .map_err(|_| Failure::internal(format!("{value} does not fit in a C int")))
    })
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The guarded values are replaced whole, so a panic cannot leave one half-changed.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Initialises this process's place in the job (once) and sets the job's variables in the
/// process environment.
///
/// `frame` is the framework: "tensorflow", "mindspore" or "pytorch" (any case); NULL takes
/// `ATLASBOOST_FRAMEWORK`, else tensorflow. It decides a few variables (e.g.
/// `MINDSPORE_HCCL_CONFIG_PATH`).
///
/// How the process was started decides what happens: under `atlasboost run` it
/// reads the launcher's variables and its rank table (no network); under another launcher it
/// meets the other processes (ZeroMQ at `MASTER_ADDR`, or MPI) and the first process of each
/// host writes the table; alone it is a world of one, with a note on stderr. Then it sets
/// `RANK_TABLE_FILE`, `RANK_ID`, `RANK_SIZE`, `DEVICE_ID`, `RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
/// ... in the environment (some only where unset), as `atlasboost run` sets them for a worker.
/// Variables of another way of starting a job that HCCL refuses beside a rank table (its
/// `CM_*`, MindSpore's `MS_ROLE`, ...) are removed, with a warning on stderr (not under
/// `atlasboost run`, which passes them only where `-x` asks). A signal that interrupts its wait
/// for the other processes (a handler that returns) ends the wait: it returns
/// ATLASBOOST_ERR_RENDEZVOUS ("Interrupted system call"), and a later call may try again.
///
/// A second call after a success returns ATLASBOOST_OK at once (a bad `frame` is still
/// refused): no second rendezvous, the first call's framework stays, and the environment is not
/// set again. After a failure the next call tries again.
///
/// Returns ATLASBOOST_OK, or ATLASBOOST_ERR_INVALID_ARGUMENT (unknown framework, `frame` not
/// UTF-8), ATLASBOOST_ERR_LAUNCH_CONTEXT, ATLASBOOST_ERR_CONFIG, ATLASBOOST_ERR_DEVICE,
/// ATLASBOOST_ERR_RENDEZVOUS, ATLASBOOST_ERR_RENDEZVOUS_TIMEOUT, ATLASBOOST_ERR_RANK_TABLE or
/// ATLASBOOST_ERR_INTERNAL, with the message in `atlasboost_last_error()`. One wait cannot
/// return: with the `mpi` feature under `mpirun`, an `MPI_Init` that this call starts and that
/// still waits for another rank `ATLASBOOST_RENDEZVOUS_TIMEOUT` seconds (at least 10) later ends
/// the process with status 125, naming the wait on stderr (MPI cannot give the call up).
///
/// # Safety
///
/// - `frame` is NULL or points to a NUL-terminated string that stays valid and unchanged until
///   the call returns.
/// - No other thread may read or write the process environment while it runs (`getenv`,
///   `setenv`, `putenv`, anything that calls them, in any language): it calls `setenv`. Call it
///   at the start of `main`, before starting threads of your own; the threads atlasboost starts
///   for a rendezvous have stopped by the time it returns.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn atlasboost_init(frame: *const c_char) -> c_int {
    call_int(|| {
        let framework = if frame.is_null() {
            None
        } else {
            // SAFETY: `frame` is not NULL, and the caller guarantees it points to a
            // NUL-terminated string that outlives the call and does not change meanwhile.
            let name = unsafe { CStr::from_ptr(frame) };
            let name = name.to_str().map_err(|_| {
                Failure::invalid(format!(
                    "frame \"{}\" is not UTF-8: expected tensorflow, mindspore or pytorch",
                    name.to_bytes().escape_ascii()
                ))
            })?;
            Some(
                name.parse::<Framework>()
                    .map_err(|e| Failure::invalid(e.to_string()))?,
            )
        };
        // Only the call that creates the job sets the environment (a second call changes
        // nothing). Two threads racing here may both set it, with the same values.
        let already = session::with(|_| ()).is_ok();
        if !already {
            // A start after atlasboost_finalize(): the launcher's RANK, MASTER_ADDR, ... back,
            // not the first job's.
            // SAFETY: this function's contract is `Job::restore_launchers_env`'s.
            unsafe { Job::restore_launchers_env() };
        }
        session::start(&InitOptions { framework })?;
        if !already {
            session::with(|job| {
                // SAFETY: this function's contract is `Job::export_env`'s: the caller
                // guarantees that no other thread reads or writes the environment during the
                // call, and `session::start` has stopped the threads it started.
                unsafe { job.export_env() }
            })?;
        }
        Ok(ATLASBOOST_OK)
    })
}

/// This process's rank: its `rank_id` in the rank table (which may differ from the rank its
/// launcher gave it). Returns the rank (>= 0) or ATLASBOOST_ERR_NOT_INITIALIZED.
#[unsafe(no_mangle)]
pub extern "C" fn atlasboost_rank() -> c_int {
    query(|job| job.world.rank)
}

/// The rank the launcher gave this process (mpirun's, torchrun's `RANK`, Slurm's), which
/// `atlasboost_rank()` may differ from (SPEC §10: `mpi_rank()`). Returns it (>= 0) or
/// ATLASBOOST_ERR_NOT_INITIALIZED.
#[unsafe(no_mangle)]
pub extern "C" fn atlasboost_launcher_rank() -> c_int {
    query(|job| job.launcher_rank)
}

/// The number of processes in the job (the table's number of devices). Returns the size (>= 1)
/// or ATLASBOOST_ERR_NOT_INITIALIZED.
#[unsafe(no_mangle)]
pub extern "C" fn atlasboost_size() -> c_int {
    query(|job| job.world.size)
}

/// This process's rank among the processes of its host. Returns it (>= 0) or
/// ATLASBOOST_ERR_NOT_INITIALIZED.
#[unsafe(no_mangle)]
pub extern "C" fn atlasboost_local_rank() -> c_int {
    query(|job| job.world.local_rank)
}

/// The number of processes on this process's host. Returns it (>= 1) or
/// ATLASBOOST_ERR_NOT_INITIALIZED.
#[unsafe(no_mangle)]
pub extern "C" fn atlasboost_local_size() -> c_int {
    query(|job| job.world.local_size)
}

/// This process's device, as its runtime numbers it (the logical id, `DEVICE_ID`; the table
/// holds the physical id). Returns it (>= 0) or ATLASBOOST_ERR_NOT_INITIALIZED.
#[unsafe(no_mangle)]
pub extern "C" fn atlasboost_device_id() -> c_int {
    query(|job| job.device_id)
}

/// The rank table's absolute path (`RANK_TABLE_FILE`), or NULL on error
/// (ATLASBOOST_ERR_NOT_INITIALIZED in `atlasboost_last_error()`).
///
/// The string belongs to atlasboost: do not free or change it. It stays valid, and every call
/// returns the same pointer, until `atlasboost_finalize()`; copy it to keep it longer.
#[unsafe(no_mangle)]
pub extern "C" fn atlasboost_rank_table_file() -> *const c_char {
    call(
        |_| ptr::null(),
        || {
            let path = session::with(|job| job.table_path.as_os_str().as_bytes().to_vec())?;
            let mut kept = lock(&TABLE_FILE);
            // Replaced only when the job changed without atlasboost_finalize() (which clears
            // it): after a finalize and an init that the Rust API did.
            if kept
                .as_ref()
                .is_none_or(|s| s.as_bytes() != path.as_slice())
            {
                let path = CString::new(path).map_err(|_| {
                    Failure::internal("the rank table's path has a NUL byte".to_string())
                })?;
                *kept = Some(path);
            }
            Ok(kept.as_ref().map_or(ptr::null(), |s| s.as_ptr()))
        },
    )
}

/// Checks that `id` (a logical id, as `DEVICE_ID`) is this rank's device in the rank table.
///
/// It selects nothing: call `aclrtSetDevice()` yourself. Returns ATLASBOOST_OK,
/// ATLASBOOST_ERR_INVALID_ARGUMENT (a negative id), ATLASBOOST_ERR_NOT_INITIALIZED, or
/// ATLASBOOST_ERR_DEVICE when the device is not this rank's (the message names both devices,
/// the rank and the table).
#[unsafe(no_mangle)]
pub extern "C" fn atlasboost_set_device_id(id: c_int) -> c_int {
    call_int(|| {
        let id = u32::try_from(id)
            .map_err(|_| Failure::invalid(format!("device id {id}: a device id is >= 0")))?;
        session::with(|job| job.check_device(id))??;
        Ok(ATLASBOOST_OK)
    })
}

/// Ends the job: MPI is finalised if atlasboost initialised it, and the string of
/// `atlasboost_rank_table_file()` is freed. Queries then return ATLASBOOST_ERR_NOT_INITIALIZED
/// until the next `atlasboost_init()`. The environment keeps the job's variables; the next
/// `atlasboost_init()` first puts back the launcher's values that the first one replaced (where
/// nobody changed them since), so that it finds this process's place as the first did.
///
/// Under `mpirun`, call it before the program exits: a process that initialised MPI and exits
/// without finalising it makes `mpirun` fail the job ("exiting improperly"). `atexit` is a good
/// place for it. In a child forked after `atlasboost_init()` (where that handler runs too) it
/// ends nothing: the job, its table lock and MPI stay the parent's.
///
/// Returns ATLASBOOST_OK, also when there was nothing to end (so it may be called twice, e.g.
/// from an `atexit` handler), or ATLASBOOST_ERR_INTERNAL.
#[unsafe(no_mangle)]
pub extern "C" fn atlasboost_finalize() -> c_int {
    call_int(|| {
        // Held across the shutdown, so that a concurrent atlasboost_rank_table_file() cannot
        // keep a string of the ended job.
        let mut kept = lock(&TABLE_FILE);
        session::shutdown();
        *kept = None;
        Ok(ATLASBOOST_OK)
    })
}

/// Tells the launcher this worker is making progress, for `atlasboost run --hang-timeout`'s
/// watchdog; cheap enough to call every training step (two stores into the heartbeat file's
/// record, mapped into memory; no system call). Needs no `atlasboost_init()`.
///
/// Returns 1 when a launcher listens (`ATLASBOOST_HEARTBEAT_FILE` names a file this process can
/// open), 0 when nobody does (a file that cannot be opened is said once on stderr).
///
/// The file is the launcher's (in its own directory, mode 0700): a process that truncates it
/// while the worker runs makes the next call fault with SIGBUS, as any store into a shared
/// mapping past the end of its file does.
#[unsafe(no_mangle)]
pub extern "C" fn atlasboost_heartbeat() -> c_int {
    call_int(|| Ok(c_int::from(atlasboost_lib::progress::heartbeat(None))))
}

/// `atlasboost_heartbeat()`, also giving the training step the launcher shows for this rank.
#[unsafe(no_mangle)]
pub extern "C" fn atlasboost_heartbeat_step(step: std::ffi::c_longlong) -> c_int {
    call_int(|| Ok(c_int::from(atlasboost_lib::progress::heartbeat(Some(step)))))
}

/// The message of the calling thread's last error: of its last atlasboost call, if that call
/// failed; NULL if it succeeded or there was none. (This function and
/// `atlasboost_error_name()` do not count as calls: they change nothing.)
///
/// The string belongs to atlasboost: do not free or change it. It stays valid until the
/// thread's next atlasboost call.
#[unsafe(no_mangle)]
pub extern "C" fn atlasboost_last_error() -> *const c_char {
    LAST_ERROR
        .try_with(|slot| {
            let message = slot.take();
            let p = message.as_ref().map_or(ptr::null(), |m| m.as_ptr());
            // Put back: the CString's buffer does not move, so `p` stays valid.
            slot.set(message);
            p
        })
        .unwrap_or(ptr::null())
}

/// The name of an error code ("ATLASBOOST_ERR_DEVICE", ...), for messages: "ATLASBOOST_OK" for
/// 0, "ATLASBOOST_UNKNOWN" for a code atlasboost does not have. A static string, never NULL.
/// Leaves `atlasboost_last_error()` as it was.
#[unsafe(no_mangle)]
pub extern "C" fn atlasboost_error_name(code: c_int) -> *const c_char {
    let name: &'static CStr = match code {
        ATLASBOOST_OK => c"ATLASBOOST_OK",
        ATLASBOOST_ERR_NOT_INITIALIZED => c"ATLASBOOST_ERR_NOT_INITIALIZED",
        ATLASBOOST_ERR_INVALID_ARGUMENT => c"ATLASBOOST_ERR_INVALID_ARGUMENT",
        ATLASBOOST_ERR_LAUNCH_CONTEXT => c"ATLASBOOST_ERR_LAUNCH_CONTEXT",
        ATLASBOOST_ERR_CONFIG => c"ATLASBOOST_ERR_CONFIG",
        ATLASBOOST_ERR_DEVICE => c"ATLASBOOST_ERR_DEVICE",
        ATLASBOOST_ERR_RENDEZVOUS => c"ATLASBOOST_ERR_RENDEZVOUS",
        ATLASBOOST_ERR_RENDEZVOUS_TIMEOUT => c"ATLASBOOST_ERR_RENDEZVOUS_TIMEOUT",
        ATLASBOOST_ERR_RANK_TABLE => c"ATLASBOOST_ERR_RANK_TABLE",
        ATLASBOOST_ERR_INTERNAL => c"ATLASBOOST_ERR_INTERNAL",
        _ => c"ATLASBOOST_UNKNOWN",
    };
    name.as_ptr()
}

/// What this build of the library has, e.g. "atlasboost 0.1.0 (MPI support: yes)": whether
/// `atlasboost_init()` meets over MPI under `mpirun` (the `mpi` feature; without it, plain
/// `mpirun` still works on one host). A static string, never NULL. Leaves
/// `atlasboost_last_error()` as it was.
#[unsafe(no_mangle)]
pub extern "C" fn atlasboost_build_info() -> *const c_char {
    static INFO: std::sync::OnceLock<CString> = std::sync::OnceLock::new();
    INFO.get_or_init(|| {
        // VERSION has no NUL in it; were it to, the message would still be a C string.
        CString::new(format!(
            "atlasboost {}",
            atlasboost_lib::build_info::VERSION
        ))
        .unwrap_or_default()
    })
    .as_ptr()
}

#[cfg(test)]
mod tests {
    //! What can be tested without a job: the session is process-wide and these tests run in
    //! parallel, so none calls a successful `atlasboost_init`. The C program
    //! (`tests/c_program.rs`) tests a real job.

    use super::*;

    fn last_error() -> Option<String> {
        let p = atlasboost_last_error();
        if p.is_null() {
            return None;
        }
        // SAFETY: non-NULL pointers from atlasboost_last_error() point to a NUL-terminated
        // string that lives until this thread's next atlasboost call, after this line.
        Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    }

    #[test]
    fn every_kind_of_error_has_its_own_code() {
        let errors = [
            InitError::LaunchContext("l".into()),
            InitError::Config("c".into()),
            InitError::Device("d".into()),
            InitError::Rendezvous {
                message: "r".into(),
                timed_out: false,
            },
            InitError::Rendezvous {
                message: "t".into(),
                timed_out: true,
            },
            InitError::RankTable("t".into()),
            InitError::NotInitialized,
        ];
        let mut codes: Vec<c_int> = errors.iter().map(error_code).collect();
        codes.extend([ATLASBOOST_ERR_INVALID_ARGUMENT, ATLASBOOST_ERR_INTERNAL]);
        assert!(codes.iter().all(|c| *c < 0), "{codes:?}");
        let mut unique = codes.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), codes.len(), "{codes:?}");
        for code in codes {
            // SAFETY: atlasboost_error_name returns a static NUL-terminated string.
            let name = unsafe { CStr::from_ptr(atlasboost_error_name(code)) };
            assert!(
                name.to_str()
                    .is_ok_and(|n| n.starts_with("ATLASBOOST_ERR_")),
                "{code}: {name:?}"
            );
        }
    }

    #[test]
    fn a_panic_becomes_an_internal_error_with_its_message() {
        let code = call_int(|| panic!("boom {}", 42));
        assert_eq!(code, ATLASBOOST_ERR_INTERNAL);
        let message = last_error().unwrap_or_default();
        assert!(message.contains("panicked: boom 42"), "{message}");
        let p = call(|_| ptr::null::<c_char>(), || panic!("static"));
        assert!(p.is_null());
        assert!(last_error().unwrap_or_default().contains("static"));
    }

    #[test]
    fn the_last_error_is_per_thread_and_cleared_by_the_next_call() {
        assert_eq!(
            atlasboost_set_device_id(-3),
            ATLASBOOST_ERR_INVALID_ARGUMENT
        );
        let mine = last_error().unwrap_or_default();
        assert!(mine.contains("-3"), "{mine}");
        let other = std::thread::spawn(last_error).join().ok().flatten();
        assert_eq!(other, None);
        assert_eq!(last_error().as_deref(), Some(mine.as_str()));
        assert!(!atlasboost_error_name(0).is_null());
        assert_eq!(last_error().as_deref(), Some(mine.as_str()));
        assert_eq!(atlasboost_finalize(), ATLASBOOST_OK);
        assert_eq!(last_error(), None);
    }

    #[test]
    fn a_message_with_a_nul_byte_is_kept_whole() {
        call_int(|| Err(Failure::invalid("a\0b")));
        assert_eq!(last_error().as_deref(), Some("a\\0b"));
    }

    #[test]
    fn bad_frame_names_are_invalid_arguments() {
        // SAFETY: a NUL-terminated literal; no other thread of this test binary touches the
        // environment, and the frame is refused before anything is set.
        let code = unsafe { atlasboost_init(c"caffe".as_ptr()) };
        assert_eq!(code, ATLASBOOST_ERR_INVALID_ARGUMENT);
        let message = last_error().unwrap_or_default();
        for name in ["caffe", "tensorflow", "mindspore", "pytorch"] {
            assert!(message.contains(name), "{message}");
        }
        let bytes = [0xffu8, 0xfe, 0];
        // SAFETY: as above; `bytes` is NUL-terminated and outlives the call.
        let code = unsafe { atlasboost_init(bytes.as_ptr().cast()) };
        assert_eq!(code, ATLASBOOST_ERR_INVALID_ARGUMENT);
        assert!(last_error().unwrap_or_default().contains("not UTF-8"));
    }
}
