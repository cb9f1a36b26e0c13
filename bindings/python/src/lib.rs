//! `atlasboost._atlasboost`, the native module of the `atlasboost` Python package.
//!
//! The package (`bindings/python/python/atlasboost`) is written in Python around this module:
//! this crate only turns Python calls into calls of the [`atlasboost`] library and its errors
//! into Python exceptions. Library mode is `atlasboost::init::session` (one process-wide job).
//! The console script is not here: the package ships the `atlasboost` command itself
//! (`atlasboost/_bin/atlasboost`), so this module links no command line and no launcher.
//!
//! ```python
//! import atlasboost.tensorflow.mpi_ops as atlasboost
//! atlasboost.init(frame="tensorflow")
//! atlasboost.set_device_id(atlasboost.local_rank())
//! ```
//!
//! What it does not do: set the environment (the Python package writes `init()`'s variables
//! to `os.environ`, which keeps Python's view and the C environment in step), or talk to
//! MindSpore and torch_npu (the package does, and only when they are installed).
//!
//! `init()` holds the GIL while it reads the environment (Python's `os.environ` writes call
//! `putenv`, which a read without the GIL would race: a crash) and releases it where it waits
//! for its peers over ZeroMQ, where it reads nothing ([`atlasboost_tcp::set_wait_hooks`]). A
//! signal that interrupts that wait runs Python's handlers: one that raises (Ctrl-C's
//! `KeyboardInterrupt`) ends `init()` with its exception, one that returns lets the wait go on
//! (PEP 475). MPI's finalisation and the queries release the GIL.
#![deny(missing_docs)]

use std::ffi::OsString;

use atlasboost::init::{InitError, InitOptions, Job, session};
use atlasboost_core::worker_env::Framework;
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyDict, PyTuple, PyType};

create_exception!(
    atlasboost,
    AtlasBoostError,
    PyException,
    "The base of every error atlasboost raises."
);
create_exception!(
    atlasboost,
    LaunchContextError,
    AtlasBoostError,
    "A launcher's variables are partly set, malformed, or not enough to meet (no MASTER_ADDR)."
);
create_exception!(
    atlasboost,
    DeviceError,
    AtlasBoostError,
    "A process has no device (the probe failed, too few devices, two processes claim one), or \
     set_device_id() was given a device that is not this rank's."
);
create_exception!(
    atlasboost,
    RendezvousError,
    AtlasBoostError,
    "The processes of the job could not agree on the rank table."
);
create_exception!(
    atlasboost,
    RendezvousTimeout,
    RendezvousError,
    "The rendezvous ran out of time: a process never arrived (the message names it when known)."
);
create_exception!(
    atlasboost,
    RankTableError,
    AtlasBoostError,
    "The rank table cannot be built, validated, read or written."
);
create_exception!(
    atlasboost,
    NotInitializedError,
    AtlasBoostError,
    "A call that needs init() came before it (or after shutdown())."
);

/// `ConfigError` derives from both [`AtlasBoostError`] and `ValueError` (a bad `frame`, a
/// malformed `ATLASBOOST_*` value), which `create_exception!` cannot express: it is made once,
/// with `type()`, like a Python `class ConfigError(AtlasBoostError, ValueError)`.
static CONFIG_ERROR: PyOnceLock<Py<PyType>> = PyOnceLock::new();

