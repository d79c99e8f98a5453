//! The MPI symbol table of the CPU backend: the one place that touches `mpi::ffi` (rsmpi's
//! bindings of the system's `mpi.h`). Handles are wrapped so they can cross to stream workers:
//! MPI handles are plain values, valid on any thread once MPI is initialised with
//! `MPI_THREAD_MULTIPLE`, which the engine requires.

pub use mpi::ffi::{
    MPI_Allgather, MPI_Allreduce, MPI_Alltoall, MPI_Bcast, MPI_Cancel, MPI_Comm, MPI_Comm_dup,
    MPI_Comm_free, MPI_Comm_rank, MPI_Comm_set_errhandler, MPI_Comm_size, MPI_Comm_split,
    MPI_Datatype, MPI_Error_class, MPI_Error_string, MPI_Finalize, MPI_Finalized, MPI_Get_count,
    MPI_Get_library_version, MPI_Init_thread, MPI_Initialized, MPI_Iprobe, MPI_Irecv, MPI_Isend,
    MPI_Op, MPI_Reduce, MPI_Reduce_scatter_block, MPI_Request, MPI_Request_free, MPI_Status,
    MPI_Test, MPI_ERR_TRUNCATE, RSMPI_ANY_SOURCE, RSMPI_COMM_WORLD, RSMPI_DOUBLE,
    RSMPI_ERRORS_RETURN, RSMPI_FLOAT, RSMPI_INT16_T, RSMPI_INT32_T, RSMPI_INT64_T, RSMPI_INT8_T,
    RSMPI_MAX, RSMPI_MAX_LIBRARY_VERSION_STRING, RSMPI_MIN, RSMPI_PROD, RSMPI_SUM,
    RSMPI_THREAD_MULTIPLE, RSMPI_UINT32_T, RSMPI_UINT64_T, RSMPI_UINT8_T, RSMPI_UNDEFINED,
};

/// A communicator handle that may cross threads.
#[derive(Clone, Copy)]
pub struct Comm(pub MPI_Comm);

// SAFETY: an MPI_Comm is an opaque handle; under MPI_THREAD_MULTIPLE (checked at initialisation)
// any thread may pass it to MPI calls.
unsafe impl Send for Comm {}
// SAFETY: as above; the handle is never mutated through a shared reference.
unsafe impl Sync for Comm {}

pub use mpi::ffi::MPI_Query_thread;

extern "C" {
    /// The C library's `atexit`, to finalise MPI when the process exits.
    pub fn atexit(f: extern "C" fn()) -> std::os::raw::c_int;
}