fn config_error(py: Python<'_>) -> PyResult<Bound<'_, PyType>> {
    let ty = CONFIG_ERROR.get_or_try_init(py, || -> PyResult<Py<PyType>> {
        let bases = PyTuple::new(
            py,
            [
                py.get_type::<AtlasBoostError>(),
                py.get_type::<PyValueError>(),
            ],
        )?;
        let namespace = PyDict::new(py);
        namespace.set_item("__module__", "atlasboost")?;
        namespace.set_item(
            "__doc__",
            "A value is malformed: init()'s frame, or an ATLASBOOST_* variable. Also a ValueError.",
        )?;
        let ty = py
            .get_type::<PyType>()
            .call1(("ConfigError", bases, namespace))?;
        Ok(ty.cast_into::<PyType>()?.unbind())
    })?;
    Ok(ty.bind(py).clone())
}

/// An error of library mode on its way to Python.
#[derive(Debug)]
struct Error(InitError);

impl From<InitError> for Error {
    fn from(e: InitError) -> Self {
        Error(e)
    }
}

impl From<Error> for PyErr {
    /// The one place where Rust errors become Python exceptions.
    fn from(Error(e): Error) -> PyErr {
        let message = e.to_string();
        match e {
            InitError::LaunchContext(_) => LaunchContextError::new_err(message),
            InitError::BadVariable { .. }
            | InitError::Config(_)
            | InitError::NoServerId { .. }
            | InitError::File { .. } => Python::attach(|py| match config_error(py) {
                Ok(ty) => PyErr::from_type(ty, message),
                Err(e) => e,
            }),
            InitError::NoDevice { .. } | InitError::SameDevice { .. } | InitError::Device(_) => {
                DeviceError::new_err(message)
            }
            InitError::Rendezvous {
                timed_out: true, ..
            } => RendezvousTimeout::new_err(message),
            InitError::Rendezvous {
                timed_out: false, ..
            } => RendezvousError::new_err(message),
            InitError::TableNotWritten { .. } | InitError::RankTable(_) => {
                RankTableError::new_err(message)
            }
            InitError::NotInitialized => NotInitializedError::new_err(message),
        }
    }
}

/// Variables as `(name, value)` pairs.
type Vars = Vec<(&'static str, String)>;

/// Initialises the process's job once (a second call keeps the first job), then returns its
/// variables: `(set, set_if_unset, remove)`.
///
/// `frame` is `tensorflow`, `mindspore` or `pytorch`; `None` reads `ATLASBOOST_FRAMEWORK`
/// (default `tensorflow`).
#[pyfunction]
#[pyo3(signature = (frame=None))]
fn init(py: Python<'_>, frame: Option<&str>) -> PyResult<(Vars, Vars, Vec<&'static str>)> {
    let framework = frame
        .map(str::parse::<Framework>)
        .transpose()
        .map_err(|e| Error(InitError::from(e)))?;
    let opts = InitOptions { framework };
    // A signal handler that runs during the wait (`stop_on_signal`) and calls init() again
    // would wait for this very start: refused. (Another thread's init() waits for it in
    // `_core.py`'s lock, without the GIL.)
    if STARTING_HERE.get() {
        return Err(AtlasBoostError::new_err(
            "init() was called while this thread's init() waits for the other processes (from \
             a signal handler?): it cannot wait for itself",
        ));
    }
    STARTING_HERE.set(true);
    /// Clears [`STARTING_HERE`] however the start ends.
    struct Started;
    impl Drop for Started {
        fn drop(&mut self) {
            STARTING_HERE.set(false);
        }
    }
    let _started = Started;
    // With the GIL (the module docs say why); other Python threads run while it waits for the
    // other processes over ZeroMQ (`release_gil`).
    let result = session::start(&opts).and_then(|()| {
        session::with(|job| {
            (
                job.env.clone(),
                job.env_if_unset.clone(),
                job.env_remove.clone(),
            )
        })
    });
    if result.is_err() {
        // A handler that raised (Ctrl-C's KeyboardInterrupt) ended the wait: its exception,
        // not a rendezvous error about an interrupted system call.
        if let Some(raised) = take_raised() {
            return Err(raised);
        }
        py.check_signals()?;
    }
    Ok(result.map_err(Error)?)
}

thread_local! {
    /// Whether this thread is inside `init()`: its signal handlers run there, during the wait.
    static STARTING_HERE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The exception a signal handler raised while `init()` waited (see [`stop_on_signal`]).
static RAISED: std::sync::Mutex<Option<PyErr>> = std::sync::Mutex::new(None);

fn take_raised() -> Option<PyErr> {
    RAISED.lock().ok().and_then(|mut r| r.take())
}

/// A rendezvous wait, with the GIL released: it polls a socket and touches no Python object.
fn release_gil(wait: &mut dyn FnMut()) {
    /// The wait, to be run by `detach` on this thread before it returns.
    struct OnThisThread<'a>(&'a mut dyn FnMut());
    // SAFETY: `detach` runs its closure on the calling thread and returns after it: the
    // borrowed wait never crosses to another thread.
    unsafe impl Send for OnThisThread<'_> {}
    let wait = OnThisThread(wait);
    Python::attach(|py| {
        py.detach(move || {
            let wait = wait;
            (wait.0)();
        });
    });
}

/// A signal interrupted a rendezvous wait: Python's handlers run; whether one raised, its
/// exception kept for `init()` to raise.
fn stop_on_signal() -> bool {
    Python::attach(|py| match py.check_signals() {
        Ok(()) => false,
        Err(raised) => {
            if let Ok(mut r) = RAISED.lock() {
                *r = Some(raised);
            }
            true
        }
    })
}

/// Runs `f` on the job, without the GIL (the job's lock may be held by an `init` that waits).
fn with_job<T: Send>(py: Python<'_>, f: impl FnOnce(&Job) -> T + Send) -> Result<T, Error> {
    Ok(py.detach(|| session::with(f))?)
}

/// The rank table's `rank_id` of this process.
#[pyfunction]
fn rank(py: Python<'_>) -> Result<u32, Error> {
    with_job(py, |j| j.world.rank)
}

/// The number of processes of the job.
#[pyfunction]
fn size(py: Python<'_>) -> Result<u32, Error> {
    with_job(py, |j| j.world.size)
}

/// This process's rank among those of its host.
#[pyfunction]
fn local_rank(py: Python<'_>) -> Result<u32, Error> {
    with_job(py, |j| j.world.local_rank)
}

/// The number of processes of this host.
#[pyfunction]
fn local_size(py: Python<'_>) -> Result<u32, Error> {
    with_job(py, |j| j.world.local_size)
}

/// This process's rank as its launcher numbered it (may differ from `rank()`).
#[pyfunction]
fn launcher_rank(py: Python<'_>) -> Result<u32, Error> {
    with_job(py, |j| j.launcher_rank)
}

/// The logical id of this process's device (`DEVICE_ID`).
#[pyfunction]
fn device_id(py: Python<'_>) -> Result<u32, Error> {
    with_job(py, |j| j.device_id)
}

/// The rank table's absolute path.
#[pyfunction]
fn rank_table_file(py: Python<'_>) -> Result<OsString, Error> {
    with_job(py, |j| j.table_path.clone().into_os_string())
}

/// Checks that `device_id` (a logical id: an integer, or anything with `__index__`, as numpy's
/// integers) is this rank's device in the table. A bool is refused (`True` is no device 1), a
/// number no device has (negative, or beyond any C integer) is named.
#[pyfunction]
fn check_device(py: Python<'_>, device_id: &Bound<'_, PyAny>) -> PyResult<()> {
    if device_id.is_instance_of::<PyBool>() {
        return Err(PyTypeError::new_err(format!(
            "set_device_id() takes a device id (an int), not a bool ({device_id})"
        )));
    }
    // `operator.index`: a TypeError naming the type for what is no integer.
    let index = py
        .import("operator")?
        .getattr("index")?
        .call1((device_id,))?;
    let id = index.extract::<u32>().ok();
    let shown = index.str()?.to_string();
    let checked = with_job(py, |j| match id {
        Some(id) => j.check_device(id),
        None => Err(InitError::Device(format!(
            "{shown} is not a device id: rank {}'s device is {}",
            j.world.rank, j.device_id
        ))),
    })?;
    Ok(checked.map_err(Error)?)
}

/// Ends the job (MPI is finalised if atlasboost initialised it); nothing before `init`.
///
/// From a signal handler that runs while this thread's `init()` waits, it does nothing: the
/// start is not done, and waiting for it would wait for ever (the handler's exception, a
/// `SystemExit` say, ends that `init()`).
///
/// While another thread's `init()` is under way it waits for it, hearing Ctrl-C meanwhile (a
/// `finally: shutdown()` must not make the process deaf for the rendezvous timeout).
#[pyfunction]
fn shutdown(py: Python<'_>) -> PyResult<()> {
    if STARTING_HERE.get() {
        return Ok(());
    }
    while !py.detach(|| session::shutdown_within(std::time::Duration::from_millis(50))) {
        py.check_signals()?;
    }
    Ok(())
}

/// `abort_mpi(code)`: ends the whole MPI job (`MPI_Abort`) if MPI is initialised in this
/// process; returns otherwise: `False` in a child forked after `init()` (the job is the
/// parent's), `True` for lack of MPI (then the program's own MPI, mpi4py's, may end it). For a
/// process dying of an uncaught exception.
#[pyfunction]
fn abort_mpi(code: i32) -> bool {
    session::abort_mpi(code)
}

/// Whether this build does library mode's rendezvous over MPI under `mpirun`.
#[pyfunction]
fn mpi_built() -> bool {
    atlasboost::build_info::MPI
}

/// What this build has: `(version, MPI support, the MPI library's version line or None)`.
#[pyfunction]
fn build_info() -> (&'static str, bool, Option<String>) {
    (
        env!("CARGO_PKG_VERSION"),
        atlasboost::build_info::MPI,
        atlasboost::build_info::mpi_library(),
    )
}

/// `atlasboost.heartbeat(step=None)`: progress, for `atlasboost run --hang-timeout`.
#[pyfunction]
#[pyo3(signature = (step=None))]
fn heartbeat(step: Option<i64>) -> bool {
    atlasboost::progress::heartbeat(step)
}

/// The module `atlasboost._atlasboost`.
#[pymodule]
fn _atlasboost(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    atlasboost_tcp::set_wait_hooks(atlasboost_tcp::WaitHooks {
        blocking: release_gil,
        interrupted: stop_on_signal,
    });
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("AtlasBoostError", py.get_type::<AtlasBoostError>())?;
    m.add("ConfigError", config_error(py)?)?;
    m.add("LaunchContextError", py.get_type::<LaunchContextError>())?;
    m.add("DeviceError", py.get_type::<DeviceError>())?;
    m.add("RendezvousError", py.get_type::<RendezvousError>())?;
    m.add("RendezvousTimeout", py.get_type::<RendezvousTimeout>())?;
    m.add("RankTableError", py.get_type::<RankTableError>())?;
    m.add("NotInitializedError", py.get_type::<NotInitializedError>())?;
    m.add_function(wrap_pyfunction!(init, m)?)?;
    m.add_function(wrap_pyfunction!(rank, m)?)?;
    m.add_function(wrap_pyfunction!(size, m)?)?;
    m.add_function(wrap_pyfunction!(local_rank, m)?)?;
    m.add_function(wrap_pyfunction!(local_size, m)?)?;
    m.add_function(wrap_pyfunction!(launcher_rank, m)?)?;
    m.add_function(wrap_pyfunction!(device_id, m)?)?;
    m.add_function(wrap_pyfunction!(rank_table_file, m)?)?;
    m.add_function(wrap_pyfunction!(check_device, m)?)?;
    m.add_function(wrap_pyfunction!(shutdown, m)?)?;
    m.add_function(wrap_pyfunction!(abort_mpi, m)?)?;
    m.add_function(wrap_pyfunction!(mpi_built, m)?)?;
    m.add_function(wrap_pyfunction!(build_info, m)?)?;
    m.add_function(wrap_pyfunction!(heartbeat, m)?)?;
    Ok(())
}
